"""The documented plugin example's config names the entry the framework loads (its training
run: tests/integration/test_plugin_example_training.py)."""

from __future__ import annotations

from pathlib import Path

from dsec.zerotouch.plugin import read_config

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plugin_framework"


def test_dsec_run_reads_the_entry_the_framework_loads() -> None:
    config = read_config(EXAMPLE / "framework.yaml")
    assert (config.bootstrap, config.heartbeat_interval_s, config.sandbox_id) == (
        "127.0.0.1:9092", 5.0, "sbx-example")
