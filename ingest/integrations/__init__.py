"""Framework integrations: what a framework logs or calls back with, reported to the probe of
this process as the sample kinds of ``schemas/metrics.py``; each module imports its framework.
"""
