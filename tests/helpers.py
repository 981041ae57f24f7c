"""Small helpers shared by the tests."""

from __future__ import annotations

import pytest


def wait_for(predicate, timeout_s: float, interval_s: float = 0.25, what: str = "condition"):
    """Polls ``predicate`` until it returns something truthy, or fails the test."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def partitions_held(bootstrap: str, group: str) -> list[int]:
    """How many partitions each member of a consumer group holds (members holding none
    left out)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result()
    return sorted(len(m.assignment.topic_partitions) for m in description.members
                  if m.assignment.topic_partitions)


def start_stack(bootstrap: str, data_dir, topic_prefix: str, services: str | None = None,
                log_name: str = "stack.log", env: dict[str, str] | None = None):
    """``dsec up`` on ``bootstrap`` as a subprocess; returns once it wrote its state file.
    ``env``: more environment for it (e.g. ``DSEC_METRICS_PORT``)."""
    import os
    import subprocess
    import sys

    from dsec.services.stack import read_stack_state

    env = {**os.environ, "DSEC_DATA_DIR": str(data_dir), "DSEC_TOPIC_PREFIX": topic_prefix,
           # a SIGKILLed worker's partitions move on after this, not Faust's 60 s
           "DSEC_STREAM_SESSION_TIMEOUT_S": "10", **(env or {})}
    command = [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", bootstrap]
    if services:
        command += ["--services", services]
    data_dir.mkdir(parents=True, exist_ok=True)
    # a killed stack's sink may still be stopping, its state file still there
    stale_pid = (read_stack_state(data_dir) or {}).get("pid")
    log_path = data_dir / log_name
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def started() -> bool:
        state = read_stack_state(data_dir)
        return state is not None and state["pid"] != stale_pid

    wait_for(lambda: process.poll() is not None or started(), 120, what="the stack to start")
    if process.poll() is not None:
        pytest.fail(f"the stack exited: {log_path.read_text()[-3000:]}")
    return process


def stop_stack(process, kill: bool = False) -> None:
    import signal
    import subprocess

    if process.poll() is not None:
        return
    if kill:
        process.kill()
    else:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
