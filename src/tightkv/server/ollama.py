"""Ollama routes (CONVENTIONS B1): /api/chat and /api/generate as NDJSON,
/api/tags, /api/show, /api/ps, /api/version. Errors are `{"error": "..."}`;
an error after the stream started is a last NDJSON line `{"error": "..."}`."""
from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import anyio
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from .. import __version__
from ..kernels import library
from .common import (ApiError, JobStream, OllamaJSON, as_api_error, collect, events, finite, go_dumps, parse_body,
                     request_body, start_job, stop_list)
from ..engine.tools import parse_tool_calls, template_messages, tool_format
from .outputs import check_constraint, constraint_options
from .scheduler import DONE, ERROR, PIECE, Prepared
from .schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaPullRequest, OllamaShowRequest

router = APIRouter(prefix="/api", tags=["Ollama"])

# Ollama's sampling defaults (api/types.go DefaultOptions)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1}


def created_at() -> str:
    """RFC 3339 with fractional seconds in UTC, as Go's time.Time marshals."""
    now = datetime.now(timezone.utc)
    frac = f"{now.microsecond:06d}".rstrip("0")
    return now.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def _check(req, state) -> None:
    if not req.model:
        raise ApiError(400, "model is required")
    if not state.served.knows(req.model):
        raise ApiError(404, f'model "{req.model}" not found (this server serves "{state.served.id}")')


def _check_think(req, model_id: str, template: str | None) -> None:
    """Ollama answers `think` for a model that does not think with a 400."""
    if getattr(req, "think", None) and "<think>" not in (template or ""):
        raise ApiError(400, f'"{model_id}" does not support thinking')


def _ready(state) -> None:
    if state.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})


def _options(req) -> tuple[int | None, dict]:
    o = req.options
    options = dict(DEFAULTS)
    max_tokens = None
    if o is not None:
        for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
            finite(getattr(o, name), name)
        for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty"):
            if getattr(o, name) is not None:
                options[name] = getattr(o, name)
        if o.seed is not None and o.seed >= 0:
            options["seed"] = o.seed % 2**64
        options["stop"] = stop_list(o.stop)
        if o.num_predict is not None and o.num_predict >= 0:
            max_tokens = o.num_predict
    options.update(constraint_options(ollama_format=req.format))
    return max_tokens, options


def _fit(model, ids: list[int], max_tokens: int | None, req) -> int:
    """Ollama's budget: `num_predict` caps the reply, and generation stops at the end of the
    context ("length"), which is `num_ctx` when the request gives one below the server's
    context; a prompt that does not fit is still an error, never truncated."""
    from ..errors import ContextOverflowError

    num_ctx = req.options.num_ctx if req.options else None
    ctx = min(num_ctx, model.context_length) if num_ctx and num_ctx > 0 else model.context_length
    room = ctx - len(ids)
    if room <= 0:
        raise ContextOverflowError(f"prompt of {len(ids)} tokens does not fit the context of {ctx} tokens",
                                   len(ids), ctx)
    return room if max_tokens is None else min(max_tokens, room)


