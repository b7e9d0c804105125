"""`tightkv serve [MODEL]`: OpenAI- and Ollama-compatible HTTP server: with no MODEL, every
model of the store by name (loaded on first use, kept --keep-alive, evicted to fit --mem);
with one, that model, loaded at start and pinned."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import TightKVError

from .flags import add_auto_flags, add_model_flags, add_spec_flags, auto_memory, kv_spec, parse_size, spec_kwargs

NAME = "serve"
HELP = "serve the store's models (or one) over HTTP: OpenAI /v1/* and Ollama /api/* routes"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="serve only this model (registry name, created name or .gguf path), loaded at start and kept "
        "(default: every model of the store, each loaded when a request names it)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (or $TIGHTKV_API_KEY)",
    )
    p.add_argument("--parallel", "-np", type=int, default=4, help="requests decoded at once, in turn (default 4)")
    p.add_argument(
        "--max-queue",
        type=int,
        default=32,
        help="requests that may wait for a slot; more are answered 503 (default 32)",
    )
    p.add_argument("--alias", default=None, help="the id clients see for MODEL (default: the model's name)")
    p.add_argument(
        "--keep-alive",
        default=None,
        metavar="DURATION",
        help="how long an idle model stays loaded, e.g. 5m, 1h, 0 (unload after each request), -1 (forever); "
        "a request's keep_alive wins (default 5m; a MODEL given is kept forever)",
    )
    p.add_argument(
        "--cache-ram",
        default=None,
        metavar="SIZE",
        help="RAM for reusable prompt prefixes (compressed KV caches, least recently used out), "
        "e.g. 2GB; 0 turns prefix reuse off (default: a quarter of the RAM available at start)",
    )
    p.add_argument(
        "--cache-disk",
        default="4GB",
        metavar="SIZE",
        help="disk for prompt prefixes of at least --cache-disk-tokens tokens, kept in the document "
        "store ($TIGHTKV_HOME/documents) so a restarted server starts warm; least recently "
        "used out; 0 keeps them in RAM only (default 4GB)",
    )
    p.add_argument(
        "--cache-disk-tokens",
        type=int,
        default=1024,
        metavar="N",
        help="the shortest prefix written to disk, in tokens (default 1024)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="the HTTP server's log detail (default info: one line per request)",
    )
    add_model_flags(
        p,
        ctx_help="context length in tokens (default: the trained context, at most 4096; "
        "0: the model's trained context)",
    )
    add_spec_flags(p)
    add_auto_flags(
        p,
        "memory for the loaded models, e.g. 8GB: weights, buffers and KV cache at their context, as plan "
        "prices them; the least recently used idle model is unloaded to fit the next (default: no limit), "
        "and --kv auto's budget",
    )


def check_port_free(host: str, port: int) -> None:
    """One clear error when `host:port` cannot be bound (in use, or not this machine's address)."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise TightKVError(f"--host {host}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise TightKVError(
                    f"port {port} on {host} is already in use (another `tightkv serve`?); "
                    "stop it or pick another with --port"
                ) from None
            raise TightKVError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def _checked_flags(ns: argparse.Namespace) -> tuple[str | None, str | None]:
    """(api key, KV spec) once every flag is valid and the port is free: errors come
    before the model loads, not from the loader thread."""
    if not 0 <= ns.port <= 65535:
        raise TightKVError(f"--port must be in 0..65535, got {ns.port}")
    if ns.parallel < 1 or ns.max_queue < 0:
        raise TightKVError("--parallel must be at least 1 and --max-queue at least 0")
    if ns.ctx is not None and ns.ctx < 0:
        raise TightKVError(f"-c/--ctx must be positive (or 0 for the model's context), got {ns.ctx}")
    if ns.threads is not None and ns.threads < 1:
        raise TightKVError(f"--threads must be positive, got {ns.threads}")
    kv = kv_spec(ns)
    ns.cache_ram_bytes = None if ns.cache_ram is None else parse_size(ns.cache_ram, "--cache-ram")
    ns.cache_disk_bytes = parse_size(ns.cache_disk, "--cache-disk")
    if ns.cache_disk_tokens < 1:
        raise TightKVError(f"--cache-disk-tokens must be positive, got {ns.cache_disk_tokens}")
    if ns.alias and not ns.model:
        raise TightKVError("--alias names the MODEL served: give one (tightkv serve MODEL --alias NAME)")
    ns.keep_alive_s = _keep_alive(ns.keep_alive)
    _check_spec(ns)
    check_port_free(ns.host, ns.port)
    return ns.api_key or os.environ.get("TIGHTKV_API_KEY") or None, kv


