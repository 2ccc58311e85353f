"""The benchmarks, a package run from a checkout's root: `python -m benchmarks.NAME` (benchmarks/README.md)."""
