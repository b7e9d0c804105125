"""Embeddings from the model a request names (`engine.embed`: the final hidden states
pooled as the GGUF says, else their mean, L2-normalized), run as a `Task` on the
scheduler's worker thread, which owns the model:

    POST /v1/embeddings    OpenAI: `input` text, token ids or a list of either; `encoding_format`
                           float or base64; `dimensions` only the model's own; over the context a 400
    POST /api/embed        Ollama: `input` text or texts -> `embeddings`; `truncate` (default true)
                           cuts an input over the context, false makes it a 400; `dimensions` shortens
    POST /api/embeddings   Ollama's older route: `prompt` -> `embedding`, not normalized (as Ollama)
"""

from __future__ import annotations

import base64
import time

import numpy as np
from fastapi import APIRouter, Request

from ..engine.embed import Embeddings, embed
from .http import ApiError, OllamaJSON, parse_body, request_body, run_task
from .ollama import keep_alive_seconds
from .schemas import EmbeddingRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest

router = APIRouter(tags=["Embeddings"])
MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


async def run_embed(request: Request, picked, inputs: list, **options) -> tuple[Embeddings, float]:
    """`engine.embed.embed(model, inputs, **options)` on the worker of the picked model; the
    client going away cancels it. Returns the result and the seconds spent loading the model
    first (0 when it was loaded)."""
    submitted, was_loaded = time.perf_counter(), picked.scheduler.loaded

    def work(model, pause) -> tuple[Embeddings, float]:
        loading = 0.0 if was_loaded else time.perf_counter() - submitted
        return embed(model, inputs, pause=pause, **options), loading

    return await run_task(picked.scheduler, work, request)


# --- OpenAI -----------------------------------------------------------------------------
def _openai_inputs(value) -> list:
    """The inputs of an OpenAI request: one text or token list, or a list of them."""
    items = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
    if not items:
        raise ApiError(400, "'input' must not be empty", param="input")
    if len(items) > MAX_INPUTS:
        raise ApiError(400, f"'input' may hold at most {MAX_INPUTS} inputs, got {len(items)}", param="input")
    for i, item in enumerate(items):
        if not item:
            where = "input" if len(items) == 1 else f"input.{i}"
            raise ApiError(400, f"'{where}' must not be empty", param=where)
    return items


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or its float32 bytes (little-endian) in base64."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


@router.post(
    "/v1/embeddings",
    openapi_extra=request_body(EmbeddingRequest),
    summary="Embeddings of texts or token ids (OpenAI): a vector each, normalized",
)
async def openai_embeddings(request: Request):
    req = await parse_body(request, EmbeddingRequest)
    picked = request.app.state.tk.pick(req.model)
    inputs = _openai_inputs(req.input)
    result, _ = await run_embed(request, picked, inputs, dimensions=req.dimensions)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
        for i, v in enumerate(result.vectors)
    ]
    n = result.total_tokens
    return {
        "object": "list",
        "data": data,
        "model": picked.served.id,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }


# --- Ollama -----------------------------------------------------------------------------
def _ollama_start(request: Request, req):
    """The picked model for an Ollama request, its keep_alive applied."""
    picked = request.app.state.tk.pick(req.model)
    if req.keep_alive is not None:
        picked.scheduler.set_keep_alive(keep_alive_seconds(req.keep_alive))
    return picked


def _load_only(picked, req) -> None:
    """What Ollama does for a request with nothing to embed: load the model (or, keep_alive 0, let it go)."""
    if picked.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})
    if req.keep_alive is None or keep_alive_seconds(req.keep_alive) != 0:
        picked.scheduler.load()


def _num_ctx(req) -> int | None:
    n = req.options.num_ctx if req.options else None
    return n if n is not None and n > 0 else None


@router.post(
    "/api/embed",
    openapi_extra=request_body(OllamaEmbedRequest),
    summary="Embeddings of a text or texts (Ollama), normalized",
)
async def ollama_embed(request: Request):
    started = time.perf_counter()
    req = await parse_body(request, OllamaEmbedRequest)
    picked = _ollama_start(request, req)
    inputs = [req.input] if isinstance(req.input, str) else list(req.input or [])
    inputs = [x for x in inputs if x or len(inputs) > 1]  # "" alone: nothing to embed
    if not inputs:
        _load_only(picked, req)
        return OllamaJSON({"model": req.model, "embeddings": []})
    result, loading = await run_embed(
        request, picked, inputs, limit=_num_ctx(req), truncate=req.truncate, dimensions=req.dimensions, shorten=True
    )
    return OllamaJSON(
        {
            "model": req.model,
            "embeddings": result.vectors,
            "total_duration": int((time.perf_counter() - started) * 1e9),
            "load_duration": int(loading * 1e9),
            "prompt_eval_count": result.total_tokens,
        }
    )


@router.post(
    "/api/embeddings",
    openapi_extra=request_body(OllamaEmbeddingsRequest),
    summary="The embedding of a prompt (Ollama's older route): not normalized, as Ollama's",
)
async def ollama_embeddings(request: Request):
    req = await parse_body(request, OllamaEmbeddingsRequest)
    picked = _ollama_start(request, req)
    if not req.prompt:
        _load_only(picked, req)
        return OllamaJSON({"embedding": []})
    result, _ = await run_embed(request, picked, [req.prompt], limit=_num_ctx(req), normalize=False)
    return OllamaJSON({"embedding": result.vectors[0]})
