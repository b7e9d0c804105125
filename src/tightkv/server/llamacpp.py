"""llama.cpp's and vLLM's tokenizer routes: /tokenize, /detokenize,
/tokenizer_info (what lm-evaluation-harness's remote tokenizer reads) and /props."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..engine.requests import check_token_ids
from .http import ApiError, parse_body, request_body
from .schemas import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["llama.cpp"])


def _model(request: Request):
    state = request.app.state.tk
    if state.scheduler.state != "ready":
        raise ApiError(503, "Loading model", "unavailable_error", headers={"Retry-After": "1"})
    model = state.scheduler.model
    if model is None:
        state.scheduler.load()
        raise ApiError(
            503,
            "the model was unloaded (keep_alive) and is loading again",
            "unavailable_error",
            headers={"Retry-After": "2"},
        )
    return model


@router.post(
    "/tokenize",
    summary="Token ids of a text (llama.cpp: content, add_special; vLLM: prompt, add_special_tokens)",
    openapi_extra=request_body(TokenizeRequest),
)
async def tokenize(request: Request):
    req = await parse_body(request, TokenizeRequest)
    model = _model(request)
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
    model = _model(request)
    check_token_ids(model, req.tokens, "tokens")
    text = model.detokenize(req.tokens)
    return {"content": text, "prompt": text}  # llama.cpp's key, vLLM's key


@router.get("/tokenizer_info", summary="The tokenizer's special tokens and chat template (vLLM's shape)")
async def tokenizer_info(request: Request):
    model = _model(request)
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
    state = request.app.state.tk
    model = _model(request)
    return {
        "default_generation_settings": {"n_ctx": model.context_length, "params": {}},
        "total_slots": state.scheduler.parallel,
        "model_path": str(state.served.path),
        "chat_template": model.chat_template or "",
        "build_info": f"tightkv {request.app.version}",
        "modalities": {"vision": False, "audio": False},
    }
