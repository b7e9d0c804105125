"""Embeddings from any loaded model: each input's tokens run through the model's layers
into a throwaway dense f16 cache (no logits), and the final-normed hidden states are
pooled into one vector as the GGUF says (`{arch}.pooling_type`, numbered as llama.cpp's
`LLAMA_POOLING_TYPE_*`), else by their mean, then L2-normalized (llama.cpp's and
Ollama's default).

    result = embed(model, ["a text", [2, 651, 1234]])   # texts or token ids
    result.vectors, result.tokens                         # (n, hidden) floats, tokens read
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ContextOverflowError, RequestError
from .generate import PREFILL_CHUNK
from .requests import check_token_ids

# llama.h LLAMA_POOLING_TYPE_*: none (a vector per token) is pooled by mean here, since
# neither OpenAI's nor Ollama's answer carries per-token vectors; rank is a reranker's head
POOLING = {0: "mean", 1: "mean", 2: "cls", 3: "last"}


@dataclass
class Embeddings:
    """One vector per input (hidden_size floats each) and the tokens each input was read as."""

    vectors: list[list[float]]
    tokens: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)


def pooling(metadata: dict) -> str:
    """How a model's hidden states become one vector: "mean", "cls" (the first token's) or
    "last" (the last token's), from `{arch}.pooling_type`; "mean" where the file says none."""
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.pooling_type")
    if value is None:
        return "mean"
    if int(value) not in POOLING:
        raise RequestError(f"the model's pooling type {int(value)} (a reranker's) gives no embeddings")
    return POOLING[int(value)]


@torch.inference_mode()
def hidden_states(net, ids: list[int], pause: Callable[[], None] | None = None) -> torch.Tensor:
    """The final-normed hidden states (len(ids), hidden) of ids read from position 0 into a
    fresh dense f16 cache, PREFILL_CHUNK tokens per forward; `pause()` between two."""
    from ..kv.spec import parse_kv

    cache = parse_kv("f16").make_caches(net.cache_layout(), len(ids))
    rows = []
    for start in range(0, len(ids), PREFILL_CHUNK):
        if start and pause:
            pause()
        rows.append(net(torch.tensor(ids[start : start + PREFILL_CHUNK]), cache, hidden=True).float())
    return torch.cat(rows)


def pool(h: torch.Tensor, how: str) -> torch.Tensor:
    """One vector (hidden,) from hidden states (T, hidden): their mean, the first row (cls) or the last."""
    return h[0] if how == "cls" else h[-1] if how == "last" else h.double().mean(0).float()


def unit(v: torch.Tensor) -> torch.Tensor:
    """v over its L2 norm (a zero vector stays zero)."""
    return (v.double() / max(torch.linalg.vector_norm(v.double()).item(), 1e-12)).float()


def input_ids(model, item: str | list[int], limit: int, truncate: bool, name: str = "input") -> list[int]:
    """An input's tokens: text read with the BOS/EOS its vocabulary adds and control-token
    text parsed (as llama-server does), or token ids checked against the vocabulary. More
    than `limit` tokens are cut to the first `limit` when `truncate` (the EOS the vocabulary
    adds kept last, for last-token pooling), else a `ContextOverflowError`."""
    if isinstance(item, str):
        ids = model.tokenize(item, add_bos=True, special=True)
    else:
        ids = [int(t) for t in item]
        check_token_ids(model, ids, name)
    if not ids:
        raise RequestError(f"'{name}' is empty: nothing to embed", param=name)
    if len(ids) <= limit:
        return ids
    if not truncate:
        raise ContextOverflowError(
            f"the input length exceeds the context length: {len(ids)} tokens, the context holds {limit}",
            n_prompt_tokens=len(ids),
            n_ctx=limit,
        )
    tok = model.tokenizer
    if getattr(tok, "add_eos", False) and tok.eos_id is not None and ids[-1] == tok.eos_id and limit > 1:
        return ids[: limit - 1] + [ids[-1]]
    return ids[:limit]


def embed(
    model,
    inputs: list[str | list[int]],
    limit: int | None = None,
    truncate: bool = False,
    normalize: bool = True,
    pause: Callable[[], None] | None = None,
    name: str = "input",
    dimensions: int | None = None,
    shorten: bool = False,
) -> Embeddings:
    """Embed each input (text or token ids) with `model` (an `api.Model`), one after
    another, `pause()` between two pieces of work. `limit`: the most tokens an input may
    have (at most, and by default, the model's context); `truncate`: cut longer inputs
    rather than refuse them; `dimensions`: the vectors' length, the model's hidden size
    (None: the same), or with `shorten` fewer: each vector's first values, normalized again
    (Ollama's `dimensions`, for models trained to be cut so). Every input is tokenized and
    checked before any is run."""
    limit = min(limit or model.context_length, model.context_length)
    how = pooling(model.gguf.metadata)
    size = model.args.hidden_size
    if dimensions is not None and not (0 < dimensions <= size if shorten else dimensions == size):
        allowed = f"between 1 and {size}" if shorten else f"{size} (the vectors cannot be shortened)"
        raise RequestError(f"'dimensions' must be {allowed}, the model's embedding size", "dimensions")
    many = len(inputs) > 1
    ids = [input_ids(model, x, limit, truncate, f"{name}.{i}" if many else name) for i, x in enumerate(inputs)]
    vectors = []
    for i, seq in enumerate(ids):
        if i and pause:
            pause()
        v = pool(hidden_states(model.net, seq, pause), how)
        if dimensions is not None:
            v = v[:dimensions]
        vectors.append((unit(v) if normalize else v).tolist())
    return Embeddings(vectors, [len(s) for s in ids])