def _check_spec(ns: argparse.Namespace) -> None:
    """The speculation flags checked before the model loads; a draft model drafts for the
    one MODEL served (its vocabulary must be that model's), so -md needs a MODEL."""
    from ..engine.speculative import DRAFT_MAX, SpecOptions

    if ns.model_draft and not ns.model:
        raise TightKVError("-md/--model-draft drafts for the MODEL served: give one (tightkv serve MODEL -md DRAFT)")
    kind = ns.spec_type or ("draft" if ns.model_draft else None)
    if kind:
        max_ = DRAFT_MAX if ns.draft_max is None else ns.draft_max
        SpecOptions(kind, max_, ns.draft_min, ns.model_draft).validate()


def _keep_alive(text: str | None) -> float | None:
    """--keep-alive in seconds (None: the default); negative means forever (1e9 s)."""
    if text is None:
        return None
    from ..server.http import ApiError
    from ..server.ollama import keep_alive_seconds

    try:
        seconds = keep_alive_seconds(text)
    except ApiError:
        raise TightKVError(f"--keep-alive: {text!r} is not a duration (e.g. 5m, 1h, 30s, 0, -1)") from None
    return 1e9 if seconds is None else seconds


def run(ns: argparse.Namespace) -> int:
    api_key, kv = _checked_flags(ns)
    import logging

    import uvicorn

    from ..server.app import ServerConfig, create_app

    config = ServerConfig(
        model=ns.model,
        kv=kv,
        ctx=ns.ctx,
        threads=ns.threads,
        api_key=api_key,
        parallel=ns.parallel,
        max_queue=ns.max_queue,
        alias=ns.alias,
        cache_ram=ns.cache_ram_bytes,
        cache_disk=ns.cache_disk_bytes,
        cache_disk_tokens=ns.cache_disk_tokens,
        mem=auto_memory(ns),
        every_model=ns.model is None,
        keep_alive=ns.keep_alive_s,
        spec=spec_kwargs(ns),
    )
    logging.basicConfig(level=ns.log_level.upper(), format="tightkv: %(message)s", stream=sys.stderr)
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_failure(err: BaseException) -> None:
        failures.append(err)
        if server is not None:
            server.should_exit = True

    def on_ready(model) -> None:
        where = f"http://{'[' + ns.host + ']' if ':' in ns.host else ns.host}:{ns.port}"
        print(
            f"tightkv: serving '{app.state.tk.served.id}' on {where} (context {model.context_length}, "
            f"kv {model.kv}, {ns.parallel} parallel)",
            file=sys.stderr,
            flush=True,
        )

    app = create_app(config, on_failure=on_failure, on_ready=on_ready)
    if config.every_model:
        where = f"http://{'[' + ns.host + ']' if ':' in ns.host else ns.host}:{ns.port}"
        budget = f"within --mem {ns.mem}" if config.mem else "no memory limit (--mem)"
        print(
            f"tightkv: serving every model of the store on {where} (each loaded on first use; {budget})",
            file=sys.stderr,
            flush=True,
        )
    if ns.host not in LOOPBACK and not api_key:
        print(f"tightkv: warning: listening on {ns.host} without --api-key", file=sys.stderr)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=ns.host, port=ns.port, log_level=ns.log_level, timeout_graceful_shutdown=3, limit_concurrency=512
        )
    )
    try:
        server.run()
    except SystemExit:  # uvicorn's exit when it cannot bind: the port was taken since check_port_free
        raise TightKVError(f"cannot listen on {ns.host}:{ns.port} (see the message above)") from None
    if failures:
        err = failures[0]
        raise err if isinstance(err, TightKVError) else TightKVError(f"the model failed to load: {err}")
    return 0
