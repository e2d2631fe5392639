"""qwendesk-serve: the local OpenAI- and Anthropic-compatible API, headless.

The HTTP server starts at once and the model loads behind it (GET /health answers 503 until it is
ready), so a supervisor sees the process up and can wait for the model. Bad arguments, and a port another
program holds, are refused before either starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from typing import NoReturn

import uvicorn

from engine.commands.args import (Parser, add_speculation_args, checked, model_arg, model_name, port_arg, resolve_model,
                                  speculation_settings)
from engine.api import DEFAULT_PORT, DTYPE_NAMES, KV_DTYPES, PROFILES, VISION, EngineConfig, listen_socket
from engine.server.http.connections import LimitedServer, uvicorn_config

log = logging.getLogger("qwendesk.serve")


def parse_args(argv=None) -> tuple[argparse.Namespace, EngineConfig]:
    ap = Parser(prog="qwendesk-serve", description="Serve a Qwen3.5-family checkpoint over "
                                                   "OpenAI- and Anthropic-compatible HTTP.")
    ap.add_argument("--model", required=True, type=model_arg,
                    help="checkpoint directory, or a Hugging Face repo id to download")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    ap.add_argument("--api-key", default=os.environ.get("QWENDESK_API_KEY"),
                    help="require this key on /v1 routes and /metrics (default: $QWENDESK_API_KEY; none: open)")
    ap.add_argument("--model-id", help="the model name clients send (default: the checkpoint's directory name)")
    ap.add_argument("--profile", default="C1", choices=list(PROFILES),
                    help="requests decoded together; more wait in the queue")
    ap.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES)
    ap.add_argument("--max-context", type=int, default=None, help="tokens per request (default: what memory allows)")
    ap.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu")
    ap.add_argument("--dtype", default="auto", choices=DTYPE_NAMES)
    ap.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond the profile before 429/529")
    add_speculation_args(ap)
    ap.add_argument("--host-cache-gb", type=float, default=None, metavar="GB",
                    help="host-RAM tier for KV pages evicted from the GPU (default: min(8, a quarter of RAM); 0: off)")
    ap.add_argument("--disk-cache", action="store_true",
                    help="write each finished request's KV cache to disk, so that a restart reuses it")
    ap.add_argument("--disk-cache-gb", type=float, default=20.0, metavar="GB", help="bound on the disk tier's folder")
    ap.add_argument("--disk-cache-dir", default=None, metavar="DIR",
                    help="the disk tier's folder (default: $QWENDESK_CACHE_DIR/kv, else the user cache folder)")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="accept this Host name besides loopback names and IP addresses (repeatable; '*': any)")
    ap.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="let web pages from this origin call the API (repeatable; '*': any; default: none, and a "
                         "request from a web page is refused)")
    ap.add_argument("--max-body-mb", type=float, default=32, help="largest request body accepted")
    ap.add_argument("--vision", default="auto", choices=VISION,
                    help="the vision tower: auto (on demand on GPUs of 24 GiB or less, else resident), resident, "
                         "on_demand (on the GPU only while encoding) or off")
    ap.add_argument("--max-images", type=int, default=16, help="images per request")
    ap.add_argument("--max-image-mb", type=float, default=20, help="largest image file accepted (MiB)")
    ap.add_argument("--allow-image-urls", action="store_true",
                    help="fetch http(s) image URLs given in requests (off: images come as data: URLs / base64); "
                         "the server then reaches whatever address a request names")
    ap.add_argument("--max-connections", type=int, default=512, help="open connections in all (503 beyond)")
    ap.add_argument("--max-connections-per-client", type=int, default=128,
                    help="open connections from one client address (503 beyond)")
    ap.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                    help="seconds a client has to send a request's headers (408 beyond)")
    ap.add_argument("--special-tokens", default="auto", choices=["auto", "text", "control"],
                    help="special-token text (<|im_start|>, <tool_call>) in chat messages: plain text, or control "
                         "tokens as the template's own (default auto: text when --host is beyond loopback)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args(argv)
    for name in ("max_body_mb", "max_connections", "max_connections_per_client", "header_timeout"):
        if not getattr(args, name) > 0:
            ap.error(f"argument --{name.replace('_', '-')}: must be more than 0, not {getattr(args, name)}")
    config = checked(ap, EngineConfig(model=args.model, device=args.device, dtype=args.dtype, profile=args.profile,
                                      kv_dtype=args.kv_dtype, max_context=args.max_context,
                                      max_queue=args.max_queue, **speculation_settings(args),
                                      vision=args.vision, max_images=args.max_images,
                                      max_image_bytes=max(1, int(args.max_image_mb * 2**20)),
                                      host_cache_gb=args.host_cache_gb, disk_cache=args.disk_cache,
                                      disk_cache_gb=args.disk_cache_gb, disk_cache_dir=args.disk_cache_dir))
    return args, config


class Server(LimitedServer):
    """uvicorn's server, which on shutdown (Ctrl-C, SIGTERM) first closes the engine: every request in
    flight or queued then finishes as cancelled, so each open stream ends at once as its protocol ends a
    failed one, rather than being cut when the graceful timeout runs out."""

    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets=None) -> None:
        if self.state.engine is not None:
            await asyncio.to_thread(self.state.engine.close)
        await super().shutdown(sockets)


def serve_main(argv=None, load=None) -> NoReturn:
    """load(config) -> Engine: what builds the engine behind the server once the HTTP server is up (default:
    `Engine(config)`, the checkpoint's weights; the soak's launcher, tests/random_serve.py, builds random ones)."""
    args, config = parse_args(argv)
    try:
        sock = listen_socket(args.host, args.port)         # before the model loads: a port in use is said at once
    except OSError as e:
        print(f"qwendesk-serve: error: {e.strerror}", file=sys.stderr)
        sys.exit(1)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from engine.server import ServerSettings, create_app
    from engine.server.http.settings import is_loopback

    settings = ServerSettings(model_id=args.model_id or model_name(args.model), host=args.host, port=args.port,
                              api_key=args.api_key, allowed_hosts=args.allowed_host, cors_origins=args.cors_origin,
                              max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                              allow_image_urls=args.allow_image_urls, max_connections=args.max_connections,
                              max_connections_per_client=args.max_connections_per_client,
                              header_timeout_s=args.header_timeout, special_tokens=args.special_tokens)
    if not is_loopback(args.host) and not args.api_key:
        log.warning("listening on %s without an API key: anyone who can reach this port can use the model",
                    args.host)
    app = create_app(settings)
    state = app.state.server
    server = Server(uvicorn_config(app, settings, args.host, args.port, args.log_level), state)
    loader = threading.Thread(target=load_engine, args=(config, state, server, load), name="qwendesk-load",
                              daemon=True)
    loader.start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it
        pass
    loader.join(timeout=1)
    if state.engine is not None:
        state.engine.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # All is closed: skip the interpreter's teardown (a second or more of garbage collection over torch and
    # Triton), and a model still loading in its thread.
    os._exit(1 if state.load_error else 0)


def load_engine(config: EngineConfig, state, server, load=None) -> None:
    from engine.api import Engine

    try:
        config.model = resolve_model(config.model)
        engine = (load or Engine)(config)
    except Exception as e:  # any failure to load is reported and ends the server
        state.load_error = f"{type(e).__name__}: {e}"
        log.error("cannot load %s: %s", config.model, state.load_error)
        server.should_exit = True
        return
    state.set_engine(engine)
    log.info("serving %s as %r: context %d tokens, profile %s", config.model, state.settings.model_id,
             engine.max_context, config.profile)


if __name__ == "__main__":
    serve_main()
