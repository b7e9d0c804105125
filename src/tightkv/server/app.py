"""The FastAPI app: `/v1/*` (OpenAI), `/api/*` (Ollama), `/health`, `/metrics`, the web
page at `/` (its files under `/web/`) and its `/v1/documents` routes.

    app = create_app(ServerConfig(model="gemma3:270m"))

The model loads on the scheduler's worker thread after the app starts; until
then `/health` answers 503 "Loading model" and generation routes 503.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.staticfiles import StaticFiles

from .. import __version__
from ..errors import TightKVError
from ..gguf.describe import file_type, human_number, parameters
from .http import ApiError, as_api_error, error_response, is_anthropic
from .scheduler import Scheduler

log = logging.getLogger("tightkv.server")

DEFAULT_CTX = 4096  # like Ollama: a trained context of 32K+ would waste memory on every request
MAX_BODY = 32 * 2**20  # bytes
WEB = Path(__file__).resolve().parent / "web"  # the page's HTML, CSS and JavaScript (package data)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@dataclass
class ServerConfig:
    model: str | None = None  # registry name or .gguf path; None: the embedded model
    kv: str | None = None
    ctx: int | None = None  # None: min(trained context, DEFAULT_CTX)
    threads: int | None = None
    api_key: str | None = None
    parallel: int = 4  # requests decoded at once (round-robin)
    max_queue: int = 32  # requests waiting beyond those
    alias: str | None = None  # the model id clients see
    cache_ram: int | None = None  # bytes for the prefix store (None: a quarter of the RAM available; 0: off)
    cache_disk: int = 0  # bytes of prompt prefixes kept on disk (0: RAM only)
    cache_disk_tokens: int = 1024  # the shortest prefix written to disk
    mem: int | None = None  # --kv auto's budget in bytes (None: the RAM available less 1 GiB)


class ServedModel:
    """The one model this server serves: its names and what the listing routes show."""

    def __init__(self, config: ServerConfig, path: Path):
        from ..registry import DEFAULT_MODEL

        name = config.model
        is_path = name is not None and (name.endswith(".gguf") or "/" in name or os.sep in name)
        self.path = path
        self.id = config.alias or (Path(name).stem if is_path else name or DEFAULT_MODEL)
        names = {self.id, path.name, path.stem, str(path), name or DEFAULT_MODEL}
        if (name or DEFAULT_MODEL) == DEFAULT_MODEL:
            names.add(DEFAULT_MODEL.split(":")[0])  # 'gemma3' names the default, as Ollama's bare names do
        names |= {f"{n}:latest" for n in list(names) if ":" not in n and "/" not in n}
        self.names = names
        self.canonical = None if is_path else _canonical(name or DEFAULT_MODEL)
        if not path.is_file():
            raise TightKVError(f"{path}: no such model file")
        stat = path.stat()
        self.size = stat.st_size
        self.mtime = stat.st_mtime
        self.created = int(stat.st_mtime)
        self.metadata: dict[str, Any] = {}
        self.context_length = 0
        self.kv = ""
        self.kv_auto: dict | None = None  # what --kv auto chose and why
        self.chat_template: str | None = None
        self.n_params = 0
        self._digest: str | None = None
        self._digest_lock = threading.Lock()

    def knows(self, name: str | None) -> bool:
        if name is None or name in self.names:
            return True
        return self.canonical is not None and _canonical(name) == self.canonical

    def loaded(self, model) -> None:
        self.metadata = dict(model.gguf.metadata)
        self.context_length = model.context_length
        self.kv = str(model.kv)
        self.kv_auto = model.kv_choice.as_dict() if model.kv_choice is not None else None
        self.chat_template = model.chat_template
        self.n_params = parameters(model.gguf)

    def digest(self) -> str:
        """sha256 of the GGUF file (computed once, on first use)."""
        with self._digest_lock:
            if self._digest is None:
                h = hashlib.sha256()
                with open(self.path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        h.update(block)
                self._digest = h.hexdigest()
            return self._digest

    def details(self) -> dict:
        arch = str(self.metadata.get("general.architecture", ""))
        return {
            "parent_model": "",
            "format": "gguf",
            "family": arch,
            "families": [arch] if arch else None,
            "parameter_size": human_number(self.n_params),
            "quantization_level": file_type(self.metadata) or "unknown",
        }

    def modified_at(self) -> str:
        return datetime.fromtimestamp(self.mtime).astimezone().isoformat()


def _canonical(name: str) -> str | None:
    """The registry's canonical name ('gemma3' -> 'gemma3:270m'), if it knows one."""
    from ..registry import lookup

    try:
        return lookup(name).name
    except Exception:  # noqa: BLE001 - an unknown name is just not ours
        return None


