"""Serving stage: /metrics through prometheus_client — one registry per app (several apps may share a process),
speech outcomes labelled by status, format and voice kind, latency histograms by format, the engine's numbers read
at scrape time, and the process metrics (CPU, memory, file descriptors)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

prometheus_client.disable_created_metrics()  # no *_created series: they double the page and nobody graphs them
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)  # seconds
STATUSES = ("ok", "client_error", "server_error", "disconnect")
UNKNOWN = "none"  # the format / voice-kind label of a request refused before its body was read

# engine metric key (LLMEngine.metrics(), plus the decode worker's) -> (prometheus name, type, help)
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
    "decode_max_batch": ("chattts_decode_max_batch_size", "gauge",
                         "Most streams that got audio from one batched Decoder + Vocos round"),
}


@dataclass(frozen=True)
class Labels:
    """What a speech response is counted under."""

    format: str = UNKNOWN
    voice_kind: str = UNKNOWN


class EngineCollector:
    """The engine's numbers as Prometheus families, read when /metrics is scraped (never stale, never pushed)."""

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        for key, (name, kind, help_) in ENGINE_METRICS.items():
            if key in values:
                family = GaugeMetricFamily(name, help_) if kind == "gauge" else CounterMetricFamily(name, help_)
                family.add_metric([], float(values[key]))
                yield family


class ServerMetrics:
    """What the HTTP layer counts, in its own registry; `read_engine` gives the engine's numbers at scrape time."""

    def __init__(self, read_engine: Callable[[], dict[str, float]] | None = None) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("chattts_speech_requests", "POST /v1/audio/speech requests", registry=registry)
        self.responses = Counter("chattts_speech_responses", "Speech requests by outcome (status: ok, client_error, "
                                 "server_error, disconnect)", ["status", "format", "voice_kind"], registry=registry)
        self.audio_seconds = Counter("chattts_audio_seconds", "Seconds of audio sent", ["format"], registry=registry)
        self.time_to_first_audio = Histogram("chattts_time_to_first_audio_seconds", "Request start to first audio "
                                             "chunk", ["format"], buckets=LATENCY_BUCKETS, registry=registry)
        self.request_seconds = Histogram("chattts_request_seconds", "Request start to last audio chunk", ["format"],
                                         buckets=LATENCY_BUCKETS, registry=registry)
        self.cache = Counter("chattts_audio_cache_lookups", "Audio cache lookups of seeded requests (result: hit, "
                             "miss)", ["result"], registry=registry)
        ProcessCollector(registry=registry)
        if read_engine is not None:
            registry.register(EngineCollector(read_engine))

    def outcome(self, status: str, labels: Labels) -> None:
        self.responses.labels(status, labels.format, labels.voice_kind).inc()

    def render(self) -> bytes:
        """The /metrics page (Prometheus text format)."""
        return generate_latest(self.registry)
