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
from contextvars import ContextVar
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
    mem: int | None = None  # bytes for the models (weights, KV, buffers) and --kv auto's budget (None: no limit)
    every_model: bool = False  # serve every model of the store by name (`tightkv serve` with no model)
    keep_alive: float | None = None  # seconds an idle model stays loaded (None: 5 min, a pinned model forever)
    spec: dict | None = None  # `Model.speculate`'s arguments (--spec-type, -md, --draft-max/min); None: its default


class ServedModel:
    """One model this server serves: its names, what the listing routes show of it, and
    its Modelfile defaults (a model made by `tightkv create`).

    `name` is what the user gave (a registry or created name, or a .gguf path; None: the
    embedded model); `path` its file, None until a registry model is pulled (`locate`)."""

    def __init__(self, name: str | None, path: Path | None, alias: str | None = None, made=None):
        from ..registry import DEFAULT_MODEL

        is_path = name is not None and (name.endswith(".gguf") or "/" in name or os.sep in name)
        canonical = None if is_path else (made.name if made is not None else _canonical(name or DEFAULT_MODEL))
        self.id = alias or (Path(name).stem if is_path else canonical or name or DEFAULT_MODEL)
        names = {self.id, name or DEFAULT_MODEL}
        if canonical:
            names.add(canonical)
        if (name or DEFAULT_MODEL) == DEFAULT_MODEL:
            names.add(DEFAULT_MODEL.split(":")[0])  # 'gemma3' names the default, as Ollama's bare names do
        self.names = names | {n.removesuffix(":latest") for n in names}
        self.canonical = None if is_path or made is not None else canonical
        self.parameters: dict = dict(made.parameters) if made is not None else {}  # the Modelfile's PARAMETERs
        self.system: str | None = made.system if made is not None else None  # the Modelfile's SYSTEM
        self.base = made.base if made is not None else None
        self.metadata: dict[str, Any] = {}
        self.context_length = 0
        self.kv = ""
        self.kv_auto: dict | None = None  # what --kv auto chose and why
        self.chat_template: str | None = None
        self.n_params = 0
        self._digest: str | None = made.digest if made is not None else None
        self._digest_lock = threading.Lock()
        self.path: Path | None = None
        self.size, self.mtime, self.created = 0, time.time(), int(time.time())
        if path is not None:
            self.locate(path)

    def locate(self, path: Path) -> None:
        """Its file is `path` (given, or pulled on first use)."""
        if not path.is_file():
            raise TightKVError(f"{path}: no such model file")
        self.path = path
        self.names |= {path.name, path.stem, str(path)}
        self.names |= {f"{n}:latest" for n in list(self.names) if ":" not in n and "/" not in n}
        stat = path.stat()
        self.size, self.mtime, self.created = stat.st_size, stat.st_mtime, int(stat.st_mtime)

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

    def read_header(self) -> None:
        """The GGUF's metadata without loading the model (what the listings show of it)."""
        if self.metadata or self.path is None:
            return
        from ..gguf.reader import read_gguf

        g = read_gguf(self.path)
        self.metadata = {k: v for k, v in g.metadata.items() if not k.startswith("tokenizer.ggml.")}
        self.chat_template = g.metadata.get("tokenizer.chat_template")
        self.n_params = parameters(g)

    def digest(self) -> str:
        """sha256 of the GGUF file (the store's, else computed once, on first use)."""
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
            "parent_model": self.base or "",
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


PICKED: ContextVar = ContextVar("tightkv_picked", default=None)  # the model this request picked


