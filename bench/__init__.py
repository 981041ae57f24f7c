"""Benchmarks (``dsec bench …``): two sides measured side by side in one run, or a path timed
end to end on the real stack; each prints one JSON object with ``--json``."""

# Samples the pipeline bench pushes through. With 2 million (2,000 messages) the bare
# consumer read the full topic in about 0.14 s, and its rate (14 M samples/s against
# 2.7-3.4 M with 10 million) made the ratio meaningless; 10 million take about 35 s.
PIPELINE_SAMPLES = 10_000_000
