"""The documented plugin example runs as docs/integrations.md says: a framework loads dsec
from its config's plugin list and trains, and with no broker at the endpoint it trains all
the same and says what it dropped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from dsec.infra.kafka_local import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plugin_framework"


def test_the_example_framework_trains_with_dsec_loaded_as_its_plugin(tmp_path) -> None:
    settings = yaml.safe_load((EXAMPLE / "framework.yaml").read_text())
    settings["plugins"][0]["config"]["endpoint"] = f"kafka://127.0.0.1:{free_port()}"
    config = tmp_path / "framework.yaml"
    config.write_text(yaml.safe_dump(settings))
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "framework.py"), str(config)], capture_output=True,
        text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "DSEC_DATA_DIR": str(tmp_path / "dsec"),
             "DSEC_ACTUATOR_CHANNEL": "kafka", "DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("final loss ")
    assert "worker sbx-example dropped" in out.stderr  # instrumented, under its sandbox id
