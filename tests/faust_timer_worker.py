"""A Faust worker as the stack runs one (``make_faust_app``, ``watch_faust_app``,
``QuietWorker``) with a timer that raises on its sixth call, 3 s in, once the worker has
reported healthy. Twice a second it prints its health as a JSON line; when the worker
returns it prints its health once more, then ``{"exited": true}``, and exits.
Usage: ``python faust_timer_worker.py BOOTSTRAP APP_ID DATA_DIR``."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path

from dsec.infra.faust_app import QuietWorker, make_faust_app, watch_faust_app
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.schemas.settings import DsecSettings

FAILING_CALL = 6


def main(bootstrap: str, app_id: str, data_dir: str) -> None:
    settings = DsecSettings(bootstrap=bootstrap, topic_prefix=app_id, data_dir=Path(data_dir))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = make_faust_app(app_id, settings, partitions=1)
    metrics = ProcessMetrics()
    watch_faust_app(app, metrics, {})
    calls = {"timer": 0}

    @app.timer(interval=0.5)
    async def failing() -> None:
        calls["timer"] += 1
        if calls["timer"] == FAILING_CALL:
            raise RuntimeError("the timer failed")

    def report() -> None:
        healthy, checks = metrics.health()
        print(json.dumps({"healthy": healthy, "checks": checks,
                          "timer_calls": calls["timer"]}), flush=True)

    def keep_reporting() -> None:
        while True:
            report()
            time.sleep(0.5)

    threading.Thread(target=keep_reporting, daemon=True).start()
    worker = QuietWorker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    with contextlib.suppress(SystemExit):
        worker.execute_from_commandline()
    report()  # the health as the worker left it
    print(json.dumps({"exited": True}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
