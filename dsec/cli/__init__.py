"""The ``dsec`` command line: the top layer, composing services, benchmarks and tools."""

from dsec.cli.main import app, main

__all__ = ["app", "main"]
