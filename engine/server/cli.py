"""qwendesk-serve: the local OpenAI- and Anthropic-compatible API, headless.

The HTTP server starts at once and the model loads behind it (GET /health answers 503 until it is
ready), so a supervisor sees the process up and can wait for the model.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
from pathlib import Path

log = logging.getLogger("qwendesk.serve")
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="qwendesk-serve", description="Serve a Qwen3.5-family checkpoint over "
                                                                    "OpenAI- and Anthropic-compatible HTTP.")
    ap.add_argument("--model", required=True, help="checkpoint directory, or a Hugging Face repo id to download")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--api-key", default=os.environ.get("QWENDESK_API_KEY"),
                    help="require this key on /v1 routes and /metrics (default: $QWENDESK_API_KEY; none: open)")
    ap.add_argument("--model-id", help="the model name clients send (default: the checkpoint's directory name)")
    ap.add_argument("--profile", default="C1", choices=["C1", "C2", "C4", "C8"],
                    help="requests decoded together; more wait in the queue")
    ap.add_argument("--kv-dtype", default="bf16", choices=["bf16", "int8"])
    ap.add_argument("--max-context", type=int, default=None, help="tokens per request (default: what memory allows)")
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    ap.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond the profile before 429/529")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="accept this Host name besides loopback names and IP addresses (repeatable; '*': any)")
    ap.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="let web pages from this origin call the API (repeatable; default: none)")
    ap.add_argument("--max-body-mb", type=float, default=32, help="largest request body accepted")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return ap.parse_args(argv)


def serve_main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from engine.server import ServerSettings, create_app
    from engine.server.settings import is_loopback

    settings = ServerSettings(model_id=args.model_id or model_name(args.model), host=args.host, port=args.port,
                              api_key=args.api_key, allowed_hosts=args.allowed_host, cors_origins=args.cors_origin,
                              max_body_bytes=int(args.max_body_mb * 1024 * 1024))
    if not is_loopback(args.host) and not args.api_key:
        log.warning("listening on %s without an API key: anyone who can reach this port can use the model",
                    args.host)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           lifespan="off", timeout_graceful_shutdown=5))
    state = app.state.server
    loader = threading.Thread(target=load_engine, args=(args, state, server), name="qwendesk-load", daemon=True)
    loader.start()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it
        pass
    loader.join(timeout=1)
    if state.engine is not None:
        state.engine.close()
    return 1 if state.load_error else 0


def load_engine(args, state, server) -> None:
    from engine.api import Engine, EngineConfig

    try:
        path = resolve_model(args.model)
        engine = Engine(EngineConfig(model=path, device=args.device, dtype=args.dtype, profile=args.profile,
                                     kv_dtype=args.kv_dtype, max_context=args.max_context, max_queue=args.max_queue))
    except Exception as e:  # any failure to load is reported and ends the server
        state.load_error = f"{type(e).__name__}: {e}"
        log.error("cannot load %s: %s", args.model, state.load_error)
        server.should_exit = True
        return
    state.set_engine(engine)
    log.info("serving %s as %r: context %d tokens, profile %s", path, state.settings.model_id, engine.max_context,
             args.profile)


def resolve_model(model: str) -> str:
    """A local directory as is; a repo id ("Qwen/Qwen3.5-9B") downloaded into the Hugging Face cache."""
    if Path(model).exists() or not REPO_ID.match(model):
        return model
    from huggingface_hub import snapshot_download

    log.info("downloading %s", model)
    return snapshot_download(model)


def model_name(model: str) -> str:
    return model if REPO_ID.match(model) and not Path(model).exists() else Path(model).resolve().name


if __name__ == "__main__":
    sys.exit(serve_main())
