"""Ollama routes: /api/chat and /api/generate as NDJSON, /api/tags (the models served),
/api/ps (those loaded), /api/show, /api/create, /api/pull, /api/delete, /api/version; a
request's `model` picks the model (`ServerState.pick`). Errors are `{"error": "..."}`;
an error after the stream started is a last NDJSON line `{"error": "..."}`."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import anyio
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from .. import __version__
from ..kernels import build
from .http import (
    ApiError,
    JobStream,
    OllamaJSON,
    as_api_error,
    collect,
    events,
    finite,
    go_dumps,
    parse_body,
    request_body,
    start_job,
    stop_list,
)
from ..engine.reasoning import thinks
from ..engine.requests import Budget, ChatRequest, TextRequest
from ..engine.tools import tool_format
from .outputs import constraint_options, ollama_logprobs
from .replies import Delta, new_reply, ollama_calls
from ..modelfile import Modelfile, sampling_defaults, with_system
from .scheduler import DONE, ERROR, LOGPROB, PIECE
from .schemas import (
    OllamaChatRequest,
    OllamaCreateRequest,
    OllamaGenerateRequest,
    OllamaPullRequest,
    OllamaShowRequest,
)

router = APIRouter(prefix="/api", tags=["Ollama"])

# Ollama's sampling defaults (api/types.go DefaultOptions)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1}


def created_at() -> str:
    """RFC 3339 with fractional seconds in UTC, as Go's time.Time marshals."""
    now = datetime.now(timezone.utc)
    frac = f"{now.microsecond:06d}".rstrip("0")
    return now.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def _check(req, state):
    """The model the request names (`ServerState.pick`)."""
    if not req.model:
        raise ApiError(400, "model is required")
    return _named(state, req.model)


async def _described(picked) -> None:
    """The model's chat template is known (read from its header if it is not loaded yet)."""
    from .pool import described

    try:
        await described(picked)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - its pull's or load's error, in Ollama's shape
        raise as_api_error(err) from None


def _named(state, name: str):
    """`ServerState.pick(name)`, its 404 in Ollama's words."""
    try:
        return state.pick(name)
    except ApiError as err:
        raise ApiError(404, f'model "{name}" not found, try pulling it first') if err.status == 404 else err


THINK_LEVELS = ("high", "medium", "low", "max")


def _effort(req) -> str | None:
    """Ollama's `think` level ("high", "medium", "low", "max"), the template's reasoning
    effort (gpt-oss reads it); None for a boolean."""
    return req.think if isinstance(req.think, str) else None


def _think(req) -> bool | None:
    """Ollama's `think`: a boolean, or a level (which means true); None when not given."""
    if req.think is None or isinstance(req.think, bool):
        return req.think
    if req.think not in THINK_LEVELS:
        raise ApiError(
            400, f'invalid think value: "{req.think}" (must be "high", "medium", "low", "max", true, or false)'
        )
    return True


def _logprobs(req, options: dict) -> None:
    """Ollama's `logprobs` and `top_logprobs` (0-20) into the generation options."""
    top = req.top_logprobs or 0
    if not 0 <= top <= 20:
        raise ApiError(400, "top_logprobs must be between 0 and 20")
    if req.logprobs:
        options["logprobs"] = top


def _ready(picked) -> None:
    if picked.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})


def _options(req, served=None) -> tuple[int | None, dict]:
    """max_tokens and the generation options: Ollama's defaults, the model's Modelfile
    PARAMETERs over them, the request's `options` over those."""
    o = req.options
    params = served.parameters if served is not None else {}
    options = {**DEFAULTS, **sampling_defaults(params)}
    max_tokens = params.get("num_predict") if params.get("num_predict", -1) >= 0 else None
    if o is not None:
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            finite(getattr(o, name), name)
        for name in (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "repeat_last_n",
            "spec_type",
            "draft_max",
            "draft_min",
        ):
            if getattr(o, name) is not None:
                options[name] = getattr(o, name)
        if o.seed is not None and o.seed >= 0:
            options["seed"] = o.seed % 2**64
        if o.stop is not None:
            options["stop"] = stop_list(o.stop)
        if o.num_predict is not None and o.num_predict >= 0:
            max_tokens = o.num_predict
    options.update(constraint_options(ollama_format=req.format))
    return max_tokens, options


