"""Development tools (host-sync detection, Triton compile checks).

Used by tests and benchmarks; the runtime never imports them."""
