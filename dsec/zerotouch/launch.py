"""``dsec run``: the program's command line, run with the instrumentation on its path.

The ``bootstrap`` folder (this package's ``sitecustomize``) goes first on ``PYTHONPATH``
and the configuration travels as ``DSEC_*`` variables (``config.py``); then this process
becomes the program (``exec``), so its exit code, signals and output are the program's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsec.zerotouch.config import ZeroTouchConfig

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"


class LaunchError(ValueError):
    pass


def child_environment(config: ZeroTouchConfig, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the bootstrap first on ``PYTHONPATH`` and ``config``'s variables (which
    win over those already set)."""
    python_path = [str(BOOTSTRAP_DIR), *(
        entry for entry in env.get("PYTHONPATH", "").split(os.pathsep)
        if entry and entry != str(BOOTSTRAP_DIR))]
    return {**env, **config.environment(), "PYTHONPATH": os.pathsep.join(python_path)}


def run(command: Sequence[str], config: ZeroTouchConfig) -> None:
    """Becomes ``command`` (never returns), instrumented by ``config``."""
    if not command:
        raise LaunchError("no command given: dsec run [OPTIONS] -- python train.py ...")
    env = child_environment(config, os.environ)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise LaunchError(f"cannot run {command[0]!r}: {exc.strerror}") from None
