"""Benchmarks (``dsec bench …``): two sides measured side by side in one run, or a path timed
end to end on the real stack; each prints one JSON object with ``--json``."""
