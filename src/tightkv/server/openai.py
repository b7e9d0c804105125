"""OpenAI routes as llama.cpp's server and vLLM implement them (CONVENTIONS B2):
/v1/chat/completions, /v1/completions, /v1/models."""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .common import (ApiError, JobStream, as_api_error, collect, dumps, events, finite, parse_body, request_body,
                     start_job, stop_list)
from .scheduler import DONE, ERROR, PIECE, Prepared
from .schemas import ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1", tags=["OpenAI"])



def _options(req) -> tuple[int | None, dict]:
    """max_tokens and `Model.generate` options from an OpenAI request; unsupported fields are a 400."""
    if req.n not in (None, 1):
        raise ApiError(400, "'n' must be 1: one choice per request", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise ApiError(400, f"'{name}' is not supported (use 'repeat_penalty')", param=name)
    if req.logprobs:
        raise ApiError(400, "'logprobs' is not supported", param="logprobs")
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
        finite(getattr(req, name), name)
    seed = req.seed
    options = {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": req.top_k or 0,
        "min_p": req.min_p or 0.0,
        "repeat_penalty": 1.0 if req.repeat_penalty is None else req.repeat_penalty,
        "seed": None if seed is None or seed < 0 else seed % 2**64,
        "stop": stop_list(req.stop),
    }
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return max_tokens, options


def _usage(stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


@router.post("/chat/completions", summary="Chat completion, streamed as SSE or one JSON",
             openapi_extra=request_body(ChatCompletionRequest))
async def chat_completions(request: Request):
    req = await parse_body(request, ChatCompletionRequest)
    state = request.app.state.tk
    state.check_model(req.model)
    if not req.messages:
        raise ApiError(400, "'messages' must not be empty", param="messages")
    for i, m in enumerate(req.messages):
        if m.content is None and m.role != "assistant":
            raise ApiError(400, f"'messages.{i}.content' is required", param=f"messages.{i}.content")
    if req.tools:
        raise ApiError(400, "'tools' is not supported", param="tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise ApiError(400, "only response_format {'type': 'text'} is supported", param="response_format")
    max_tokens, options = _options(req)
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
                for m in req.messages]

    def prepare(model) -> Prepared:
        opts = dict(options, stop=model.chat_stops(options["stop"]))
        return Prepared(model.chat_ids(messages), max_tokens, opts)

    job = await start_job(request, prepare)
    cid, created, model_id = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), state.served.id
    if not req.stream:
        text, stats = await collect(request, job)
        return JSONResponse({
            "id": cid, "object": "chat.completion", "created": created, "model": model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": stats.finish_reason}],
            "usage": _usage(stats),
        })
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id}

    def chunk(delta: dict, finish: str | None = None) -> str:
        body = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return f"data: {dumps(body)}\n\n"

    async def sse():
        yield chunk({"role": "assistant", "content": ""})
        async for kind, value in events(job):
            if kind == PIECE:
                yield chunk({"content": value})
            elif kind == DONE:
                yield chunk({}, value.finish_reason)
                if include_usage:
                    yield f"data: {dumps({**head, 'choices': [], 'usage': _usage(value)})}\n\n"
            elif kind == ERROR:
                yield f"data: {dumps(as_api_error(value).body(request.url.path))}\n\n"
        yield "data: [DONE]\n\n"

    return JobStream(job, sse(), "text/event-stream")


@router.post("/completions", summary="Text completion (no chat template), streamed as SSE or one JSON",
             openapi_extra=request_body(CompletionRequest))
async def completions(request: Request):
    req = await parse_body(request, CompletionRequest)
    state = request.app.state.tk
    state.check_model(req.model)
    for name, unsupported in (("echo", req.echo), ("suffix", req.suffix), ("best_of", req.best_of not in (None, 1))):
        if unsupported:
            raise ApiError(400, f"'{name}' is not supported", param=name)
    prompt = req.prompt
    if isinstance(prompt, list):
        if not prompt:
            raise ApiError(400, "'prompt' must not be empty", param="prompt")
        if isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, "'prompt' may hold one text only", param="prompt")
            prompt = prompt[0]
    max_tokens, options = _options(req)

    def prepare(model) -> Prepared:
        if isinstance(prompt, str):
            return Prepared(model.tokenize(prompt), max_tokens, options)
        vocab = model.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError(400, f"'prompt' token ids must be in [0, {vocab})", param="prompt")
        return Prepared(list(prompt), max_tokens, options)

    job = await start_job(request, prepare)
    cid, created, model_id = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), state.served.id
    head = {"id": cid, "object": "text_completion", "created": created, "model": model_id}
    if not req.stream:
        text, stats = await collect(request, job)
        return JSONResponse({**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                  "finish_reason": stats.finish_reason}],
                             "usage": _usage(stats)})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(text: str, finish: str | None = None) -> str:
        body = {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return f"data: {dumps(body)}\n\n"

    async def sse():
        async for kind, value in events(job):
            if kind == PIECE:
                yield chunk(value)
            elif kind == DONE:
                yield chunk("", value.finish_reason)
                if include_usage:
                    yield f"data: {dumps({**head, 'choices': [], 'usage': _usage(value)})}\n\n"
            elif kind == ERROR:
                yield f"data: {dumps(as_api_error(value).body(request.url.path))}\n\n"
        yield "data: [DONE]\n\n"

    return JobStream(job, sse(), "text/event-stream")


def _model_card(served) -> dict:
    return {"id": served.id, "object": "model", "created": served.created, "owned_by": "tightkv"}


@router.get("/models", summary="The served model")
async def models(request: Request):
    return {"object": "list", "data": [_model_card(request.app.state.tk.served)]}


@router.get("/models/{model_id:path}", summary="One model by id")
async def model(model_id: str, request: Request):
    state = request.app.state.tk
    state.check_model(model_id)
    return _model_card(state.served)