def _budget(req, max_tokens: int | None) -> Budget:
    """Ollama's budget: `num_predict` caps the reply, and generation stops at the end of the
    context ("length"), which is `num_ctx` when the request gives one below the server's
    context; a prompt that does not fit is still an error, never truncated."""
    return Budget(max_tokens, req.options.num_ctx if req.options else None, fit=True)


def _final(job, stats, logprobs: list | None = None, context: list[int] | None = None) -> dict:
    """The fields of Ollama's last record after `done`: the reason, the logprobs still to
    send (chat) or the context (generate), and the durations in nanoseconds."""
    total = time.perf_counter() - job.created
    out = {"done_reason": stats.finish_reason}
    if context is not None:
        out["context"] = context
    elif logprobs:
        out["logprobs"] = logprobs
    out.update(
        {
            "total_duration": int(total * 1e9),
            "load_duration": int(job.load_seconds * 1e9),
            "prompt_eval_count": stats.prompt_tokens - stats.cached_tokens,  # evaluated: the stored prefix is not
            "prompt_eval_duration": int(stats.prompt_seconds * 1e9),
            "eval_count": stats.generated_tokens,
            "eval_duration": int(stats.generation_seconds * 1e9),
        }
    )
    if context is not None and logprobs:
        out["logprobs"] = logprobs
    return out


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "0");
    negative means forever (None)."""
    import re

    if isinstance(value, bool):
        raise ApiError(400, 'invalid keep_alive: a number of seconds or a duration like "5m"')
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ApiError(400, "invalid keep_alive: not a finite number")
        seconds = float(value)
    else:
        text = value.strip()
        parts = re.fullmatch(r"-?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+|-?\d+", text)
        if not parts:
            raise ApiError(400, f'invalid keep_alive {value!r}: a number of seconds or a duration like "5m"')
        if re.fullmatch(r"-?\d+", text):
            seconds = float(text)
        else:
            seconds = sum(
                float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
            )
            seconds = -seconds if text.startswith("-") else seconds
    return None if seconds < 0 else seconds


def _keep(req, picked) -> None:
    if req.keep_alive is not None:
        picked.scheduler.set_keep_alive(keep_alive_seconds(req.keep_alive))


async def _load_reply(picked, model_id: str, req, chat: bool) -> OllamaJSON:
    """Ollama answers a request without a prompt by loading the model (answering once it
    is loaded) or, keep_alive 0, unloading it."""
    from .pool import ensure_loaded

    _ready(picked)
    reason = "unload" if req.keep_alive is not None and keep_alive_seconds(req.keep_alive) == 0 else "load"
    if reason == "load":
        try:
            await ensure_loaded(picked)
        except Exception as err:  # noqa: BLE001 - its load's error, in Ollama's shape
            raise as_api_error(err) from None
    body = {"model": model_id, "created_at": created_at()}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    body.update(done=True, done_reason=reason)
    return OllamaJSON(body)


class Answer:
    """How one chat or generate request answers: the `Reply` its text is read through, the
    record fields a piece of it makes (`message` for chat, `response` for generate), and its
    logprobs in Ollama's shape."""

    def __init__(self, job, model_id: str, chat: bool):
        self.job, self.model_id, self.chat = job, model_id, chat
        prep = job.prepared
        self.reply = new_reply(prep.tool_names, prep.template, prep.text, prep.split)
        self.tokenizer = prep.tokenizer

    def fields(self, delta: Delta) -> dict:
        if not self.chat:
            return {"response": delta.content, **({"thinking": delta.reasoning} if delta.reasoning else {})}
        message = {"role": "assistant", "content": delta.content}
        if delta.reasoning:
            message["thinking"] = delta.reasoning
        if delta.done:
            message["tool_calls"] = ollama_calls(delta.done)
        return {"message": message}

    def logprobs(self, lps: list) -> list | None:
        return ollama_logprobs(self.tokenizer, lps) if lps else None

    def final(self, stats, lps: list) -> dict:
        context = None if self.chat else self.job.prompt + stats.ids
        return _final(self.job, stats, self.logprobs(lps), context)

    def record(self, fields: dict, done: bool, tail: dict | None = None) -> str:
        return (
            go_dumps({"model": self.model_id, "created_at": created_at(), **fields, "done": done, **(tail or {})})
            + "\n"
        )

    async def whole(self, request: Request) -> OllamaJSON:
        text, stats, lps = await collect(request, self.job)
        reply = self.reply.whole(text)
        delta = Delta(reasoning=reply.reasoning, content=reply.content, done=reply.complete_calls())
        return OllamaJSON(
            {
                "model": self.model_id,
                "created_at": created_at(),
                **self.fields(delta),
                "done": True,
                **self.final(stats, lps),
            }
        )

    def stream(self) -> JobStream:
        async def ndjson():
            held = []  # logprobs of tokens whose text is not out yet
            async for kind, value in events(self.job):
                if kind == LOGPROB:
                    held.append(value)
                elif kind == PIECE:
                    delta = self.reply.feed(value)
                    if delta:
                        lp = self.logprobs(held)
                        yield self.record(self.fields(delta), False, {"logprobs": lp} if lp else None)
                        held = []
                elif kind == DONE:
                    delta = self.reply.finish()
                    if delta:
                        yield self.record(self.fields(delta), False)
                    yield self.record(self.fields(Delta()), True, self.final(value, held))
                elif kind == ERROR:
                    yield go_dumps({"error": as_api_error(value).message}) + "\n"

        return JobStream(self.job, ndjson(), "application/x-ndjson")


