"""``dsec run``'s configuration: identity from the environment, the plugin entry where a
framework or project keeps it, the child's environment, and the sitecustomize that stays
light and runs the one it hides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsec.zerotouch.config import ZeroTouchConfig
from dsec.zerotouch.identity import RayContext, nvml_indices, process_identity, safe_id
from dsec.zerotouch.launch import BOOTSTRAP_DIR, child_environment
from dsec.zerotouch.plugin import PluginConfigError, entry_of, read_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_worker_is_named_by_worker_id_then_sandbox_ray_or_host_with_the_rank() -> None:
    def worker(env, ray=None):
        return process_identity(env, "gpu-7", 4242, ray).worker_id

    assert worker({"DSEC_WORKER_ID": "w9", "RANK": "3"}) == "w9"
    assert worker({"DSEC_SANDBOX_ID": "sbx-1"}) == "sbx-1"
    assert worker({"DSEC_SANDBOX_ID": "sbx-1", "RANK": "3"}) == "sbx-1-rank3"
    assert worker({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == "gpu-7-rank3"
    assert worker({}, RayContext(actor_id="a1b2", worker_id="ffee")) == "ray-a1b2"
    assert worker({}, RayContext(worker_id="ffee")) == "ray-ffee"
    assert worker({}) == "gpu-7-4242"  # two plain processes on a host differ
    found = process_identity({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
                              "DSEC_NODE_ID": "node a"}, "gpu-7", 1)
    assert (found.rank, found.local_rank, found.world_size, found.node_id) == (3, 1, 8, "node_a")
    assert safe_id("x" * 300) == "x" * 128


def test_each_rank_samples_its_own_gpu_through_cuda_visible_devices() -> None:
    assert nvml_indices({}) is None  # not under torchrun: every GPU
    assert nvml_indices({"LOCAL_RANK": "1"}) == (1,)
    assert nvml_indices({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}) == (6,)
    assert nvml_indices({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-abc"}) is None
    assert nvml_indices({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "4,6"}) is None


def test_the_entry_travels_as_the_variables_the_probe_reads() -> None:
    config = ZeroTouchConfig(endpoint="kafka://k1:9092,k2:9092", heartbeat_interval_s=2.5,
                             sandbox_id="sbx-7", snapshots=False)
    assert config.environment() == {
        "DSEC_BOOTSTRAP": "k1:9092,k2:9092", "DSEC_PROBE_HEARTBEAT_INTERVAL_S": "2.5",
        "DSEC_SANDBOX_ID": "sbx-7", "DSEC_RUN_SNAPSHOTS": "0"}
    assert ZeroTouchConfig(endpoint="broker:9092").bootstrap == "broker:9092"
    http = ZeroTouchConfig(endpoint="http://dsec-control-plane:8080")
    assert http.bootstrap is None and http.http_endpoint == "http://dsec-control-plane:8080"
    with pytest.raises(ValueError, match="endpoint"):
        ZeroTouchConfig(endpoint="ftp://nope")
    with pytest.raises(ValueError):
        ZeroTouchConfig(heartbeat_interval_s=5, sandox_id="typo")  # misspelt: refused
    merged = config.merged(ZeroTouchConfig(sandbox_id="sbx-8"))
    assert merged.sandbox_id == "sbx-8" and merged.heartbeat_interval_s == 2.5
    guarded = ZeroTouchConfig(skip_nonfinite_steps=True).environment()
    assert guarded == {"DSEC_RUN_SKIP_NONFINITE_STEPS": "1"}


def test_the_child_gets_the_bootstrap_first_on_its_path_once() -> None:
    env = child_environment(ZeroTouchConfig(sandbox_id="s"),
                            {"PYTHONPATH": f"/a{os.pathsep}{BOOTSTRAP_DIR}", "HOME": "/h"})
    assert env["PYTHONPATH"] == f"{BOOTSTRAP_DIR}{os.pathsep}/a"
    assert env["HOME"] == "/h" and env["DSEC_SANDBOX_ID"] == "s"
    gateway = child_environment(ZeroTouchConfig(endpoint="http://gw:8080"), {})
    assert gateway["DSEC_ENDPOINT"] == "http://gw:8080" and "DSEC_BOOTSTRAP" not in gateway


def test_the_entry_is_found_in_a_plugin_list_a_dsec_mapping_or_the_whole_file() -> None:
    entry = {"endpoint": "kafka://k:9092", "heartbeat_interval_s": 5, "sandbox_id": "s"}
    plugins = {"plugins": [{"name": "memory", "config": {}},
                           {"name": "dsec", "module": "dsec.zerotouch.plugin", "config": entry}]}
    assert entry_of(plugins, "f") == entry
    assert entry_of({"plugins": [{"name": "memory"}]}, "f") == {}
    assert entry_of({"dsec": entry, "model": "x"}, "f") == entry
    assert entry_of(entry, "f") == entry
    assert entry_of(None, "f") == {}
    with pytest.raises(PluginConfigError):
        entry_of(["not", "a", "mapping"], "f")


def test_read_config_finds_dsec_yaml_then_pyproject(tmp_path) -> None:
    assert read_config(cwd=tmp_path) == ZeroTouchConfig()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.dsec]\nsandbox_id = "from-toml"\n')
    assert read_config(cwd=tmp_path).sandbox_id == "from-toml"
    (tmp_path / "dsec.yaml").write_text("plugins:\n  - name: dsec\n    config:\n"
                                        "      sandbox_id: from-yaml\n")
    assert read_config(cwd=tmp_path).sandbox_id == "from-yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("dsec:\n  heartbeat_interval_s: -1\n")
    with pytest.raises(PluginConfigError, match="heartbeat_interval_s"):
        read_config(bad)


def test_the_sitecustomize_loads_nothing_heavy_and_runs_the_one_it_hides(tmp_path) -> None:
    hidden = tmp_path / "site"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import builtins\nbuiltins.HIDDEN_RAN = True\n")
    code = ("import builtins, sys; heavy = {'torch', 'pydantic', 'numpy', 'confluent_kafka'}; "
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}), "
            "getattr(builtins, 'HIDDEN_RAN', False), 'dsec.zerotouch.session' in sys.modules)")
    path = os.pathsep.join([str(BOOTSTRAP_DIR), str(hidden), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True", "True"], out.stderr
    assert out.stderr == ""
