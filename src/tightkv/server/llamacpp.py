"""llama.cpp's and vLLM's tokenizer routes: /tokenize, /detokenize, /tokenizer_info (what
lm-evaluation-harness's remote tokenizer reads) and /props; and llama-server's router
routes: /models (every model, with its status), /models/load, /models/unload. A GET names
its model with `?model=`, a POST in its body; none: the default model."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..engine.requests import check_token_ids
from .http import ApiError, as_api_error, parse_body, request_body
from .pool import ensure_loaded
from .schemas import DetokenizeRequest, ModelNameRequest, TokenizeRequest

router = APIRouter(tags=["llama.cpp"])


async def _model(request: Request, name: str | None = None):
    """The loaded model `name` picks (`?model=` where not given), loading it first if need be."""
    picked = request.app.state.tk.pick(name or request.query_params.get("model"))
    if picked.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})
    try:
        await ensure_loaded(picked)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - its load's error, as the API words it
        raise as_api_error(err) from None
    model = picked.scheduler.model
    if model is None:  # unloaded again meanwhile
        raise ApiError(503, "the model is loading again", "unavailable_error", headers={"Retry-After": "2"})
    return model


@router.post(
    "/tokenize",
    summary="Token ids of a text (llama.cpp: content, add_special; vLLM: prompt, add_special_tokens)",
    openapi_extra=request_body(TokenizeRequest),
)
async def tokenize(request: Request):
    req = await parse_body(request, TokenizeRequest)
    model = await _model(request, req.model)
    text = req.content if req.content is not None else req.prompt
    if text is None:
        raise ApiError(400, "'content' (or 'prompt') is required", param="content")
    add = req.add_special if req.add_special is not None else bool(req.add_special_tokens)
    ids = model.tokenize(text, add_bos=add, special=bool(req.parse_special))
    body = {"tokens": ids, "count": len(ids), "max_model_len": model.context_length}
    if req.with_pieces:
        body["tokens"] = [{"id": i, "piece": model.tokenizer.token_bytes(i).decode("utf-8", "replace")} for i in ids]
    return body


@router.post("/detokenize", summary="Text of token ids", openapi_extra=request_body(DetokenizeRequest))
async def detokenize(request: Request):
    req = await parse_body(request, DetokenizeRequest)
    model = await _model(request, req.model)
    check_token_ids(model, req.tokens, "tokens")
    text = model.detokenize(req.tokens)
    return {"content": text, "prompt": text}  # llama.cpp's key, vLLM's key


@router.get("/tokenizer_info", summary="The tokenizer's special tokens and chat template (vLLM's shape)")
async def tokenizer_info(request: Request):
    model = await _model(request)
    tok = model.tokenizer
    return {
        "tokenizer_class": "gguf",
        "vocab_size": tok.vocab_size,
        "model_max_length": model.context_length,
        "bos_token": model.prompts.token_text(tok.bos_id) or None,
        "eos_token": model.prompts.token_text(tok.eos_id) or None,
        "pad_token": None,
        "add_bos_token": bool(tok.add_bos),
        "chat_template": model.chat_template,
    }


@router.get("/props", summary="Server properties (llama.cpp's shape)")
async def props(request: Request):
    model = await _model(request)
    picked = request.app.state.tk.picked()
    return {
        "default_generation_settings": {"n_ctx": model.context_length, "params": {}},
        "total_slots": picked.scheduler.parallel,
        "model_path": str(picked.served.path),
        "chat_template": model.chat_template or "",
        "build_info": f"tightkv {request.app.version}",
        "modalities": {"vision": False, "audio": False},
    }


def _status(resident) -> dict:
    """llama-server's status of a model: loaded, loading or unloaded (failed: its last load)."""
    sch = resident.scheduler
    if sch.loaded:
        return {"value": "loaded"}
    if sch.loading or sch.state == "loading":
        return {"value": "loading"}
    return {"value": "unloaded", **({"failed": True} if sch.load_failures or sch.state == "failed" else {})}


@router.get("/models", summary="Every model this server serves, with its status (llama-server's router)")
async def router_models(request: Request):
    state = request.app.state.tk
    residents = {r.id: r for r in state.pool.all()}
    data = []
    for served in state.store_models():
        r = residents.get(served.id)
        data.append(
            {
                "id": served.id,
                "object": "model",
                "created": served.created,
                "owned_by": "tightkv",
                "path": str(served.path),
                "status": _status(r) if r is not None else {"value": "unloaded"},
            }
        )
    return {"object": "list", "data": data}


@router.post(
    "/models/load", summary="Load a model and wait until it is loaded", openapi_extra=request_body(ModelNameRequest)
)
async def load_model(request: Request):
    req = await parse_body(request, ModelNameRequest)
    await _model(request, req.model)
    return {"success": True}


@router.post(
    "/models/unload",
    summary="Unload a model (once its requests are done)",
    openapi_extra=request_body(ModelNameRequest),
)
async def unload_model(request: Request):
    import asyncio

    req = await parse_body(request, ModelNameRequest)
    picked = request.app.state.tk.pick(req.model)
    picked.scheduler.request_unload()
    while picked.scheduler.loaded and not await request.is_disconnected():
        await asyncio.sleep(0.05)
        picked.scheduler.request_unload()  # a request that came first kept it; ask again once it is done
    return {"success": True}
