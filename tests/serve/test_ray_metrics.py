"""serve/ray_metrics.py without a cluster: merging replicas' /metrics pages and the middleware that answers with it."""
from __future__ import annotations

import asyncio

import pytest

from chattts_velocity.serve.ray_metrics import (
    ClusterMetrics,
    MetricsHub,
    label_sample,
    merge_pages,
)

httpx = pytest.importorskip("httpx")
PAGE = """# HELP chattts_speech_requests_total POST /v1/audio/speech requests
# TYPE chattts_speech_requests_total counter
chattts_speech_requests_total {n}
# HELP chattts_request_seconds Request start to last audio chunk
# TYPE chattts_request_seconds histogram
chattts_request_seconds_bucket{{le="0.1"}} {n}
chattts_request_seconds_count {n}
"""


def test_label_sample_adds_the_replica_first_and_keeps_other_labels() -> None:
    assert label_sample("up 1", "r1/7") == 'up{replica="r1/7"} 1'
    assert label_sample('x_bucket{le="0.1"} 3', "r") == 'x_bucket{replica="r",le="0.1"} 3'
    assert label_sample('x{format="wav"} 2 1700000000', 'a"b') == 'x{replica="a\\"b",format="wav"} 2 1700000000'


def test_merge_keeps_one_header_per_family_and_every_replicas_samples_under_it() -> None:
    merged = merge_pages({"b/2": PAGE.format(n=5), "a/1": PAGE.format(n=3)})
    lines = merged.splitlines()
    assert lines[:4] == ["# HELP chattts_speech_requests_total POST /v1/audio/speech requests",
                         "# TYPE chattts_speech_requests_total counter",
                         'chattts_speech_requests_total{replica="a/1"} 3',
                         'chattts_speech_requests_total{replica="b/2"} 5']
    assert merged.count("# TYPE chattts_request_seconds histogram") == 1
    histogram = lines[lines.index("# TYPE chattts_request_seconds histogram") + 1:]
    assert histogram == ['chattts_request_seconds_bucket{replica="a/1",le="0.1"} 3',
                         'chattts_request_seconds_count{replica="a/1"} 3',
                         'chattts_request_seconds_bucket{replica="b/2",le="0.1"} 5',
                         'chattts_request_seconds_count{replica="b/2"} 5']


class _Remote:
    """A hub method called the way ray's actor handles are: .remote(...) -> an awaitable."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        future = asyncio.get_running_loop().create_future()
        future.set_result(self.fn(*args))
        return future


class _HubHandle:
    def __init__(self, hub: MetricsHub) -> None:
        self.put, self.pages_since = _Remote(hub.put), _Remote(hub.pages_since)


async def _metrics_app(scope, receive, send) -> None:
    body = PAGE.format(n=1).encode() if scope["path"] == "/metrics" else b"other"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_the_middleware_answers_metrics_with_every_live_replica_and_passes_the_rest() -> None:
    hub = MetricsHub()
    hub.put("other/9", PAGE.format(n=4))
    app = ClusterMetrics(_metrics_app, replica="this/1")
    app.hub = _HubHandle(hub)

    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get(path)

    page = asyncio.run(get("/metrics"))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    assert 'chattts_speech_requests_total{replica="this/1"} 1' in page.text
    assert 'chattts_speech_requests_total{replica="other/9"} 4' in page.text
    assert set(hub.pages_since(60)) == {"this/1", "other/9"}  # this replica's page went to the hub
    assert asyncio.run(get("/health")).text == "other"
    assert hub.pages_since(0.0) == {}  # pages older than the staleness limit drop out


def test_without_a_hub_a_replica_answers_with_its_own_page_labelled() -> None:
    class Broken:
        put = _Remote(lambda *a: (_ for _ in ()).throw(RuntimeError("actor died")))

    app = ClusterMetrics(_metrics_app, replica="solo/3")
    app.hub = Broken()

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/metrics")

    page = asyncio.run(get())
    assert 'chattts_speech_requests_total{replica="solo/3"} 1' in page.text and app.hub is None