def _final(job, stats) -> dict:
    """The timing fields of Ollama's last record, durations in nanoseconds."""
    total = time.perf_counter() - job.created
    return {
        "done_reason": stats.finish_reason,
        "total_duration": int(total * 1e9),
        "load_duration": 0,
        "prompt_eval_count": stats.prompt_tokens - stats.cached_tokens,  # evaluated: the stored prefix is not
        "prompt_eval_duration": int(stats.prompt_seconds * 1e9),
        "eval_count": stats.generated_tokens,
        "eval_duration": int(stats.generation_seconds * 1e9),
    }


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "0");
    negative means forever (None)."""
    import re

    if isinstance(value, bool):
        raise ApiError(400, "invalid keep_alive: a number of seconds or a duration like \"5m\"")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ApiError(400, "invalid keep_alive: not a finite number")
        seconds = float(value)
    else:
        text = value.strip()
        parts = re.fullmatch(r"-?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+|-?\d+", text)
        if not parts:
            raise ApiError(400, f"invalid keep_alive {value!r}: a number of seconds or a duration like \"5m\"")
        if re.fullmatch(r"-?\d+", text):
            seconds = float(text)
        else:
            seconds = sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text))
            seconds = -seconds if text.startswith("-") else seconds
    return None if seconds < 0 else seconds


def _keep(req, state) -> None:
    if req.keep_alive is not None:
        state.scheduler.set_keep_alive(keep_alive_seconds(req.keep_alive))


def _load_reply(state, model_id: str, req, chat: bool) -> OllamaJSON:
    """Ollama answers a request without a prompt by loading (or, keep_alive 0, unloading) the model."""
    reason = "unload" if req.keep_alive is not None and keep_alive_seconds(req.keep_alive) == 0 else "load"
    if reason == "load":
        state.scheduler.load()
    body = {"model": model_id, "created_at": created_at()}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    body.update(done=True, done_reason=reason)
    return OllamaJSON(body)


def _stream(job, model_id: str, piece, final) -> JobStream:
    async def ndjson():
        async for kind, value in events(job):
            if kind == PIECE:
                yield go_dumps({"model": model_id, "created_at": created_at(), **piece(value), "done": False}) + "\n"
            elif kind == DONE:
                yield go_dumps({"model": model_id, "created_at": created_at(), **piece(""), "done": True,
                                **final(value)}) + "\n"
            elif kind == ERROR:
                yield go_dumps({"error": as_api_error(value).message}) + "\n"

    return JobStream(job, ndjson(), "application/x-ndjson")


@router.post("/chat", summary="Chat, streamed as NDJSON (default) or one JSON", openapi_extra=request_body(OllamaChatRequest))
async def chat(request: Request):
    req = await parse_body(request, OllamaChatRequest)
    state = request.app.state.tk
    _check(req, state)
    _keep(req, state)
    model_id = state.served.id
    if req.messages is None:
        _ready(state)
        return _load_reply(state, model_id, req, chat=True)
    if not req.messages:
        raise ApiError(400, "messages must not be empty")
    if any(m.images for m in req.messages):
        raise ApiError(400, "images are not supported by this model")
    max_tokens, options = _options(req)
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    tools = req.tools or None
    names = {t.get("function", {}).get("name") for t in tools or ()}

    def prepare(model) -> Prepared:
        check_constraint(model, options)
        _check_think(req, model_id, model.chat_template)
        if tools and tool_format(model.chat_template) is None:
            raise ApiError(400, f'registry.ollama.ai/library/{model_id} does not support tools')
        opts = dict(options, stop=model.chat_stops(options.get("stop")))
        ids = model.chat_ids(template_messages(messages), tools)
        return Prepared(ids, _fit(model, ids, max_tokens, req), opts)

    job = await start_job(request, prepare)

    def final(stats) -> dict:
        return _final(job, stats)

    def message(text: str) -> dict:
        content, calls = parse_tool_calls(text, names) if names else (text, [])
        out = {"role": "assistant", "content": content if calls else text}
        if calls:
            out["tool_calls"] = [{"function": {"index": i, "name": c.name, "arguments": c.arguments}}
                                 for i, c in enumerate(calls)]
        return out

    if not req.stream or tools:  # a reply that may hold calls is parsed whole (one record, then the last)
        text, stats, _ = await collect(request, job)
        if not req.stream:
            return OllamaJSON({"model": model_id, "created_at": created_at(), "message": message(text),
                               "done": True, **final(stats)})
        head = {"model": model_id, "created_at": created_at()}
        lines = [go_dumps({**head, "message": message(text), "done": False}),
                 go_dumps({**head, "message": {"role": "assistant", "content": ""}, "done": True, **final(stats)})]
        return Response("".join(line + "\n" for line in lines), media_type="application/x-ndjson")
    return _stream(job, model_id, lambda text: {"message": {"role": "assistant", "content": text}}, final)


@router.post("/generate", summary="Completion, streamed as NDJSON (default) or one JSON",
             openapi_extra=request_body(OllamaGenerateRequest))
async def generate(request: Request):
    req = await parse_body(request, OllamaGenerateRequest)
    state = request.app.state.tk
    _check(req, state)
    _keep(req, state)
    model_id = state.served.id
    if req.images:
        raise ApiError(400, "images are not supported by this model")
    for name in ("template", "suffix"):
        if getattr(req, name):
            raise ApiError(400, f"'{name}' is not supported")
    if not req.prompt:
        _ready(state)
        return _load_reply(state, model_id, req, chat=False)
    max_tokens, options = _options(req)
    context = list(req.context or [])

    def prepare(model) -> Prepared:
        check_constraint(model, options)
        _check_think(req, model_id, model.chat_template)
        vocab = model.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in context):
            raise ApiError(400, f"'context' token ids must be in [0, {vocab})")
        if req.raw or not model.chat_template:
            text = req.prompt if req.raw or not req.system else f"{req.system}\n\n{req.prompt}"
            ids = model.tokenize(text, add_bos=not context)
        else:
            messages = ([{"role": "system", "content": req.system}] if req.system else [])
            ids = model.chat_ids(messages + [{"role": "user", "content": req.prompt}])
            if context and ids and ids[0] == model.tokenizer.bos_id:
                ids = ids[1:]
        return Prepared(context + ids, _fit(model, context + ids, max_tokens, req), options)

    job = await start_job(request, prepare)

    def final(stats) -> dict:
        out = _final(job, stats)
        out = {"done_reason": out.pop("done_reason"), "context": job.prompt + stats.ids, **out}
        return out

    if not req.stream:
        text, stats, _ = await collect(request, job)
        return OllamaJSON({"model": model_id, "created_at": created_at(), "response": text, "done": True,
                           **final(stats)})
    return _stream(job, model_id, lambda text: {"response": text}, final)


def _listing(served, digest: str) -> dict:
    return {"name": served.id, "model": served.id, "modified_at": served.modified_at(), "size": served.size,
            "digest": digest, "details": served.details()}


@router.get("/tags", summary="The served model, as Ollama lists local models")
async def tags(request: Request):
    served = request.app.state.tk.served
    digest = await anyio.to_thread.run_sync(served.digest)
    return OllamaJSON({"models": [_listing(served, digest)]})


@router.get("/ps", summary="The loaded model")
async def ps(request: Request):
    state = request.app.state.tk
    if state.scheduler.state != "ready" or not state.scheduler.loaded:
        return OllamaJSON({"models": []})
    served = state.served
    digest = await anyio.to_thread.run_sync(served.digest)
    entry = _listing(served, digest)
    del entry["modified_at"]
    left = state.scheduler.expires_in()  # None: kept loaded until the server stops
    expires = datetime.now(timezone.utc).astimezone() + timedelta(days=365 * 100 if left is None else 0,
                                                                  seconds=left or 0)
    entry.update(expires_at=expires.isoformat(), size_vram=0, context_length=served.context_length,
                 kv_cache_type=served.kv, kv_auto=served.kv_auto, cpu_kernels=library.summary(),  # ours
                 prefix_cache=state.scheduler.prefix_stats(), batch_size=state.scheduler.batch_size,
                 parallel=state.scheduler.parallel)
    return OllamaJSON({"models": [entry]})


@router.post("/show", summary="Model details and GGUF metadata", openapi_extra=request_body(OllamaShowRequest))
async def show(request: Request):
    req = await parse_body(request, OllamaShowRequest)
    state = request.app.state.tk
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    if not state.served.knows(name):
        raise ApiError(404, f'model "{name}" not found')
    _ready(state)
    served = state.served
    info = {k: _plain(v, req.verbose) for k, v in served.metadata.items() if k != "tokenizer.chat_template"}
    info["general.parameter_count"] = served.n_params
    return OllamaJSON({
        "modelfile": f"# Modelfile generated by tightkv\nFROM {served.path}\n",
        "parameters": "",
        "template": served.chat_template or "{{ .Prompt }}",
        "details": served.details(),
        "model_info": info,
        "capabilities": ["completion"] + (["tools"] if tool_format(served.chat_template) else []),
        "modified_at": served.modified_at(),
        "tightkv": {"kv_cache_type": served.kv, "context_length": served.context_length, "kv_auto": served.kv_auto},
    })


def _plain(value, verbose: bool):
    """A metadata value as JSON; long arrays (the vocabulary) only when verbose, as Ollama does."""
    import numpy as np

    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple)):
        if len(value) > 64 and not verbose:
            return None
        return [_plain(v, verbose) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


OLLAMA_VERSION = "0.12.0"  # the Ollama API these routes follow: clients gate features on this number


@router.get("/version", summary="The Ollama version these routes follow (ours under 'tightkv')")
async def version():
    return OllamaJSON({"version": OLLAMA_VERSION, "tightkv": __version__})


@router.post("/embed", summary="501: the served model is not an embedding model")
@router.post("/embeddings", summary="501: the served model is not an embedding model (older route)")
async def embed(request: Request):
    from .openai import EMBED_HINT

    raise ApiError(501, EMBED_HINT.format(model=request.app.state.tk.served.id))


@router.post("/pull", summary="Pull a model into the store, streaming progress as NDJSON (Ollama's records)",
             openapi_extra=request_body(OllamaPullRequest))
async def pull(request: Request):
    import asyncio

    from ..registry import pull_model

    req = await parse_body(request, OllamaPullRequest)
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def report(status: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, status)

    def work() -> None:
        try:
            if request.app.state.tk.served.knows(name):  # the served model is here already
                report({"status": "pulling manifest"})
                report({"status": "success"})
            else:
                pull_model(name, quiet=True, report=report)
        except Exception as err:  # noqa: BLE001 - the client gets the error as Ollama sends it
            answer = as_api_error(err)
            report({"error": answer.message, "code": answer.status})
        report({"end": True})

    task = asyncio.create_task(anyio.to_thread.run_sync(work))

    async def records():
        last = None
        while True:
            status = await queue.get()
            if "end" in status:
                break
            if status.get("completed") is not None and last is not None and status["completed"] < last + 2**20 \
                    and status["completed"] != status.get("total"):
                continue  # about one record per MiB
            last = status.get("completed", last)
            yield status
        await task

    if req.stream is False:
        final = [s async for s in records()]
        err = next((s for s in final if "error" in s), None)
        if err:
            raise ApiError(err["code"], err["error"])
        return OllamaJSON(final[-1] if final else {"status": "success"})

    async def ndjson():
        async for status in records():
            status.pop("code", None)
            yield go_dumps(status) + "\n"

    return StreamingResponse(ndjson(), media_type="application/x-ndjson")


@router.delete("/delete", summary="Remove a pulled model from the store", openapi_extra=request_body(OllamaPullRequest))
async def delete(request: Request):
    from ..errors import TightKVError
    from ..registry import remove

    req = await parse_body(request, OllamaPullRequest)
    name = req.model or req.name
    if not name:
        raise ApiError(400, "model is required")
    if request.app.state.tk.served.knows(name):
        raise ApiError(400, f'model "{name}" is the one this server serves; stop the server to delete it')
    try:
        await anyio.to_thread.run_sync(remove, [name])
    except TightKVError as err:
        raise ApiError(404, f'model "{name}" not found' if "not found" in str(err) else str(err)) from None
    return Response(status_code=200)