class ServerState:
    """Everything the routes share: config, the served model, the scheduler."""

    def __init__(
        self,
        config: ServerConfig,
        load: Callable[[], Any] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[Any], None] | None = None,
    ):
        from ..registry import resolve

        self.config = config
        self.started = time.time()
        self.served = ServedModel(config, resolve(config.model))

        def ready(model) -> None:
            self.served.loaded(model)
            if on_ready:
                on_ready(model)

        self.scheduler = Scheduler(
            load or self._load,
            config.parallel,
            config.max_queue,
            on_ready=ready,
            on_failure=on_failure,
            cache_ram=config.cache_ram,
            cache_disk=config.cache_disk,
            cache_disk_tokens=config.cache_disk_tokens,
        )
        from .sessions import Shelf

        self.shelf = Shelf(self.scheduler)  # the web page's documents
        self.scheduler.on_unload.append(self.shelf.close_all)

    def _load(self):
        from ..api import Model

        c = self.config
        model = Model(self.served.path, kv=c.kv, context_length=c.ctx or None, threads=c.threads)  # 0: trained
        if c.ctx is None:
            model.set_context_length(min(model.context_length, DEFAULT_CTX))
        if model.kv_pending:  # --kv auto: every slot holds a whole context; the prefix store's RAM is spent too
            budget = None if c.mem is None else c.mem - (c.cache_ram or 0)
            model.choose_kv(memory=budget, slots=c.parallel)
        model.generate([model.tokenizer.bos_id or 0], max_tokens=1)  # warm up the kernels
        return model

    def pick(self, name: str | None):
        """What serves a request naming `name` (404 where nothing does): an object with
        `.served` (a `ServedModel`) and `.scheduler`. New routes reach the model only
        through this, so that one server can hold many models."""
        self.check_model(name)
        return self

    def check_model(self, name: str | None) -> None:
        if not self.served.knows(name):
            raise ApiError(
                404,
                f"model '{name}' not found (this server serves '{self.served.id}')",
                "not_found_error",
                param="model",
                code="model_not_found",
            )


def _public(method: str, path: str) -> bool:
    """Routes open without the API key: /health, and the page's own files (no data in
    them: the page asks for the key, then sends it with every request)."""
    return path == "/health" or (method in ("GET", "HEAD") and (path == "/" or path.startswith("/web/")))


