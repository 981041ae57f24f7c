"""The C probe library ``libdsec_inject.so``: its sources, built into ``build/`` by
``make setup``, and its ctypes loader (``library``), public as ``dsec.native``."""
