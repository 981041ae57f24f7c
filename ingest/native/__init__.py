"""The C probe library ``libdsec_inject.so`` (sources here, built into ``build/`` by
``make setup``) and its ctypes loader, which declares every function's argument types."""

from dsec.ingest.native.library import (
    LIBRARY_NAME,
    NativeCounters,
    NativeLibraryError,
    NativeProbe,
    library_path,
    load,
)

__all__ = [
    "LIBRARY_NAME",
    "NativeCounters",
    "NativeLibraryError",
    "NativeProbe",
    "library_path",
    "load",
]
