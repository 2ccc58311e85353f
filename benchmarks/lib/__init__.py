"""What the benchmarks share: loading and timing (runs, public, stream), the host probe, the A/B harness (ab) and the
docs' tables."""
