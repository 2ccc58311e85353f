"""Serving stage on Ray Serve: one /metrics page for all replicas, each sample labelled with its replica.

Behind Serve's proxy a GET /metrics reaches whichever replica the proxy picks, so a scraper saw one replica's numbers
at a time. Now each replica pushes its own page (the app's /metrics, whatever renders it) to a small named actor,
MetricsHub, every PUSH_PERIOD_S and whenever it answers /metrics; the answer is every live replica's page merged:
the same families, each sample with a `replica="<replica id>/<pid>"` label (sum by the label-less name in PromQL
to aggregate). A replica silent for STALE_S (stopped, or replaced) drops out.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import CONTENT_TYPE, METRICS_PATH

logger = logging.getLogger("chattts_velocity")
HUB_NAME, HUB_NAMESPACE = "chattts-metrics-hub", "chattts"
PUSH_PERIOD_S = 5.0
STALE_S = 30.0
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?(\s.*)$")

if TYPE_CHECKING:
    from ray.actor import ActorProxy


class MetricsHub:
    """Ray actor: the latest /metrics page of each replica and when it came."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, page: str) -> None:
        self.pages[replica] = (time.monotonic(), page)

    def pages_since(self, max_age_s: float) -> dict[str, str]:
        now = time.monotonic()
        self.pages = {r: (t, p) for r, (t, p) in self.pages.items() if now - t <= max_age_s}
        return {replica: page for replica, (_, page) in self.pages.items()}


def merge_pages(pages: dict[str, str]) -> str:
    """Prometheus text pages by replica -> one page: each family's # HELP/# TYPE once, then every replica's samples
    of it with a replica label (families in order of first appearance)."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for replica, page in sorted(pages.items()):
        family = ""
        for line in page.splitlines():
            if line.startswith("#"):
                parts = line.split(None, 3)
                family = parts[2] if len(parts) > 2 else family
                if parts[1:2] in (["HELP"], ["TYPE"]) and len(headers.setdefault(family, [])) < 2:
                    headers[family].append(line)
            elif line.strip():
                samples.setdefault(family, []).append(label_sample(line, replica))
    families = list(dict.fromkeys([*headers, *samples]))
    return "".join(line + "\n" for f in families for line in [*headers.get(f, []), *samples.get(f, [])])


def label_sample(line: str, replica: str) -> str:
    """`name{a="1"} 2` -> `name{replica="r",a="1"} 2` (and `name 2` -> `name{replica="r"} 2`)."""
    match = _SAMPLE.match(line)
    if match is None:
        return line
    name, _, labels, rest = match.groups()
    value = replica.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}{{replica="{value}"{"," + labels if labels else ""}}}{rest}'


class ClusterMetrics:
    """ASGI middleware of a replica: GET /metrics answers with every replica's page (merged by merge_pages); a
    background task pushes this replica's page to the hub from the app's start-up on."""

    def __init__(self, app: ASGIApp, replica: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.app, self.replica, self.headers = app, replica, list(headers)  # headers: added to its answers
        self.hub: ActorProxy[MetricsHub] | None = None
        self.pusher: asyncio.Task[None] | None = None
        self.outer: dict[str, Any] = {}  # what the enclosing app puts in every scope (Starlette: "app")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.outer = {key: scope[key] for key in ("app",) if key in scope}
        if scope["type"] == "http" and scope["path"] == METRICS_PATH and scope["method"] == "GET":
            return await self._answer(send)
        if scope["type"] == "lifespan" and self.pusher is None:
            self.pusher = asyncio.get_running_loop().create_task(self._push_forever())
        await self.app(scope, receive, send)

    async def _answer(self, send: Send) -> None:
        status, page = await self._own_page()
        if status == 200:
            pages = await self._publish(page) or {self.replica: page}
            page = merge_pages(pages)
        body = page.encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode()), *self.headers]})
        await send({"type": "http.response.body", "body": body})

    async def _own_page(self) -> tuple[int, str]:
        """This replica's own /metrics (status, text), from the wrapped app."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": METRICS_PATH, "raw_path": METRICS_PATH.encode(), "query_string": b"",
                 "root_path": "", "headers": [], "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), **self.outer}
        response: dict[str, Any] = {"status": 500, "body": b""}

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
            elif message["type"] == "http.response.body":
                response["body"] += message.get("body", b"")

        await self.app(scope, receive, send)
        return response["status"], response["body"].decode()

    async def _publish(self, page: str) -> dict[str, str] | None:
        """Put this page in the hub and return every live replica's page; None when the hub cannot be reached."""
        try:
            hub = self._hub()  # ray types the methods of an actor class not written for ray as plain functions
            await hub.put.remote(self.replica, page)  # type: ignore[union-attr]
            pages: dict[str, str] = await hub.pages_since.remote(STALE_S)  # type: ignore[union-attr]
            return pages
        except Exception as exc:  # noqa: BLE001 -- the hub's owner replica died: make a new one next time
            logger.warning("metrics hub unreachable (%s): answering with this replica's metrics only", exc)
            self.hub = None
            return None

    def _hub(self) -> ActorProxy[MetricsHub]:
        if self.hub is None:
            import ray

            actor = ray.remote(num_cpus=0)(MetricsHub)
            self.hub = actor.options(name=HUB_NAME, namespace=HUB_NAMESPACE, get_if_exists=True).remote()
        return self.hub

    async def _push_forever(self) -> None:
        while True:
            await asyncio.sleep(PUSH_PERIOD_S)
            try:
                status, page = await self._own_page()
                if status == 200:
                    await self._publish(page)
            except Exception as exc:  # noqa: BLE001 -- e.g. the app not started yet: try again next period
                logger.debug("metrics push failed: %s", exc)
