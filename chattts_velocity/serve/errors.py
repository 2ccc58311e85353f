"""Serving stage: error responses in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, each counted into
the metrics under the labels its request reached."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import metrics
from .request import error_detail, validation_detail

logger = logging.getLogger("chattts_velocity.serve")


def count_error(app: FastAPI, status: int, request: Request | None = None) -> None:
    """An error response, counted under the labels its request reached (none before the body was read)."""
    state = getattr(app.state, "server", None)
    if state is not None and not (request is not None and getattr(request.state, "counted", False)):
        labels = getattr(request.state, "labels", metrics.Labels()) if request is not None else metrics.Labels()
        state.metrics.outcome("server_error" if status >= 500 else "client_error", labels)


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        count_error(request.app, exc.status_code, request)
        detail = exc.detail if isinstance(exc.detail, dict) else {
            "message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}
        return JSONResponse({"error": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        count_error(request.app, 500, request)
        logger.error("speech request failed: %r", exc)
        return JSONResponse({"error": error_detail(f"the server failed on this request: {exc}", kind="server_error",
                                                   code="internal_error")}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        count_error(request.app, 400, request)
        return JSONResponse({"error": validation_detail(list(exc.errors()))}, status_code=400)
