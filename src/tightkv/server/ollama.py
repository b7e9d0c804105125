"""Ollama routes: /api/chat and /api/generate as NDJSON,
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
from .scheduler import DONE, ERROR, LOGPROB, PIECE
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


def _ready(state) -> None:
    if state.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})


def _options(req) -> tuple[int | None, dict]:
    o = req.options
    options = dict(DEFAULTS)
    max_tokens = None
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
        ):
            if getattr(o, name) is not None:
                options[name] = getattr(o, name)
        if o.seed is not None and o.seed >= 0:
            options["seed"] = o.seed % 2**64
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
            "load_duration": 0,
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
    _logprobs(req, options)
    think = _think(req)
    messages = [_template_message(m.model_dump(exclude_none=True)) for m in req.messages]
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
    _logprobs(req, options)
    think = _think(req)
    context, budget = list(req.context or []), _budget(req, max_tokens)
    no_thinking = f'"{model_id}" does not support thinking'
    if req.raw or not state.served.chat_template:  # the prompt as it is
        text = req.prompt if req.raw or not req.system else f"{req.system}\n\n{req.prompt}"
        job_request = TextRequest(
            text, budget, options, context=context, think=think, no_thinking=no_thinking, split_reasoning=True
        )
    else:
        messages = [{"role": "system", "content": req.system}] if req.system else []
        messages.append({"role": "user", "content": req.prompt})
        job_request = ChatRequest(
            messages, budget, options, think=think, effort=_effort(req), context=context, no_thinking=no_thinking
        )
    answer = Answer(await start_job(request, job_request), model_id, False)
    return await answer.whole(request) if not req.stream else answer.stream()


def _listing(served, digest: str) -> dict:
    return {
        "name": served.id,
        "model": served.id,
        "modified_at": served.modified_at(),
        "size": served.size,
        "digest": digest,
        "details": served.details(),
    }


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
    expires = datetime.now(timezone.utc).astimezone() + timedelta(
        days=365 * 100 if left is None else 0, seconds=left or 0
    )
    entry.update(
        expires_at=expires.isoformat(),
        size_vram=0,
        context_length=served.context_length,
        kv_cache_type=served.kv,
        kv_auto=served.kv_auto,
        cpu_kernels=build.summary(),  # ours
        prefix_cache=state.scheduler.prefix_stats(),
        batch_size=state.scheduler.batch_size,
        parallel=state.scheduler.parallel,
    )
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
    return OllamaJSON(
        {
            "modelfile": f"# Modelfile generated by tightkv\nFROM {served.path}\n",
            "parameters": "",
            "template": served.chat_template or "{{ .Prompt }}",
            "details": served.details(),
            "model_info": info,
            "capabilities": (
                ["completion"]
                + (["tools"] if tool_format(served.chat_template) else [])
                + (["thinking"] if thinks(served.chat_template) else [])
            ),
            "modified_at": served.modified_at(),
            "tightkv": {
                "kv_cache_type": served.kv,
                "context_length": served.context_length,
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
