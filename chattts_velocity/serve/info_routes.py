"""Serving stage: GET /v1/models, /health and /metrics."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import metrics
from .openai_names import model_names
from .server_config import ServerConfig


def add_info_routes(app: FastAPI, config: ServerConfig) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "chattts_velocity"}
                                           for name in model_names(config.model_name)]}

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        engine = request.app.state.server.engine
        if not engine.is_running:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        # degraded: the latest step failed some requests; everyone else is still being served
        return JSONResponse({"status": "degraded" if engine.failing else "ok"})

    @app.get(metrics.METRICS_PATH)
    async def prometheus(request: Request) -> Response:
        return Response(request.app.state.server.metrics.render(), media_type=metrics.CONTENT_TYPE)
