"""Serving stage: Prometheus text exposition of the engine gauges, request counters and latency histograms."""
from __future__ import annotations

from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)  # seconds


@dataclass
class Histogram:
    """A cumulative Prometheus histogram (observed from the event loop only)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total:.6f}",
                      f"{name}_count {self.count}"]


@dataclass
class ServerMetrics:
    """What the HTTP layer counts on top of the engine's own numbers."""

    time_to_first_audio: Histogram = field(default_factory=Histogram)
    request_seconds: Histogram = field(default_factory=Histogram)
    requests: int = 0
    errors: int = 0
    disconnects: int = 0
    audio_seconds: float = 0.0


# engine metric key -> (prometheus name, type, help)
ENGINE_METRICS = {
    "num_waiting": ("chattts_requests_waiting", "gauge", "Engine requests waiting to be scheduled"),
    "num_running": ("chattts_requests_running", "gauge", "Engine requests in the running batch"),
    "kv_cache_usage": ("chattts_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use"),
    "kv_blocks_used": ("chattts_kv_cache_blocks_used", "gauge", "KV cache blocks in use"),
    "steps_per_second": ("chattts_engine_steps_per_second", "gauge",
                         "Generated steps (4 codes, 21.3 ms of audio) per busy engine second, all sequences"),
    "num_steps": ("chattts_engine_model_steps_total", "counter", "Batched model steps run"),
    "num_tokens_sampled": ("chattts_engine_generated_steps_total", "counter", "Generated steps, all sequences"),
    "max_batch_size": ("chattts_engine_max_batch_size", "gauge", "Largest number of sequences in one step"),
    "num_shared_steps": ("chattts_engine_shared_steps_total", "counter", "Model steps that ran > 1 sequence"),
    "num_requests": ("chattts_engine_requests_total", "counter", "Requests accepted by the engine"),
    "num_finished": ("chattts_engine_requests_finished_total", "counter", "Engine requests that finished"),
    "num_aborted": ("chattts_engine_requests_aborted_total", "counter", "Engine requests aborted (disconnects)"),
}


def render(engine: dict[str, float], server: ServerMetrics, decode_max_batch: int) -> str:
    """The /metrics page."""
    lines: list[str] = []

    def add(name: str, kind: str, help_: str, values: list[str]) -> None:
        lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *values])

    for key, (name, kind, help_) in ENGINE_METRICS.items():
        if key in engine:
            add(name, kind, help_, [f"{name} {engine[key]:g}"])
    add("chattts_decode_max_batch_size", "gauge", "Most streams that got audio from one batched Decoder + Vocos round",
        [f"chattts_decode_max_batch_size {decode_max_batch}"])
    add("chattts_speech_requests_total", "counter", "POST /v1/audio/speech requests",
        [f"chattts_speech_requests_total {server.requests}"])
    add("chattts_speech_errors_total", "counter", "Speech requests answered with an error",
        [f"chattts_speech_errors_total {server.errors}"])
    add("chattts_speech_disconnects_total", "counter", "Speech requests whose client left early",
        [f"chattts_speech_disconnects_total {server.disconnects}"])
    add("chattts_audio_seconds_total", "counter", "Seconds of audio sent",
        [f"chattts_audio_seconds_total {server.audio_seconds:.3f}"])
    add("chattts_time_to_first_audio_seconds", "histogram", "Request start to first audio chunk",
        server.time_to_first_audio.lines("chattts_time_to_first_audio_seconds"))
    add("chattts_request_seconds", "histogram", "Request start to last audio chunk",
        server.request_seconds.lines("chattts_request_seconds"))
    return "\n".join(lines) + "\n"