class ServerState:
    """Everything the routes share: the config, the models (`pool`), the web page's
    documents (`shelf`, on the default model). Routes reach a model through `pick`."""

    def __init__(
        self,
        config: ServerConfig,
        load: Callable[[], Any] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[Any], None] | None = None,
    ):
        from .pool import ModelPool

        self.config = config
        self.started = time.time()
        self._listed: dict[tuple, ServedModel] = {}  # the store's models as listed, by (name, digest, modified)
        self.every_model = config.every_model and load is None
        self.pool = ModelPool(config.mem if self.every_model else None)
        if self.every_model:
            self.default = self._resident_for(None)
        else:
            self.default = self._pinned(load, on_failure, on_ready)
        from .sessions import Shelf

        self.shelf = Shelf(self.default.scheduler)  # the web page's documents stay on the default model
        self.default.scheduler.on_unload.append(self.shelf.close_all)

    @property
    def served(self):
        """The default model's `ServedModel` (the web page's)."""
        return self.default.served

    @property
    def scheduler(self):
        """The default model's scheduler (the web page's)."""
        return self.default.scheduler

    def _scheduler(self, load, name: str, lazy: bool, **hooks) -> Scheduler:
        c = self.config
        return Scheduler(
            load,
            c.parallel,
            c.max_queue,
            cache_ram=c.cache_ram,
            cache_disk=c.cache_disk,
            cache_disk_tokens=c.cache_disk_tokens,
            lazy=lazy,
            name=name,
            **hooks,
        )

    def _pinned(self, load, on_failure, on_ready):
        """`tightkv serve MODEL`: that model, loaded at start and kept."""
        from ..registry import find_created, resolve
        from .pool import Resident

        c = self.config
        made = find_created(c.model) if c.model else None
        served = ServedModel(c.model, resolve(c.model), c.alias, made)

        def ready(model) -> None:
            first = not served.metadata
            served.loaded(model)
            if on_ready and first:
                on_ready(model)

        holder: list = []
        scheduler = self._scheduler(
            load or (lambda: self._load(holder[0])), served.id, False, on_ready=ready, on_failure=on_failure
        )
        if c.keep_alive is not None:
            scheduler.set_keep_alive(c.keep_alive)
        holder.append(Resident(served, scheduler, pinned=True))
        return self.pool.add(holder[0])

    def _resident_for(self, name: str | None):
        """A model of the store (or a registry name, pulled on its first load) as a new
        resident, not loaded yet; 404 for a name the store and the registry do not know."""
        from ..registry import CATALOG, DEFAULT_MODEL, find_created, installed, looks_like_path, lookup
        from .pool import DEFAULT_KEEP_ALIVE, Resident

        name = name or DEFAULT_MODEL
        made = find_created(name)
        path = made.path if made is not None else None
        if made is None:
            try:
                if looks_like_path(name):
                    raise TightKVError("a path")  # clients name models, not files
                entry = lookup(name)
            except TightKVError:
                raise self._not_found(name) from None
            found = installed(entry)
            if found is None and entry.name not in CATALOG:  # a hub name: pulled on purpose only
                raise self._not_found(name)
            path, made = (found.path if found else None), None
            name = entry.name
        served = ServedModel(name, path, None, made)
        holder: list = []
        scheduler = self._scheduler(
            lambda: self._load(holder[0]), served.id, True, on_ready=lambda model: served.loaded(model)
        )
        keep = self.config.keep_alive
        scheduler.set_keep_alive(DEFAULT_KEEP_ALIVE if keep is None else keep)
        holder.append(Resident(served, scheduler, pinned=False))
        return self.pool.add(holder[0])

    def _load(self, resident):
        """Load a resident's model on its worker: pull it first if need be, make room for it
        within --mem, then load it at its context and KV type (its Modelfile's, else the
        server's)."""
        from ..api import Model
        from ..autokv import footprint

        served, c = resident.served, self.config
        if served.path is None:
            served.locate(_pull(served.id))
        ctx, kv = served.parameters.get("num_ctx") or c.ctx, served.parameters.get("kv_cache_type") or c.kv
        resident.holds = False
        draft = self._draft()
        if self.pool.memory is not None:
            context = self._context(served.path, ctx)
            self.pool.make_room(resident, footprint(served.path, context, _kv_name(kv)) + _draft_bytes(draft, context))
        else:
            resident.holds = True
        try:
            model = Model(served.path, kv=kv, context_length=ctx or None, threads=c.threads)  # 0: trained
            if ctx is None:
                model.set_context_length(min(model.context_length, DEFAULT_CTX))
            if model.kv_pending:  # --kv auto: every slot holds a whole context; the prefix store's RAM is spent too
                budget = None if c.mem is None else c.mem - (c.cache_ram or 0)
                model.choose_kv(memory=budget, slots=c.parallel)
            if c.spec:
                model.speculate(**c.spec)  # a draft model opens here, once
            model.generate([model.tokenizer.bos_id or 0], max_tokens=1)  # warm up the kernels
        except BaseException:
            resident.released()
            raise
        try:
            resident.footprint = footprint(served.path, model.context_length, str(model.kv))
            resident.footprint += _draft_bytes(draft, model.context_length)
        except Exception:  # noqa: BLE001 - a family `plan` cannot price: the claimed estimate stays
            resident.footprint = resident.footprint or served.size
        return model

    def _draft(self) -> Path | None:
        """The server's draft model file (-md, where speculation drafts with it), else None:
        it drafts for the one MODEL served, so its bytes count once."""
        from ..engine.speculative import DRAFT_MAX, SpecOptions
        from ..registry import resolve

        spec = self.config.spec or {}
        name = spec.get("model_draft")
        kind = spec.get("spec_type") or ("draft" if name else None)
        draft_max = DRAFT_MAX if spec.get("draft_max") is None else spec["draft_max"]
        return resolve(name) if name and SpecOptions(kind, draft_max).active and kind == "draft" else None

    @staticmethod
    def _context(path: Path, ctx: int | None) -> int:
        """The context a model will load with: `ctx` (its Modelfile's num_ctx, else --ctx;
        0: the trained one), else the trained context up to DEFAULT_CTX."""
        from ..gguf.reader import read_gguf
        from ..models.base import header_layout

        trained = header_layout(read_gguf(path))[0].context_length
        return min(trained, DEFAULT_CTX) if ctx is None else ctx or trained

    def pick(self, name: str | None):
        """What serves a request naming `name` (404 where nothing does): a `pool.Resident`,
        with `.served` (a `ServedModel`) and `.scheduler`. A model of the store not loaded
        yet loads when its first job comes (the job waits). `start_job` submits to the
        model this request picked last."""
        found = self.default if name is None else self.pool.find(name)
        if found is None:
            if not self.every_model:
                raise self._not_found(name)
            found = self._resident_for(name)
        PICKED.set(found)
        return found

    def picked(self):
        """The model this request picked (the default if it picked none)."""
        return PICKED.get() or self.default

    def check_model(self, name: str | None) -> None:
        self.pick(name)

    def forget(self, name: str) -> None:
        """Drop the idle resident `name` names (deleted from the store, or created anew):
        its model unloads, and a later request finds the store's entry as it is now."""
        found = self.pool.find(name)
        if found is not None and not found.pinned and found is not self.default and found.scheduler.idle():
            self.pool.remove(found)

    def _not_found(self, name: str | None) -> ApiError:
        hint = "see GET /api/tags" if self.every_model else f"this server serves '{self.default.id}'"
        return ApiError(
            404, f"model '{name}' not found ({hint})", "not_found_error", param="model", code="model_not_found"
        )

    def store_models(self) -> list:
        """What the listing routes show: the served models, and with `every_model` every
        model of the store (`store.Installed`), each as a `ServedModel`: the default model
        first (the web page talks to the first), then the newest first."""
        from ..registry import list_installed

        shown = {r.id: r.served for r in self.pool.all() if r.served.path is not None}
        if self.every_model:
            for found in list_installed():
                key = (found.name, found.digest, found.modified)
                if found.name in shown or not found.path.is_file():
                    continue
                if key not in self._listed:
                    served = ServedModel(found.name, found.path, None, found if found.created else None)
                    served._digest = found.digest
                    self._listed[key] = served
                shown[found.name] = self._listed[key]
        default = self.default.served
        return sorted(shown.values(), key=lambda s: (s is not default, -s.mtime))  # the web page's model first


