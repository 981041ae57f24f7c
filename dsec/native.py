"""``libdsec_inject.so`` from Python: the article's three lines with the argument types
declared (ctypes needs them for a float)::

    from dsec import native

    probe = native.NativeProbe()
    probe.init("http://dsec-control-plane:8080", "agent-7")
    probe.report_episode_end(12.5, 200)

``native.load()`` gives the ``ctypes.CDLL`` itself, signatures declared.
"""

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
