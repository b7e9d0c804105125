"""The generation loop: chunked prefill, incremental decode, stops, streaming.

Layers, from the bottom: `prefill` runs a prompt into a cache; `generate_tokens`
yields token ids; `stream` turns them into one `GenerationStep` per token (its
UTF-8-safe text and id) and ends with a step that carries the `GenerationStats`.
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from ..errors import ContextOverflowError
from ..kv.cache import trim_to
from .sampling import Sampler, SamplingParams

PREFILL_CHUNK = 512


@dataclass
class GenerationStats:
    """The last record of a stream: counts, speeds and why generation ended."""

    prompt_tokens: int
    generated_tokens: int
    prompt_seconds: float
    generation_seconds: float
    finish_reason: str  # "stop" or "length"
    kv_bytes: int = 0
    cached_tokens: int = 0  # prompt tokens that were already in the cache
    ids: list[int] = field(default_factory=list, repr=False)  # the generated token ids

    @property
    def prompt_tps(self) -> float:
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "prompt_tps": round(self.prompt_tps, 2), "generation_tps": round(self.generation_tps, 2),
            "prompt_seconds": round(self.prompt_seconds, 4), "generation_seconds": round(self.generation_seconds, 4),
            "finish_reason": self.finish_reason, "kv_bytes": self.kv_bytes, "cached_tokens": self.cached_tokens,
        }


@dataclass
class GenerationStep:
    """One record of a stream: the text this step adds and the token it sampled.

    `text` may be empty (a partial UTF-8 character, or text held back because it
    may begin a stop string). The last record has `token` None, the text still
    held back, and `stats`, whose `finish_reason` says why generation ended.
    """

    text: str
    token: int | None = None
    stats: GenerationStats | None = None

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason if self.stats else None


@dataclass
class GenerationResult:
    """What a non-streaming `generate` returns."""

    text: str
    ids: list[int]
    stats: GenerationStats


@torch.inference_mode()
def chunk_ends(start: int, end: int, chunk: int = PREFILL_CHUNK, cuts=()) -> list[int]:
    """Where the prefill chunks of positions [start, end) end: at the multiples of `chunk`
    (absolute positions), at `cuts`, and at `end`.

    The chunks are a function of the positions alone, so a cache restored at one of
    these points and prefilled on gives bit for bit what one prefill from 0 gives
    (what a row computes depends on the chunk it is in: its weight path and its
    attention sums); the server's prefix store keeps caches only at such points."""
    ends = {p for p in cuts if start < p < end}
    ends.update(range((start // chunk + 1) * chunk, end, chunk))
    ends.add(end)
    return sorted(ends)


def prefill(model, ids: list[int], cache: list, chunk: int = PREFILL_CHUNK,
            progress: Callable[[int, int], None] | None = None, cuts=(),
            after: Callable[[int], None] | None = None) -> torch.Tensor | None:
    """Run ids into the cache in chunks (`chunk_ends`: on the absolute grid, and at `cuts`);
    return the logits (vocab,) after the last one. `after(position)` runs after each chunk."""
    logits = None
    start = cache[0].offset
    s = start
    for e in chunk_ends(start, start + len(ids), chunk, cuts):
        part = torch.tensor(ids[s - start : e - start], dtype=torch.long)
        last = e == start + len(ids)
        at = torch.tensor([part.numel() - 1]) if last else torch.tensor([], dtype=torch.long)
        out = model(part, cache, logits_at=at)
        if last:
            logits = out[0]
        if progress:
            progress(e - start, len(ids))
        if after:
            after(e)
        s = e
    return logits


def reuse_prefix(cache: list, held: list[int], ids: list[int]) -> bool:
    """Trim a cache filled from `held` back to the prefix it shares with `ids` (leaving at
    least one token of `ids` to run, for its logits). False, with the cache unchanged, when
    some layer cannot go back that far: the caller starts a fresh cache."""
    common = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        common += 1
    return trim_to(cache, min(common, cache[0].offset, len(ids) - 1))


@torch.inference_mode()
def decode_step(model, token: int, cache: list) -> torch.Tensor:
    """Logits (vocab,) after one more token.

    Torch's own ops run on one thread here: at one token they are too small to
    gain from a parallel region, and OpenMP's barriers stall badly when a core
    is busy. The weight kernels, where decode time goes, keep their own threads.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return model(torch.tensor([token]), cache)[0]
    finally:
        torch.set_num_threads(threads)


def check_context(prompt_len: int, max_tokens: int | None, context_length: int) -> int:
    """The number of tokens that may be generated; a prompt that cannot fit is an error."""
    if prompt_len >= context_length:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens does not fit the context of {context_length} tokens")
    room = context_length - prompt_len
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens plus max_tokens {max_tokens} exceeds the context of {context_length} tokens")
    return max_tokens


@dataclass
class PromptCache:
    """How a prompt meets a prefix store: `logits` after the whole prompt when the cache
    given already holds all of it; `cuts`, extra prefill chunk ends (`chunk_ends`); and
    `keep(position, cache, logits)`, called at the last chunk end before the prompt's end
    (logits None) and at its end, to store the cache there."""

    logits: torch.Tensor | None = None
    cuts: tuple = ()
    keep: Callable[[int, list, torch.Tensor | None], None] | None = None


def _prefill_prompt(model, prompt: list[int], cache: list, progress, pc: PromptCache | None) -> torch.Tensor:
    cached = cache[0].offset
    if pc is None:
        logits = prefill(model, prompt[cached:], cache, progress=progress)
    elif pc.logits is not None and cached == len(prompt):
        logits = pc.logits
    else:
        ends = chunk_ends(cached, len(prompt), cuts=pc.cuts)
        mark = ends[-2] if len(ends) > 1 else None
        after = (lambda e: pc.keep(e, cache, None) if e == mark else None) if pc.keep else None
        logits = prefill(model, prompt[cached:], cache, progress=progress, cuts=pc.cuts, after=after)
        if pc.keep and logits is not None:
            pc.keep(len(prompt), cache, logits)
    if logits is None:
        raise ValueError("the cache already holds the whole prompt; nothing to predict from")
    return logits


@torch.inference_mode()
def generate_tokens(model, prompt: list[int], cache: list, sampler: Sampler, max_tokens: int,
                    stop_ids: set[int], timing: dict, progress=None,
                    prompt_cache: PromptCache | None = None) -> Iterator[int]:
    """Yield sampled token ids. Prefill covers the prompt past what the cache already holds
    (`prompt_cache`: see `PromptCache`).

    `timing` receives prompt_seconds, generation_seconds, finish_reason, cached_tokens.
    """
    t0 = time.perf_counter()
    cached = cache[0].offset
    logits = _prefill_prompt(model, prompt, cache, progress, prompt_cache)
    timing.update(prompt_seconds=time.perf_counter() - t0, cached_tokens=cached, finish_reason="length")
    t1 = time.perf_counter()
    history = list(prompt)
    try:
        for _ in range(max_tokens):
            token = sampler(logits, history)
            if token in stop_ids:
                timing["finish_reason"] = "stop"
                return
            history.append(token)
            yield token
            logits = decode_step(model, token, cache)
    finally:
        timing["generation_seconds"] = time.perf_counter() - t1


class StopMatcher:
    """Holds back text that may be the start of a stop string."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                out, self.pending = self.pending[:i], ""
                return out, True
        hold = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def stream(model, tokenizer, prompt: list[int], cache: list, params: SamplingParams,
           max_tokens: int, stop: list[str] | None = None, progress=None,
           sampler: Callable[[torch.Tensor, list[int]], int] | None = None,
           prompt_cache: PromptCache | None = None) -> Iterator[GenerationStep]:
    """Yield one `GenerationStep` per token, then a last one carrying the stats and the generated ids.
    `sampler` (logits, history) -> token replaces the one `params` describe."""
    sampler = sampler or Sampler(params)
    matcher = StopMatcher(stop or [])
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    timing: dict = {}
    ids: list[int] = []
    tokens = generate_tokens(model, prompt, cache, sampler, max_tokens, tokenizer.eot_ids, timing, progress,
                             prompt_cache)
    stopped = False
    for token in tokens:
        ids.append(token)
        text, stopped = matcher.feed(decoder.decode(tokenizer.token_bytes(token)))
        yield GenerationStep(text, token)
        if stopped:
            tokens.close()
            timing["finish_reason"] = "stop"
            break
    tail = "" if stopped else matcher.feed(decoder.decode(b"", final=True))[0] + matcher.flush()
    yield GenerationStep(tail, None, GenerationStats(
        prompt_tokens=len(prompt), generated_tokens=len(ids),
        prompt_seconds=timing.get("prompt_seconds", 0.0), generation_seconds=timing.get("generation_seconds", 0.0),
        finish_reason=timing.get("finish_reason", "length"), kv_bytes=sum(c.nbytes for c in cache),
        cached_tokens=timing.get("cached_tokens", 0), ids=ids))
