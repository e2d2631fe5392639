"""The local OpenAI- and Anthropic-compatible endpoint around the loaded engine (engine.server.serve)."""

from __future__ import annotations

from dataclasses import dataclass

UNAVAILABLE = "Endpoint unavailable in this build"


@dataclass(frozen=True)
class EndpointSettings:
    host: str
    port: int
    api_key: str = ""
    special_tokens: str = "auto"     # ServerSettings.special_tokens: auto (text beyond loopback) | text | control

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


@dataclass(frozen=True)
class EndpointStatus:
    running: bool
    base_url: str = ""
    message: str = ""       # why it is not running, when it is not
    failed: bool = False    # it was asked for and could not start (the switch goes off)


def start_endpoint(engine, settings: EndpointSettings, model_id: str, log=None):
    """-> (server or None, EndpointStatus). Never raises: a failure is a status message. `log`: a
    server_log.ServerLog that keeps the server's lines (each request among them)."""
    try:
        from engine.server import serve           # FastAPI and uvicorn: a build may lack them
    except ImportError:
        return None, EndpointStatus(False, message=UNAVAILABLE)
    try:
        server = serve(engine, model_id, settings.host, settings.port, settings.api_key or None,
                       log_level="info" if log is not None else "warning", special_tokens=settings.special_tokens)
    except OSError as e:
        status = EndpointStatus(False, message=f"The endpoint is off: {e.strerror or e}. Pick another port and "
                                               f"switch it on again.", failed=True)
    except Exception as e:  # noqa: BLE001 (the server's own start-up errors become a message)
        status = EndpointStatus(False, message=f"The endpoint did not start: {type(e).__name__}: {e}", failed=True)
    else:
        status = EndpointStatus(True, base_url=EndpointSettings(settings.host, server.port, settings.api_key).base_url)
    if log is not None:
        log.attach()
        log.note(f"Serving {model_id} at {status.base_url}" if status.running else status.message)
    return (server if status.running else None), status