@router.post(
    "/chat", summary="Chat, streamed as NDJSON (default) or one JSON", openapi_extra=request_body(OllamaChatRequest)
)
async def chat(request: Request):
    req = await parse_body(request, OllamaChatRequest)
    picked = _check(req, request.app.state.tk)
    _keep(req, picked)
    model_id = picked.served.id
    if req.messages is None:
        return await _load_reply(picked, model_id, req, chat=True)
    if not req.messages:
        raise ApiError(400, "messages must not be empty")
    if any(m.images for m in req.messages):
        raise ApiError(400, "images are not supported by this model")
    max_tokens, options = _options(req, picked.served)
    _logprobs(req, options)
    think = _think(req)
    messages = [_template_message(m.model_dump(exclude_none=True)) for m in req.messages]
    messages = with_system(messages, picked.served.system)
    job_request = ChatRequest(
        messages,
        _budget(req, max_tokens),
        options,
        tools=req.tools or None,
        think=think,
        effort=_effort(req),
        no_tools=f"registry.ollama.ai/library/{model_id} does not support tools",
        no_thinking=f'"{model_id}" does not support thinking',
    )
    answer = Answer(await start_job(request, job_request), model_id, True)
    return await answer.whole(request) if not req.stream else answer.stream()


def _template_message(m: dict) -> dict:
    """An Ollama message as chat templates read it: its `thinking` as `reasoning_content`."""
    if "thinking" in m:
        m["reasoning_content"] = m.pop("thinking")
    return m


@router.post(
    "/generate",
    summary="Completion, streamed as NDJSON (default) or one JSON",
    openapi_extra=request_body(OllamaGenerateRequest),
)
async def generate(request: Request):
    req = await parse_body(request, OllamaGenerateRequest)
    picked = _check(req, request.app.state.tk)
    _keep(req, picked)
    model_id = picked.served.id
    if req.images:
        raise ApiError(400, "images are not supported by this model")
    for name in ("template", "suffix"):
        if getattr(req, name):
            raise ApiError(400, f"'{name}' is not supported")
    if not req.prompt:
        return await _load_reply(picked, model_id, req, chat=False)
    max_tokens, options = _options(req, picked.served)
    system = req.system if req.system is not None else picked.served.system
    await _described(picked)
    _logprobs(req, options)
    think = _think(req)
    context, budget = list(req.context or []), _budget(req, max_tokens)
    no_thinking = f'"{model_id}" does not support thinking'
    if req.raw or not picked.served.chat_template:  # the prompt as it is
        text = req.prompt if req.raw or not system else f"{system}\n\n{req.prompt}"
        job_request = TextRequest(
            text, budget, options, context=context, think=think, no_thinking=no_thinking, split_reasoning=True
        )
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": req.prompt})
        job_request = ChatRequest(
            messages, budget, options, think=think, effort=_effort(req), context=context, no_thinking=no_thinking
        )
    answer = Answer(await start_job(request, job_request), model_id, False)
    return await answer.whole(request) if not req.stream else answer.stream()