def _draft_bytes(path: Path | None, context: int) -> int:
    """A draft model's bytes beside its target at `context` (`autokv.draft_bytes`; 0: none)."""
    from ..autokv import draft_bytes

    return draft_bytes(path, context) if path is not None else 0


def _kv_name(kv: str | None) -> str:
    """The KV type a spec loads as (None: $TIGHTKV_KV_CACHE_TYPE or the default)."""
    from ..kv.spec import is_auto, resolve_kv

    return "auto" if kv and is_auto(kv) else str(resolve_kv(kv))


def _pull(name: str) -> Path:
    """Pull a registry model on its first request, its progress in the log."""
    from ..registry import pull_model

    last = [0.0]

    def report(status: dict) -> None:
        done, total = status.get("completed"), status.get("total")
        if done is None or done == total or time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            where = f" {done * 100 // total}% of {total / 2**20:.0f} MiB" if done is not None and total else ""
            log.warning("pulling %s: %s%s", name, status.get("status", ""), where)

    return pull_model(name, quiet=True, report=report).path


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
        state.pool.start()
        try:
            yield
        finally:
            state.pool.stop(timeout=2.0)

    app = FastAPI(
        title="tightkv",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI- and Ollama-compatible API over local GGUF models, each picked by name.",
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

    @app.get("/health", summary="200 when ready, 503 while a pinned model loads")
    async def health():
        states = [r.scheduler.state for r in state.pool.all()]
        s = next((x for x in ("failed", "stopped", "loading") if x in states), "ready")
        if s == "ready":
            return {"status": "ok"}
        message = "Loading model" if s == "loading" else "Model failed to load" if s == "failed" else "Shutting down"
        return JSONResponse({"error": {"code": 503, "message": message, "type": "unavailable_error"}}, status_code=503)

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", summary="Prometheus text: requests processing and deferred, tokens, KV bytes, prefix store")
    async def metrics():
        schedulers = [r.scheduler for r in state.pool.all()]

        def total(get) -> float:
            return sum(get(sch) for sch in schedulers)

        rows = [
            ("requests_processing", "gauge", "requests generating now", total(lambda s: s.processing)),
            ("requests_deferred", "gauge", "requests waiting for a slot", total(lambda s: s.deferred)),
            ("requests_served_total", "counter", "requests completed", total(lambda s: s.served)),
            (
                "requests_cancelled_total",
                "counter",
                "requests stopped because the client went away",
                total(lambda s: s.cancelled),
            ),
            ("tokens_predicted_total", "counter", "tokens generated", total(lambda s: s.tokens)),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "speculative decoding: tokens drafted (llama-server's name)",
                total(lambda s: s.drafted),
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "speculative decoding: drafted tokens the model accepted",
                total(lambda s: s.draft_accepted),
            ),
            ("kv_cache_bytes", "gauge", "bytes held by active KV caches", total(lambda s: s.kv_bytes())),
            ("batch_size", "gauge", "sequences in the last batched decode step", total(lambda s: s.batch_size)),
            ("decode_steps_total", "counter", "batched decode forward passes", total(lambda s: s.decode_steps)),
            (
                "decode_rows_total",
                "counter",
                "tokens those passes carried (rows / steps: the mean batch)",
                total(lambda s: s.decode_rows),
            ),
            ("models_loaded", "gauge", "models in memory now", total(lambda s: s.loaded)),
            (
                "models_bytes",
                "gauge",
                "bytes the loaded models and the runtime hold, as plan counts them",
                state.pool.used(),
            ),
        ]
        stats = [sch.prefix_stats() for sch in schedulers]
        keys = ("entries", "bytes", "budget_bytes", "hits", "misses", "reused_tokens")
        store = {k: sum(x[k] for x in stats) for k in keys}
        store["hit_rate"] = round(store["hits"] / max(1, store["hits"] + store["misses"]), 4)
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
    "/api/create": "application/x-ndjson",
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
