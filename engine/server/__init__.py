"""The local OpenAI- and Anthropic-compatible HTTP API (FastAPI + uvicorn)."""

from engine.server.app import create_app
from engine.server.serve import ServerThread
from engine.server.settings import ServerSettings

__all__ = ["ServerSettings", "ServerThread", "create_app"]
