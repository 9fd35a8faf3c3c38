"""Benchmarks: `python -m benchmarks` (or `make bench`) prints every table."""
