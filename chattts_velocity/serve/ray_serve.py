"""Serving stage on Ray Serve: the OpenAI speech app (openai_api.create_app) as replicas, one engine in each.

In: a model folder, a ServerConfig and ReplicaOptions. Out: a Serve Application (build_app), or one served over HTTP
(serve_on_ray). Needs the [ray] extra; `ray` is imported inside functions so init_ray() can set the loopback env first.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..cluster import LOOPBACK, init_ray, load_worker_chat
from ..cluster import LOOPBACK_ENV as LOOPBACK_ENV  # callers set it before importing ray
from ..speech.streams import StreamOptions
from .openai_api import create_app
from .ray_metrics import ClusterMetrics
from .server_config import ServerConfig

if TYPE_CHECKING:
    from fastapi import FastAPI
    from ray.serve import Application

REPLICA_HEADER = "x-chattts-replica"  # names the replica that answered (load-balancing checks, debugging)
DEPLOYMENT = "chattts-speech"


# ---- the deployment ------------------------------------------------------------------------
@dataclass
class ReplicaOptions:
    """How Serve runs the speech app. Defaults suit one CPU replica; see docs/scaling.md for tuning."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas; replaces `replicas`
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    # Serve's default of 5 would cap the engine's continuous batch at 5 per replica: let the engine queue.
    max_ongoing_requests: int = 256
    max_queued_requests: int = -1  # requests waiting in front of the replicas; beyond it Serve answers 503
    target_ongoing_requests: float = 32.0  # per replica, for autoscaling: about the batch where throughput saturates
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 300.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {self.replicas}")
        if self.autoscale is not None and not 1 <= self.autoscale[0] <= self.autoscale[1]:
            raise ValueError(f"autoscale: give MIN:MAX with 1 <= MIN <= MAX, got {self.autoscale}")
        if self.max_ongoing_requests < 1 or self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("max_ongoing_requests must be >= 1 and num_cpus / num_gpus >= 0")

    def deployment_options(self) -> dict[str, Any]:
        """Keyword arguments of serve.deployment()."""
        actor = {"num_cpus": self.num_cpus, **({"num_gpus": self.num_gpus} if self.num_gpus else {})}
        options: dict[str, Any] = {"name": DEPLOYMENT, "ray_actor_options": actor,
                                   "max_ongoing_requests": self.max_ongoing_requests,
                                   "max_queued_requests": self.max_queued_requests,
                                   "health_check_period_s": 10, "graceful_shutdown_timeout_s": 30}
        if self.autoscale is None:
            return {**options, "num_replicas": self.replicas}
        low, high = self.autoscale
        return {**options, "autoscaling_config": {
            "min_replicas": low, "max_replicas": high, "initial_replicas": low,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s}}


class ReplicaHeader:
    """ASGI middleware: adds `x-chattts-replica: <replica id>/<pid>` to every HTTP response."""

    def __init__(self, app: ASGIApp, value: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), value.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message: Message) -> None:
            headers = list(message.get("headers", ()))
            if message["type"] == "http.response.start" and self.header[0] not in (k.lower() for k, _ in headers):
                message = {**message, "headers": [*headers, self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


class SpeechReplica:
    """One Serve replica: the speech app, whose lifespan loads the Chat and starts this replica's engine.

    Wrapped by serve.ingress() in build_app; Serve then calls __serve_build_asgi_app__ in the replica and
    runs the app's lifespan there, so the same create_app() serves under uvicorn and under Serve.
    """

    app: FastAPI  # set by Serve's ingress wrapper: the app __serve_build_asgi_app__ built

    def __init__(self, model_dir: str, config: ServerConfig, load_kwargs: dict[str, Any]) -> None:
        self.model_dir, self.config, self.load_kwargs = model_dir, config, load_kwargs

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = create_app(functools.partial(load_worker_chat, self.model_dir, **self.load_kwargs), self.config)
        name = replica_name()
        app.add_middleware(ClusterMetrics, replica=name, headers=[(REPLICA_HEADER.encode(), name.encode())])
        app.add_middleware(ReplicaHeader, value=name)  # either may be the outer one: the header is added once
        return app

    def check_health(self) -> None:
        """Serve replaces a replica whose engine loop died (a raised error marks it unhealthy)."""
        state = getattr(self.app.state, "server", None)
        if state is not None and not state.engine.is_running:
            raise RuntimeError(f"engine: the background loop stopped ({state.engine.error!r})")


def replica_name() -> str:
    from ray import serve

    try:
        return f"{serve.get_replica_context().replica_tag}/{os.getpid()}"
    except RuntimeError:  # not inside a replica (unit tests)
        return f"local/{os.getpid()}"


def build_app(model_dir: str | Path, config: ServerConfig | None = None, options: ReplicaOptions | None = None,
              **load_kwargs: Any) -> Application:
    """The speech app as a Serve Application. load_kwargs go to Chat.load (verify, dtype, EngineConfig fields)."""
    from ray import serve

    options = options or ReplicaOptions()
    model_dir = str(Path(model_dir).resolve())
    if not Path(model_dir).is_dir():
        raise ValueError(f"model_dir: {model_dir} is not a folder; give the asset folder (the same path on every node)")
    deployment = serve.deployment(**options.deployment_options())(serve.ingress()(SpeechReplica))
    return deployment.bind(model_dir, config or ServerConfig(), load_kwargs)


def app_builder(args: dict[str, Any]) -> Application:
    """`serve run` / Serve config entry point (import_path: chattts_velocity.serve.ray_serve:app_builder).

    args: model (folder, required), verify, dtype, compile, the ServerConfig fields (max_new_token, api_key, ...)
    `engine` (a dict of EngineConfig fields, e.g. kv_cache_memory) and `stream` (StreamOptions fields, e.g.
    first_chunk_steps). Replica counts, CPUs and
    autoscaling go in the config's `deployments:` section (deployment name "chattts-speech").
    """
    args = dict(args)
    if "model" not in args:
        raise ValueError("model: the Serve config's args need `model: /path/to/asset/folder`")
    model = args.pop("model")
    load_kwargs = {k: args.pop(k) for k in ("verify", "dtype", "compile") if k in args}
    load_kwargs.update(args.pop("engine", None) or {})
    stream = args.pop("stream", None) or {}
    known = {f.name for f in dataclasses.fields(ServerConfig)} - {"stream_options"}
    if set(args) - known:
        raise ValueError(f"args: unknown field(s) {sorted(set(args) - known)}; known: {sorted(known | {'model'})}")
    fields = {f.name for f in dataclasses.fields(StreamOptions)}
    if not isinstance(stream, dict) or set(stream) - fields:
        raise ValueError(f"stream: expected a mapping of StreamOptions fields {sorted(fields)}, got {stream!r}")
    return build_app(model, ServerConfig(stream_options=StreamOptions(**stream), **args), **load_kwargs)


def serve_on_ray(app: Application, host: str = LOOPBACK, port: int = 8000, name: str = "chattts",
                 blocking: bool = True) -> str:
    """Start Serve's HTTP proxy on host:port and deploy `app` at "/"; blocks until Ctrl-C when `blocking`.

    Without an init_ray() first this starts a private loopback cluster. HTTP options only apply to the
    first serve.start() of a cluster.
    """
    init_ray()  # never let serve.start() auto-start a cluster on the network address
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/", blocking=False)
    url = f"http://{host}:{port}"
    if not blocking:
        return url
    print(f"serving on {url} (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # also ray_stop.StopRequested (SIGTERM, SIGHUP) in `chattts-velocity serve --ray`
        pass
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]  # unannotated in ray
    return url