class GuardMiddleware:
    """API key (Bearer) on every route but /health and the page's files, and a cap on body size."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        err = None
        if self.key is not None and not _public(scope.get("method", ""), path):
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer":  # Anthropic's clients send the key as x-api-key
                token = headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(token.strip(), self.key):
                err = ApiError(
                    401,
                    "invalid or missing API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')",
                    "authentication_error",
                    code="invalid_api_key",
                )
        length = headers.get(b"content-length", b"0")
        if err is None and length.isdigit() and int(length) > MAX_BODY:
            err = ApiError(413, f"the request body is larger than {MAX_BODY} bytes", code="request_too_large")
        if err is not None:
            response = error_response(path, err)
            if err.status == 401 and not path.startswith("/api"):
                response.headers["WWW-Authenticate"] = "Bearer"
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(
    config: ServerConfig,
    load: Callable[[], Any] | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[Any], None] | None = None,
) -> FastAPI:
    """The ASGI app. `load` replaces loading `config.model`; `on_ready(model)` and
    `on_failure(error)` are called from the worker thread when loading ends."""
    from contextlib import asynccontextmanager

    from . import anthropic, documents, embeddings, llamacpp, ollama, openai, responses

    state = ServerState(config, load, on_failure, on_ready)

    @asynccontextmanager
    async def lifespan(app):
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.stop(timeout=2.0)

    app = FastAPI(
        title="tightkv",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI- and Ollama-compatible API over one local GGUF model.",
    )
    app.state.tk = state
    app.add_middleware(GuardMiddleware, api_key=config.api_key)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(request.url.path, err)

    @app.exception_handler(TightKVError)
    async def _user_error(request: Request, err: TightKVError):  # a bad request found by the engine
        return error_response(request.url.path, as_api_error(err))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {"msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(request.url.path, ApiError(400, f"'{where}': {first['msg']}" if where else first["msg"]))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(err.status_code, "invalid_request_error")
        message = f"no route {request.method} {request.url.path}" if err.status_code in (404, 405) else str(err.detail)
        return error_response(
            request.url.path, ApiError(err.status_code, message, kind, headers=getattr(err, "headers", None))
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception):
        log.error("unhandled error", exc_info=err)
        return error_response(
            request.url.path,
            ApiError(500, "internal server error (see the server log)", "server_error", code="server_error"),
        )

    @app.get("/health", summary="200 when ready, 503 while the model loads")
    async def health():
        s = state.scheduler.state
        if s == "ready":
            return {"status": "ok"}
        message = "Loading model" if s == "loading" else "Model failed to load" if s == "failed" else "Shutting down"
        return JSONResponse({"error": {"code": 503, "message": message, "type": "unavailable_error"}}, status_code=503)

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", summary="Prometheus text: requests processing and deferred, tokens, KV bytes, prefix store")
    async def metrics():
        sch = state.scheduler
        rows = [
            ("requests_processing", "gauge", "requests generating now", sch.processing),
            ("requests_deferred", "gauge", "requests waiting for a slot", sch.deferred),
            ("requests_served_total", "counter", "requests completed", sch.served),
            ("requests_cancelled_total", "counter", "requests stopped because the client went away", sch.cancelled),
            ("tokens_predicted_total", "counter", "tokens generated", sch.tokens),
            ("kv_cache_bytes", "gauge", "bytes held by active KV caches", sch.kv_bytes()),
            ("batch_size", "gauge", "sequences in the last batched decode step", sch.batch_size),
            ("decode_steps_total", "counter", "batched decode forward passes", sch.decode_steps),
            (
                "decode_rows_total",
                "counter",
                "tokens those passes carried (rows / steps: the mean batch)",
                sch.decode_rows,
            ),
        ]
        store = sch.prefix_stats()
        rows += [
            ("prefix_cache_entries", "gauge", "prompt prefixes stored for reuse", store["entries"]),
            ("prefix_cache_bytes", "gauge", "bytes held by stored prompt prefixes", store["bytes"]),
            ("prefix_cache_budget_bytes", "gauge", "the prefix store's RAM budget", store["budget_bytes"]),
            ("prefix_cache_hits_total", "counter", "requests that reused a stored prefix", store["hits"]),
            ("prefix_cache_misses_total", "counter", "requests that found no stored prefix", store["misses"]),
            ("prefix_cache_hit_rate", "gauge", "hits / (hits + misses)", store["hit_rate"]),
            (
                "prompt_tokens_cached_total",
                "counter",
                "prompt tokens taken from stored prefixes",
                store["reused_tokens"],
            ),
        ]
        text = "".join(f"# HELP tightkv:{n} {h}\n# TYPE tightkv:{n} {t}\ntightkv:{n} {v}\n" for n, t, h, v in rows)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root():
        return FileResponse(WEB / "index.html", media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    app.mount("/web", StaticFiles(directory=WEB), name="web")
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(ollama.router)
    app.include_router(llamacpp.router)
    app.include_router(documents.router)
    app.include_router(embeddings.router)
    app.include_router(anthropic.router)
    _document_bodies(app)
    return app


ERROR_SCHEMAS = {
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    },
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}
STREAMS = {
    "/v1/chat/completions": "text/event-stream",
    "/v1/completions": "text/event-stream",
    "/v1/messages": "text/event-stream",
    "/v1/responses": "text/event-stream",
    "/api/chat": "application/x-ndjson",
    "/api/generate": "application/x-ndjson",
    "/api/pull": "application/x-ndjson",
    "/v1/documents/{doc_id}/events": "text/event-stream",
    "/v1/documents/{doc_id}/ask": "text/event-stream",
}
TEXT = {"/metrics": "text/plain"}
ERRORS = {
    "400": "a bad request",
    "401": "a missing or wrong API key",
    "404": "an unknown model or route",
    "413": "a body over 32 MB",
    "501": "not served here",
    "503": "loading, or too many requests waiting",
}


def _document_answers(doc: dict) -> None:
    """Every route's error answers (OpenAI's shape on /v1, Ollama's on /api, Anthropic's on
    /v1/messages) and the
    streaming media types of the generation routes, in the OpenAPI document."""
    for path, ops in doc.get("paths", {}).items():
        ref = "OllamaError" if path.startswith("/api/") else "AnthropicError" if is_anthropic(path) else "OpenAIError"
        for op in ops.values():
            answers = op.setdefault("responses", {})
            answers.pop("422", None)  # bodies are parsed by hand: a bad one is a 400
            for code, why in ERRORS.items():
                answers.setdefault(
                    code,
                    {
                        "description": why,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
                    },
                )
            if path in STREAMS:  # each event (SSE data) or line (NDJSON) is a JSON object, as the JSON answer
                ok = answers.setdefault("200", {"description": "Successful Response"}).setdefault("content", {})
                ok.setdefault("application/json", {"schema": {}})
                ok[STREAMS[path]] = {"schema": {}}
            if path in TEXT:
                answers["200"]["content"] = {TEXT[path]: {"schema": {"type": "string"}}}


def _document_bodies(app: FastAPI) -> None:
    """Add the request schemas of our hand-parsed bodies to the OpenAPI document."""
    from fastapi.openapi.utils import get_openapi

    from .http import COMPONENTS

    def openapi():
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
            doc["components"]["schemas"].update(ERROR_SCHEMAS)
            _document_answers(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
