"""The local OpenAI- and Anthropic-compatible HTTP API (FastAPI + uvicorn)."""

from engine.server.app import create_app
from engine.server.thread import ServerThread
from engine.server.http.settings import ServerSettings


def serve(engine, model_id: str, host: str, port: int, api_key: str | None = None,
          log_level: str = "warning", special_tokens: str = "auto") -> ServerThread:
    """Start the endpoint around a loaded engine on its own thread; returns the running server (`.port` is the
    port it listens on, `.stop()` ends it). `log_level` "info" logs each request (uvicorn.access). `special_tokens`:
    ServerSettings.special_tokens."""
    app = create_app(ServerSettings(model_id=model_id, host=host, port=port, api_key=api_key,
                                    special_tokens=special_tokens), engine)
    return ServerThread(app, host, port, log_level=log_level).start()


__all__ = ["ServerSettings", "ServerThread", "create_app", "serve"]
