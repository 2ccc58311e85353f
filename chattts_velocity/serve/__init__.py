"""Serving stage: the OpenAI-compatible speech server (FastAPI + uvicorn) on one shared AsyncLLMEngine.

    from chattts_velocity.serve import ServerConfig, create_app, run_server
    run_server(lambda: load_my_chat(), ServerConfig(api_key=None), host="127.0.0.1", port=8000)

The app runs on a SpeechPipeline: give it one, a loaded Chat (its `.pipeline` is used), or a loader of either.

Needs the [server] extra (fastapi, uvicorn); importing chattts_velocity itself does not.
"""
from chattts_velocity.serve.engine_runner import SpeechStream
from chattts_velocity.serve.openai_api import create_app, run_server
from chattts_velocity.serve.server_config import ServerConfig
from chattts_velocity.serve.service import SpeechService

__all__ = ["ServerConfig", "SpeechService", "SpeechStream", "create_app", "run_server"]
