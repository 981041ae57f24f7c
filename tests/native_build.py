"""Builds the C probe library and its test programs once per session (make, the system
compiler), for the tests that run them."""

from __future__ import annotations

import subprocess
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parents[1] / "ingest" / "native"
BUILD_DIR = NATIVE_DIR / "build"
LIBRARY = BUILD_DIR / "libdsec_inject.so"
TRAIN_PROGRAM = BUILD_DIR / "train_program"


def make(*targets: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``make -C ingest/native TARGETS``; fails the caller with make's output."""
    done = subprocess.run(["make", "--no-print-directory", "-C", str(NATIVE_DIR), *targets],
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def build_library_and_program() -> None:
    make("all", "build/train_program")
