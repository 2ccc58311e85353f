"""Serving stage: /metrics through prometheus_client — one registry per app (several apps may share a process),
speech outcomes labelled by status, format and voice kind, latency histograms by format, the engine's numbers read
at scrape time, and the process metrics (CPU, memory, file descriptors)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# no *_created series: they double the page and nobody graphs them
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus_client
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)  # seconds
STATUSES = ("ok", "client_error", "server_error", "disconnect")
UNKNOWN = "none"  # the format / voice-kind label of a request refused before its body was read
METRICS_PATH = "/metrics"
DECODE_MAX_BATCH = "decode_max_batch"  # the decode worker's key beside the engine's
EngineNumbers = Mapping[str, float | str]  # AsyncLLMEngine.metrics(): numbers, and the backend's name


@dataclass(frozen=True)
class Family:
    """One metric family on the /metrics page."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    labels: tuple[str, ...] = ()

    @property
    def sample(self) -> str:
        """The name its (unsuffixed) samples carry on the page: a counter's end in _total; a histogram's are
        this name plus _bucket, _count and _sum."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


# what the HTTP layer counts (ServerMetrics' attribute -> family)
SPEECH_METRICS = {
    "requests": Family("chattts_speech_requests", "counter", "POST /v1/audio/speech requests"),
    "responses": Family("chattts_speech_responses", "counter", f"Speech requests by outcome (status: "
                        f"{', '.join(STATUSES)})", ("status", "format", "voice_kind")),
    "audio_seconds": Family("chattts_audio_seconds", "counter", "Seconds of audio sent", ("format",)),
    "time_to_first_audio": Family("chattts_time_to_first_audio_seconds", "histogram",
                                  "Request start to first audio chunk", ("format",)),
    "request_seconds": Family("chattts_request_seconds", "histogram", "Request start to last audio chunk",
                              ("format",)),
    "cache": Family("chattts_audio_cache_lookups", "counter", "Audio cache lookups of seeded requests (result: hit, "
                    "miss)", ("result",)),
}

# engine metric key (AsyncLLMEngine.metrics(), plus the decode worker's) -> family, read at scrape time
ENGINE_METRICS = {
    "num_waiting": Family("chattts_requests_waiting", "gauge", "Engine requests waiting to be scheduled"),
    "num_running": Family("chattts_requests_running", "gauge", "Engine requests in the running batch"),
    "kv_cache_usage": Family("chattts_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use"),
    "kv_blocks_used": Family("chattts_kv_cache_blocks_used", "gauge", "KV cache blocks in use"),
    "steps_per_second": Family("chattts_engine_steps_per_second", "gauge",
                               "Generated steps (4 codes, 21.3 ms of audio) per busy engine second, all sequences"),
    "num_steps": Family("chattts_engine_model_steps", "counter", "Batched model steps run"),
    "num_tokens_sampled": Family("chattts_engine_generated_steps", "counter", "Generated steps, all sequences"),
    "max_batch_size": Family("chattts_engine_max_batch_size", "gauge", "Largest number of sequences in one step"),
    "num_shared_steps": Family("chattts_engine_shared_steps", "counter", "Model steps that ran > 1 sequence"),
    "num_requests": Family("chattts_engine_requests", "counter", "Requests accepted by the engine"),
    "num_finished": Family("chattts_engine_requests_finished", "counter", "Engine requests that finished"),
    "num_aborted": Family("chattts_engine_requests_aborted", "counter", "Engine requests aborted (disconnects)"),
    DECODE_MAX_BATCH: Family("chattts_decode_max_batch_size", "gauge",
                             "Most streams that got audio from one batched Decoder + Vocos round"),
}


@dataclass(frozen=True)
class Labels:
    """What a speech response is counted under."""

    format: str = UNKNOWN
    voice_kind: str = UNKNOWN


class EngineCollector:
    """The engine's numbers as Prometheus families, read when /metrics is scraped (never stale, never pushed)."""

    def __init__(self, read: Callable[[], EngineNumbers]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        for key, family in ENGINE_METRICS.items():
            if key in values:
                kind = GaugeMetricFamily if family.kind == "gauge" else CounterMetricFamily
                metric = kind(family.name, family.help)
                metric.add_metric([], float(values[key]))
                yield metric


class ServerMetrics:
    """What the HTTP layer counts, in its own registry; `read_engine` gives the engine's numbers at scrape time."""

    def __init__(self, read_engine: Callable[[], EngineNumbers] | None = None) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = _counter(SPEECH_METRICS["requests"], registry)
        self.responses = _counter(SPEECH_METRICS["responses"], registry)
        self.audio_seconds = _counter(SPEECH_METRICS["audio_seconds"], registry)
        self.time_to_first_audio = _histogram(SPEECH_METRICS["time_to_first_audio"], registry)
        self.request_seconds = _histogram(SPEECH_METRICS["request_seconds"], registry)
        self.cache = _counter(SPEECH_METRICS["cache"], registry)
        ProcessCollector(registry=registry)
        if read_engine is not None:
            registry.register(EngineCollector(read_engine))

    def outcome(self, status: str, labels: Labels) -> None:
        self.responses.labels(status, labels.format, labels.voice_kind).inc()

    def render(self) -> bytes:
        """The /metrics page (Prometheus text format)."""
        return generate_latest(self.registry)


def _counter(family: Family, registry: CollectorRegistry) -> Counter:
    return Counter(family.name, family.help, family.labels, registry=registry)


def _histogram(family: Family, registry: CollectorRegistry) -> Histogram:
    return Histogram(family.name, family.help, family.labels, buckets=LATENCY_BUCKETS, registry=registry)