def _listing(served) -> dict:
    return {
        "name": served.id,
        "model": served.id,
        "modified_at": served.modified_at(),
        "size": served.size,
        "digest": served.digest(),
        "details": served.details(),
    }


def _listings(models: list) -> list[dict]:
    """Ollama's records of models (their headers read, digests computed where not known)."""
    for served in models:
        served.read_header()
    return [_listing(served) for served in models]


@router.get("/tags", summary="The models this server serves, as Ollama lists local models")
async def tags(request: Request):
    models = request.app.state.tk.store_models()
    return OllamaJSON({"models": await anyio.to_thread.run_sync(_listings, models)})


@router.get("/ps", summary="The models loaded now")
async def ps(request: Request):
    state = request.app.state.tk
    loaded = [r for r in state.pool.all() if r.scheduler.state == "ready" and r.scheduler.loaded]
    entries = await anyio.to_thread.run_sync(_listings, [r.served for r in loaded])
    for r, entry in zip(loaded, entries):
        del entry["modified_at"]
        left = r.scheduler.expires_in()  # None: kept loaded until the server stops
        expires = datetime.now(timezone.utc).astimezone() + timedelta(
            days=365 * 100 if left is None else 0, seconds=min(left or 0, 1e9)
        )
        entry.update(
            size=r.footprint or r.served.size,  # what it holds: weights, buffers, its KV cache at its context
            expires_at=expires.isoformat(),
            size_vram=0,
            context_length=r.served.context_length,
            kv_cache_type=r.served.kv,
            kv_auto=r.served.kv_auto,
            pinned=r.pinned,  # ours: `tightkv serve MODEL` keeps it
            cpu_kernels=build.summary(),  # ours
            prefix_cache=r.scheduler.prefix_stats(),
            batch_size=r.scheduler.batch_size,
            parallel=r.scheduler.parallel,
        )
    return OllamaJSON({"models": entries})


def _model_name(req) -> str:
    """The model a body names (`model`, or Ollama's older `name`); a 400 without one."""
    if not (name := req.model or req.name):
        raise ApiError(400, "model is required")
    return name


@router.post(
    "/show", summary="Model details, Modelfile and GGUF metadata", openapi_extra=request_body(OllamaShowRequest)
)
async def show(request: Request):
    req = await parse_body(request, OllamaShowRequest)
    name = _model_name(req)
    picked = _named(request.app.state.tk, name)
    served = picked.served
    if served.path is None:  # a registry model not pulled yet
        raise ApiError(404, f'model "{name}" not found, try pulling it first')
    await anyio.to_thread.run_sync(served.read_header)
    info = {k: _plain(v, req.verbose) for k, v in served.metadata.items() if k != "tokenizer.chat_template"}
    info["general.parameter_count"] = served.n_params
    defaults = Modelfile(str(served.path), served.parameters, served.system)
    return OllamaJSON(
        {
            "modelfile": f"# Modelfile generated by tightkv\n# FROM {served.id}\n" + defaults.text(),
            "parameters": "\n".join(
                line.removeprefix("PARAMETER ")
                for line in defaults.text().splitlines()
                if line.startswith("PARAMETER ")
            ),
            "template": served.chat_template or "{{ .Prompt }}",
            **({"system": served.system} if served.system else {}),
            "details": served.details(),
            "model_info": info,
            "capabilities": (
                ["completion"]
                + (["tools"] if tool_format(served.chat_template) else [])
                + (["thinking"] if thinks(served.chat_template) else [])
            ),
            "modified_at": served.modified_at(),
            "tightkv": {
                "kv_cache_type": served.kv or served.parameters.get("kv_cache_type"),
                "context_length": served.context_length or served.parameters.get("num_ctx"),
                "loaded": picked.scheduler.loaded,
                "kv_auto": served.kv_auto,
                "chat_template": bool(served.chat_template),  # False: a base model (the web page continues text)
            },
        }
    )


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


