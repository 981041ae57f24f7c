"""``libdsec_inject.so`` through ctypes, with every argument and result type declared.

ctypes passes an undeclared Python float as nothing it can use (a ``double`` parameter
needs ``c_double``), so ``load()`` declares the signatures of ``dsec_inject.h`` once.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

LIBRARY_NAME = "libdsec_inject.so"
BUILD_DIR = Path(__file__).resolve().parent / "build"

_ERRORS = {-1: "bad configuration", -2: "already initialised", -3: "out of memory or threads"}


class NativeLibraryError(RuntimeError):
    """The library is not there, or ``dsec_init`` refused; ``code`` is its return code."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class _Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "samples_recorded", "samples_sent", "samples_buffered", "samples_dropped",
        "messages_failed")]


@dataclass(frozen=True)
class NativeCounters:
    samples_recorded: int
    samples_sent: int
    samples_buffered: int
    samples_dropped: int
    messages_failed: int


def library_path() -> Path:
    """``DSEC_NATIVE_LIBRARY`` when set, else the library ``make setup`` built."""
    given = os.environ.get("DSEC_NATIVE_LIBRARY")
    return Path(given) if given else BUILD_DIR / LIBRARY_NAME


def load(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """The library with its signatures declared (a process has one copy: the second load
    of one path is the same library)."""
    location = Path(path) if path is not None else library_path()
    if not location.exists():
        raise NativeLibraryError(
            f"{location} is not built: run `make setup` (or `make -C ingest/native`)")
    lib = ctypes.CDLL(str(location))
    lib.dsec_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.dsec_init.restype = ctypes.c_int
    lib.dsec_report_episode_end.argtypes = [ctypes.c_double, ctypes.c_int64]
    lib.dsec_report_episode_end.restype = None
    lib.dsec_report_step.argtypes = [ctypes.c_double, ctypes.c_double]
    lib.dsec_report_step.restype = None
    lib.dsec_shutdown.argtypes = []
    lib.dsec_shutdown.restype = None
    lib.dsec_get_counters.argtypes = [ctypes.POINTER(_Counters)]
    lib.dsec_get_counters.restype = None
    lib.dsec_last_error.argtypes = []
    lib.dsec_last_error.restype = ctypes.c_char_p
    return lib


class NativeProbe:
    """The library's calls with Python types: ``init`` raises on a refusal, ``shutdown``
    returns the counts."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load()

    def init(self, endpoint: str | None = None, agent_id: str | None = None) -> None:
        code = self.lib.dsec_init(endpoint.encode() if endpoint else None,
                                  agent_id.encode() if agent_id else None)
        if code != 0:
            reason = self.lib.dsec_last_error().decode(errors="replace")
            raise NativeLibraryError(
                f"dsec_init: {_ERRORS.get(code, code)}: {reason}", code)

    def report_episode_end(self, reward: float, length: int) -> None:
        self.lib.dsec_report_episode_end(reward, length)

    def report_step(self, loss: float, grad_norm: float = -1.0) -> None:
        """A negative ``grad_norm``: none measured."""
        self.lib.dsec_report_step(loss, grad_norm)

    def counters(self) -> NativeCounters:
        raw = _Counters()
        self.lib.dsec_get_counters(ctypes.byref(raw))
        return NativeCounters(*(getattr(raw, name) for name, _ in _Counters._fields_))

    def shutdown(self) -> NativeCounters:
        self.lib.dsec_shutdown()
        return self.counters()
