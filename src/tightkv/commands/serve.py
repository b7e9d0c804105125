"""`tightkv serve [MODEL]`: OpenAI- and Ollama-compatible HTTP server."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import TightKVError

from .common import add_model_flags, kv_spec

NAME = "serve"
HELP = "serve a model over HTTP: OpenAI /v1/* and Ollama /api/* routes"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health (or $TIGHTKV_API_KEY)")
    p.add_argument("--parallel", "-np", type=int, default=4, help="requests decoded at once, in turn (default 4)")
    p.add_argument("--max-queue", type=int, default=32,
                   help="requests that may wait for a slot; more are answered 503 (default 32)")
    p.add_argument("--alias", default=None, help="the model id clients see (default: the model's name)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_model_flags(p)


def run(ns: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from ..server.app import ServerConfig, create_app

    if not 0 <= ns.port <= 65535:
        raise TightKVError(f"--port must be in 0..65535, got {ns.port}")
    if ns.parallel < 1 or ns.max_queue < 0:
        raise TightKVError("--parallel must be at least 1 and --max-queue at least 0")
    if ns.ctx is not None and ns.ctx < 1:
        raise TightKVError(f"--ctx must be positive, got {ns.ctx}")
    if ns.threads is not None and ns.threads < 1:
        raise TightKVError(f"--threads must be positive, got {ns.threads}")
    api_key = ns.api_key or os.environ.get("TIGHTKV_API_KEY") or None
    kv = kv_spec(ns)  # a bad KV type fails now, not in the loader thread
    config = ServerConfig(model=ns.model, kv=kv, ctx=ns.ctx, threads=ns.threads, api_key=api_key,
                          parallel=ns.parallel, max_queue=ns.max_queue, alias=ns.alias)
    logging.basicConfig(level=ns.log_level.upper(), format="tightkv: %(message)s", stream=sys.stderr)
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_failure(err: BaseException) -> None:
        failures.append(err)
        if server is not None:
            server.should_exit = True

    def on_ready(model) -> None:
        where = f"http://{'[' + ns.host + ']' if ':' in ns.host else ns.host}:{ns.port}"
        print(f"tightkv: serving '{app.state.tk.served.id}' on {where} (context {model.context_length}, "
              f"kv {model.kv}, {ns.parallel} parallel)", file=sys.stderr, flush=True)

    app = create_app(config, on_failure=on_failure, on_ready=on_ready)
    if ns.host not in LOOPBACK and not api_key:
        print(f"tightkv: warning: listening on {ns.host} without --api-key", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.log_level,
                                           timeout_graceful_shutdown=3, limit_concurrency=512))
    server.run()
    if failures:
        err = failures[0]
        raise err if isinstance(err, TightKVError) else TightKVError(f"the model failed to load: {err}")
    return 0
