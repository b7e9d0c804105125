"""What the OpenAI and Ollama routes share about outputs beyond text: the grammar a
request constrains its output to, and log-probabilities in OpenAI's two shapes and Ollama's."""

from __future__ import annotations

from .http import ApiError


def constraint_options(
    response_format: dict | None = None,
    json_schema: dict | None = None,
    grammar: str | None = None,
    ollama_format: str | dict | None = None,
) -> dict:
    """`Model.sequence` options (json_schema / grammar) from OpenAI's response_format,
    llama.cpp's json_schema and grammar, or Ollama's format; a bad one is a 400."""
    schema = None
    if response_format is not None:
        kind = response_format.get("type", "text")
        if kind == "json_object":
            schema = True
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise ApiError(
                    400,
                    "'response_format.json_schema' must be an object with a 'schema' object",
                    param="response_format",
                )
            schema = spec.get("schema", True)
        elif kind != "text":
            raise ApiError(
                400,
                f"'response_format.type' must be text, json_object or json_schema, not {kind!r}",
                param="response_format",
            )
    if ollama_format not in (None, ""):
        if ollama_format == "json":
            schema = True
        elif isinstance(ollama_format, dict):
            schema = ollama_format
        else:
            raise ApiError(400, f'invalid format: {ollama_format!r} (give "json" or a JSON schema)')
    if json_schema is not None:
        schema = json_schema
    if schema is not None and grammar:
        raise ApiError(400, "give a JSON schema or a grammar, not both", param="grammar")
    out = {}
    if schema is not None:
        out["json_schema"] = schema
    if grammar:
        out["grammar"] = grammar
    return out


def _piece(tokenizer, token: int) -> tuple[str, list[int]]:
    raw = tokenizer.token_bytes(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tokenizer, lps: list) -> dict:
    """OpenAI chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}."""

    def entry(token: int, logprob: float) -> dict:
        text, raw = _piece(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [{**entry(t.token, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]} for t in lps]
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer, lps: list, offset: int = 0) -> dict:
    """OpenAI completions' `logprobs`: parallel lists tokens, token_logprobs, top_logprobs
    ({text: logprob}) and text_offset (from `offset`); a None entry (the first prompt token
    of an echo) has no logprob and no alternatives."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, token in lps:
        text, _ = _piece(tokenizer, token)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        out["token_logprobs"].append(None if t is None else t.logprob)
        out["top_logprobs"].append(None if t is None else {_piece(tokenizer, i)[0]: v for i, v in t.top})
    return out


def ollama_logprobs(tokenizer, lps: list) -> list[dict]:
    """Ollama's `logprobs`: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
    empty fields left out as Go's omitempty leaves them."""

    def entry(token: int, logprob: float) -> dict:
        text, raw = _piece(tokenizer, token)
        return {"token": text, "logprob": logprob, **({"bytes": raw} if raw else {})}

    return [
        {**entry(t.token, t.logprob), **({"top_logprobs": [entry(i, v) for i, v in t.top]} if t.top else {})}
        for t in lps
    ]