@router.post(
    "/pull",
    summary="Pull a model into the store, streaming progress as NDJSON (Ollama's records)",
    openapi_extra=request_body(OllamaPullRequest),
)
async def pull(request: Request):
    from ..registry import pull_model

    req = await parse_body(request, OllamaPullRequest)
    name = _model_name(req)
    state = request.app.state.tk

    def work(report) -> None:
        if _in_store(state, name):  # here already (a served file, or a created model)
            report({"status": "pulling manifest"})
            report({"status": "success"})
        else:
            pull_model(name, quiet=True, report=report)

    return await _status_answer(work, req.stream)


def _in_store(state, name: str) -> bool:
    from ..registry import find_created

    found = state.pool.find(name)
    return (found is not None and found.served.path is not None) or find_created(name) is not None


async def _status_answer(work, stream: bool):
    """Run `work(report)` in a thread and answer its status records as Ollama does: NDJSON
    lines (an error as a last `{"error"}` line), or, not streamed, the last record (an error
    as its status)."""
    import asyncio

    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def report(status: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, status)

    def run() -> None:
        try:
            work(report)
        except Exception as err:  # noqa: BLE001 - the client gets the error as Ollama sends it
            answer = as_api_error(err)
            report({"error": answer.message, "code": answer.status})
        report({"end": True})

    task = asyncio.create_task(anyio.to_thread.run_sync(run))

    async def records():
        last = None
        while True:
            status = await queue.get()
            if "end" in status:
                break
            if (
                status.get("completed") is not None
                and last is not None
                and status["completed"] < last + 2**20
                and status["completed"] != status.get("total")
            ):
                continue  # about one record per MiB
            last = status.get("completed", last)
            yield status
        await task

    if stream is False:
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


@router.post(
    "/create",
    summary="Create a named model from another (or a .gguf path) with its own defaults, streaming status as NDJSON",
    openapi_extra=request_body(OllamaCreateRequest),
)
async def create(request: Request):
    from ..errors import TightKVError
    from ..modelfile import Modelfile, add_parameter, parse
    from ..registry import create_model

    req = await parse_body(request, OllamaCreateRequest)
    name = _model_name(req)
    for field in ("files", "adapters", "quantize", "messages"):
        if getattr(req, field, None):
            raise ApiError(400, f"'{field}' is not supported: create from a model ('from'), with parameters and system")
    try:
        modelfile = parse(req.modelfile) if req.modelfile else Modelfile(req.from_ or "")
        for key, value in (req.parameters or {}).items():
            add_parameter(modelfile.parameters, key, value, "parameters")
    except TightKVError as err:
        raise ApiError(400, str(err)) from None
    modelfile.base = req.from_ or modelfile.base
    if not modelfile.base:
        raise ApiError(400, "'from' is required: a model name, or a .gguf path on the server")
    modelfile.system = req.system if req.system is not None else modelfile.system
    modelfile.template = req.template if req.template is not None else modelfile.template
    state = request.app.state.tk

    def work(report) -> None:
        create_model(name, modelfile, report=report)
        state.forget(name)  # a resident of that name (made before) serves the new defaults from now on

    return await _status_answer(work, req.stream)


@router.delete(
    "/delete",
    summary="Remove a model from the store (200 with no body, as Ollama answers)",
    openapi_extra=request_body(OllamaPullRequest),
    response_class=Response,
)
async def delete(request: Request):
    from ..errors import TightKVError
    from ..registry import remove

    req = await parse_body(request, OllamaPullRequest)
    name = _model_name(req)
    state = request.app.state.tk
    found = state.pool.find(name)
    if found is not None and found.pinned:
        raise ApiError(400, f'model "{name}" is the one this server serves; stop the server to delete it')
    if found is not None and not found.scheduler.idle():
        raise ApiError(400, f'model "{name}" is answering a request; delete it once it is done')
    try:
        await anyio.to_thread.run_sync(remove, [name])
    except TightKVError as err:
        raise ApiError(404, f'model "{name}" not found' if "not found" in str(err) else str(err)) from None
    state.forget(name)
    return Response(status_code=200)
