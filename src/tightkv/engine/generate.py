"""The generation loop: chunked prefill, incremental decode, stops, streaming.

Layers, from the bottom: `prefill` runs a prompt into a cache in chunks
(`chunk_ends`); a `Sequence` is one generation as explicit steps (prefill chunks,
then one token at a time: its UTF-8-safe text and id, and a last step that
carries the `GenerationStats`); `decode_sequences` runs the next token of many
sequences in one forward pass, and beside them the next prompt chunk of one more
(the server's step); `stream` runs one sequence.
"""

from __future__ import annotations

import codecs
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from ..errors import ContextOverflowError
from ..kv.cache import batch_layers, trim_to
from ..kv.recurrent import rewind_point
from .sampling import Sampler, SamplingParams

PREFILL_CHUNK = 512
RELEASE_TOKENS = 4096  # after a prefill of this many tokens, its freed buffers go back to the OS


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
    stop_word: str | None = None  # the stop string that ended the reply, if one did
    ids: list[int] = field(default_factory=list, repr=False)  # the generated token ids
    draft_n: int = 0  # tokens drafted by speculation (`engine.speculative`), as llama-server counts them
    draft_n_accepted: int = 0  # of those, the tokens the target model agreed with

    @property
    def prompt_tps(self) -> float:
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prompt_tps": round(self.prompt_tps, 2),
            "generation_tps": round(self.generation_tps, 2),
            "prompt_seconds": round(self.prompt_seconds, 4),
            "generation_seconds": round(self.generation_seconds, 4),
            "finish_reason": self.finish_reason,
            "kv_bytes": self.kv_bytes,
            "cached_tokens": self.cached_tokens,
            **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n else {}),
        }


@dataclass
class TokenLogprob:
    """A sampled token's log-probability under the model (the raw logits: before penalties,
    temperature and any grammar), and the `top` most likely tokens' (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The TokenLogprob of `token` after logits (vocab,), with the `top` best alternatives."""
    lsm = torch.log_softmax(logits.float(), dim=-1)
    best = []
    if top > 0:
        values, ids = torch.topk(lsm, top)
        best = [(int(i), float(v)) for i, v in zip(ids, values)]
    return TokenLogprob(token, float(lsm[token]), best)


@dataclass
class GenerationStep:
    """One record of a stream: the text this step adds and the token it sampled.

    `text` may be empty (a partial UTF-8 character, or text held back because it
    may begin a stop string). The last record has `token` None, the text still
    held back, and `stats`, whose `finish_reason` says why generation ended.
    `logprob` is the token's `TokenLogprob` when the sequence was asked for them.
    """

    text: str
    token: int | None = None
    stats: GenerationStats | None = None
    logprob: TokenLogprob | None = None

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


def prefill(
    model,
    ids: list[int],
    cache: list,
    chunk: int = PREFILL_CHUNK,
    progress: Callable[[int, int], None] | None = None,
    cuts=(),
    after: Callable[[int], None] | None = None,
) -> torch.Tensor | None:
    """Run ids into the cache in chunks (`chunk_ends`: on the absolute grid, and at `cuts`);
    return the logits (vocab,) after the last one. `after(position)` runs after each chunk."""
    logits = None
    start = cache[0].offset
    for e in chunk_ends(start, start + len(ids), chunk, cuts):
        logits = run_chunk(model, ids[cache[0].offset - start : e - start], cache, last=e == start + len(ids))
        if progress:
            progress(e - start, len(ids))
        if after:
            after(e)
    if len(ids) >= RELEASE_TOKENS:
        release_memory()
    return logits


def release_memory() -> None:
    """Hand what a long prefill freed back to the OS: the weight kernels' tile buffer and the C
    heap's free pages (glibc's malloc_trim; elsewhere the heap is left as it is). Without it
    the process stays about as large as the prefill's peak (`bench/decode_memory.py` shows
    what is left resident after a fill)."""
    import ctypes
    import ctypes.util

    from ..kernels import qmatmul

    qmatmul.release_scratch()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        trim = None
    if trim is not None:
        trim(0)


def run_chunk(model, ids: list[int], cache: list, last: bool) -> torch.Tensor | None:
    """One prefill chunk; the logits (vocab,) after it when it is the `last`, else None."""
    part = torch.tensor(ids, dtype=torch.long)
    at = torch.tensor([part.numel() - 1]) if last else torch.tensor([], dtype=torch.long)
    with torch_threads_for(part.numel()):
        out = model(part, cache, logits_at=at)
    return out[0] if last else None


@contextlib.contextmanager
def torch_threads_for(rows: int):
    """Torch's own ops on one thread for a forward of at most `qmatmul.kernel_rows()` rows.

    There the weights go through the block-dot kernel, on its own thread pool, and
    torch's ops are too small to gain from a parallel region; but OpenMP's threads
    spin after each one and take the cores from the kernel's threads (Qwen2.5-Coder-0.5B,
    a 32-token chunk on the 2-core AVX-512 VNNI EPYC: 187 ms with torch on 2 threads,
    129 ms on one; docs/speed.md). Larger forwards keep torch's threads
    for the float32 matmul of the dequantized tiles."""
    from ..kernels import qmatmul

    if rows > max(1, qmatmul.kernel_rows()):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reuse_prefix(cache: list, held: list[int], ids: list[int]) -> bool:
    """Trim a cache filled from `held` back to the prefix it shares with `ids` (leaving at
    least one token of `ids` to run, for its logits); a hybrid model's recurrent layers go
    back to their latest checkpoint there or before (`kv.recurrent.rewind_point`), and the
    rest is recomputed. False, with the cache unchanged, when some layer cannot go back that
    far: the caller starts a fresh cache."""
    common = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        common += 1
    keep = rewind_point(cache, min(common, cache[0].offset, len(ids) - 1))
    return keep > 0 and trim_to(cache, keep)


@torch.inference_mode()
def decode_step(model, token: int, cache: list) -> torch.Tensor:
    """Logits (vocab,) after one more token (torch's ops on one thread: `torch_threads_for`)."""
    with torch_threads_for(1):
        return model(torch.tensor([token]), cache)[0]


@torch.inference_mode()
def forward_rows(model, parts: list[list[int]], caches: list[list], logits_at: list[int]) -> torch.Tensor:
    """One forward pass over N sequences: parts[i] (a decode step's one token, or a prompt
    chunk) into caches[i]; logits (len(logits_at), vocab) at those rows of the parts laid
    end to end. Each row computes what it computes alone, as long as the rows stay within
    `qmatmul.kernel_rows()` and every part would take the block-dot kernel alone."""
    tokens = [t for p in parts for t in p]
    with torch_threads_for(len(tokens)):
        return model(
            torch.tensor(tokens),
            batch_layers(caches, [len(p) for p in parts]),
            logits_at=torch.tensor(logits_at, dtype=torch.long),
        )


@torch.inference_mode()
def decode_batch(model, tokens: list[int], caches: list[list]) -> torch.Tensor:
    """Logits (N, vocab) after one more token of each of N sequences, in one forward pass:
    the weight kernels read each weight once for all N rows, attention runs per sequence
    over its own cache (`kv.cache.batch_layers`). A row computes what it would alone
    (the kernels' per-row sums do not depend on the other rows; tested)."""
    if len(tokens) == 1:
        return decode_step(model, tokens[0], caches[0])[None]
    with torch_threads_for(len(tokens)):
        return model(torch.tensor(tokens), batch_layers(caches))


def check_context(prompt_len: int, max_tokens: int | None, context_length: int) -> int:
    """The number of tokens that may be generated; a prompt that cannot fit is an error."""
    if prompt_len >= context_length:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens does not fit the context of {context_length} tokens",
            prompt_len,
            context_length,
        )
    room = context_length - prompt_len
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens plus max_tokens {max_tokens} exceeds the context of {context_length} tokens",
            prompt_len,
            context_length,
        )
    return max_tokens


@dataclass
class PromptCache:
    """How a prompt meets a prefix store: `logits` after the whole prompt when the cache
    given already holds all of it; `cuts`, extra prefill chunk ends (`chunk_ends`); and
    `keep(position, cache, logits)`, called at the `keep_points` (logits None) and at the
    prompt's end, to store the cache there."""

    logits: torch.Tensor | None = None
    cuts: tuple = ()
    keep: Callable[[int, list, torch.Tensor | None], None] | None = None
    breaks: tuple = ()  # the cuts that are paragraph breaks (`engine.prompt.PromptBuilder.paragraph_cuts`)


def keep_points(ends: list[int], cuts=(), chunk: int = PREFILL_CHUNK, breaks=()) -> set[int]:
    """Where a prompt with these chunk ends is stored besides its end: its last grid
    point, its first and last cuts (the end of its system prompt, for a new conversation
    under the same one; the start of its last turn, for this conversation's next turn)
    and its last paragraph break (`engine.prompt.PromptBuilder.paragraph_cuts`, for another question after
    the same document)."""
    inner = ends[:-1]
    cuts, breaks = set(cuts), set(breaks)
    turns = [e for e in inner if e in cuts]
    marks = [[e for e in inner if e % chunk == 0], turns[:1], turns, [e for e in inner if e in breaks]]
    return {m[-1] for m in marks if m}


class Sequence:
    """One generation as explicit steps, so that a scheduler can run many at once:
    `prefill(chunks)` runs prompt chunks (all, or that many), `step()` picks the next
    token and returns its `GenerationStep` (the last one carries the stats), and
    `decode_sequences` then feeds the `pending` tokens of any number of sequences
    through one forward pass (`advance`). `steps` is this loop for one sequence.

    The prompt is prefilled past what `cache` already holds, in the chunks of
    `chunk_ends` (`prompt_cache`: see `PromptCache`). `constraint`
    (`engine.grammar.Constraint`) limits each token to what a grammar admits, and ends
    the sequence when the grammar is complete; `logprobs` (None, or the number of
    alternatives, 0-20) adds a `TokenLogprob` to each step. `speculator`
    (`engine.speculative.Speculator`) drafts tokens that `steps` verifies several at a time.
    """

    def __init__(
        self,
        model,
        tokenizer,
        prompt: list[int],
        cache: list,
        sampler,
        max_tokens: int,
        stop: list[str] | None = None,
        progress=None,
        prompt_cache: PromptCache | None = None,
        constraint=None,
        logprobs: int | None = None,
        speculator=None,
    ):
        self.model, self.tokenizer, self.prompt, self.cache = model, tokenizer, list(prompt), cache
        self.speculator = speculator
        self.sampler, self.max_tokens, self.progress = sampler, max_tokens, progress
        self.constraint, self.logprobs = constraint, logprobs
        self.pc = prompt_cache or PromptCache()
        self.matcher = StopMatcher(stop or [])
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.history = list(prompt)
        self.ids: list[int] = []  # generated
        self.cached = cache[0].offset  # prompt tokens the cache held at the start
        self.logits: torch.Tensor | None = None  # after the last token run, until sampled
        self.pending: int | None = None  # sampled, waiting to be run (decode)
        self.done = False
        self.finish_reason = "length"
        self._ends: list[int] | None = None  # chunk ends still to run
        self._marks: set[int] = set()  # chunk ends where the prompt is kept (`keep_points`)
        self._t0 = self._t1 = 0.0
        self.prompt_seconds = 0.0

    @property
    def prefilled(self) -> bool:
        return self._ends is not None and not self._ends

    @torch.inference_mode()
    def prefill(self, chunks: int | None = None) -> bool:
        """Run the prompt's next `chunks` chunks (None: all); True once the prompt is in."""
        ran = 0
        while (chunks is None or ran < chunks) and (ids := self.next_chunk()):
            self.chunk_done(run_chunk(self.model, ids, self.cache, self.last_chunk))
            ran += 1
        self._prefill_end()
        return self.prefilled

    def next_chunk(self) -> list[int]:
        """The prompt ids of the next prefill chunk ([] once the prompt is in); a caller that
        runs it itself (`decode_sequences`) then hands its logits to `chunk_done`."""
        if self._ends is None:
            self._t0 = time.perf_counter()
            held, n = self.cached, len(self.prompt)
            if self.pc.logits is not None and held == n:
                self._ends, self.logits = [], self.pc.logits
            else:
                self._ends = chunk_ends(held, n, cuts=self.pc.cuts)
                self._marks = keep_points(self._ends, self.pc.cuts, breaks=self.pc.breaks)
        return self.prompt[self.cache[0].offset : self._ends[0]] if self._ends else []

    @property
    def last_chunk(self) -> bool:
        """Whether the next chunk ends the prompt (its logits are then needed)."""
        return bool(self._ends) and len(self._ends) == 1

    def chunk_done(self, logits: torch.Tensor | None) -> None:
        """The next chunk has run into the cache; `logits` (vocab,) after it when it was the last."""
        e = self._ends.pop(0)
        last = not self._ends
        self.logits = logits if last else None
        if self.progress:
            self.progress(e - self.cached, len(self.prompt) - self.cached)
        if self.pc.keep and (e in self._marks or last):
            self.pc.keep(e, self.cache, self.logits if last else None)
        self._prefill_end()

    def _prefill_end(self) -> None:
        if self.prefilled and not self._t1:
            if self.logits is None:
                raise ValueError("the cache already holds the whole prompt; nothing to predict from")
            if len(self.prompt) - self.cached >= RELEASE_TOKENS:
                release_memory()
            self._t1 = time.perf_counter()
            self.prompt_seconds = self._t1 - self._t0
        return self.prefilled

    @property
    def can_sample(self) -> bool:
        """Whether `step` would pick another token (not the last step)."""
        finished = self.constraint is not None and self.constraint.finished
        return not (finished or self.done or len(self.ids) >= self.max_tokens)

    def step(self) -> GenerationStep:
        """The next token's step, or the last step (with the stats) once generation ends."""
        if self.constraint is not None and self.constraint.finished:
            self.finish_reason = "stop"
        elif not self.done and len(self.ids) < self.max_tokens:
            with torch_threads_for(1):  # ops over the whole vocabulary, beside the kernels' threads
                token = self._sample()
                lp = None if self.logprobs is None else token_logprob(self.logits, token, self.logprobs)
            self.logits = None
            if token in self.tokenizer.eot_ids:
                self.finish_reason = "stop"
            else:
                self.ids.append(token)
                self.history.append(token)
                text, stopped = self.matcher.feed(self.decoder.decode(self.tokenizer.token_bytes(token)))
                if stopped:
                    self.finish_reason, self.done = "stop", True
                else:  # run even after the last one: the cache then holds the whole reply (a chat's next turn)
                    self.pending = token
                return GenerationStep(text, token, logprob=lp)
        return self._last()

    def _sample(self) -> int:
        """The next token; under a grammar, one it admits (greedy: the best token is checked
        first, and the whole vocabulary masked only when the grammar refuses it)."""
        c = self.constraint
        if c is None:
            return self.sampler(self.logits, self.history)
        greedy = getattr(getattr(self.sampler, "p", None), "temperature", 1.0) <= 0
        token = self.sampler(self.logits, self.history) if greedy else None
        if token is None or not c.allows(token):
            token = self.sampler(c.mask(self.logits), self.history)
        c.accept(token)
        return token

    def advance(self, logits: torch.Tensor) -> None:
        """The logits after the pending token, which has now been run."""
        self.logits, self.pending = logits, None

    def _last(self) -> GenerationStep:
        self.done = True
        stopped = self.finish_reason == "stop"
        self.decoder.reset()  # a character cut by the token budget is dropped, not replaced by U+FFFD
        tail = "" if stopped else self.matcher.flush()
        return GenerationStep(
            tail,
            None,
            GenerationStats(
                prompt_tokens=len(self.prompt),
                generated_tokens=len(self.ids),
                prompt_seconds=self.prompt_seconds,
                generation_seconds=time.perf_counter() - self._t1 if self._t1 else 0.0,
                finish_reason=self.finish_reason,
                kv_bytes=sum(c.nbytes for c in self.cache),
                cached_tokens=self.cached,
                stop_word=self.matcher.hit,
                ids=self.ids,
                draft_n=self.speculator.drafted if self.speculator else 0,
                draft_n_accepted=self.speculator.accepted if self.speculator else 0,
            ),
        )


def decode_sequences(model, seqs: list[Sequence], filling: Sequence | None = None) -> None:
    """Run the pending token of each sequence, all in one forward pass; with `filling`, its
    next prompt chunk in the same pass (rows within `qmatmul.kernel_rows()`: then each
    row computes what it would alone, and a stored prefix stays exact)."""
    if filling is not None and not seqs:
        filling.prefill(chunks=1)
        return
    if filling is None or not filling.next_chunk():
        if seqs:
            logits = decode_batch(model, [s.pending for s in seqs], [s.cache for s in seqs])
            for s, row in zip(seqs, logits):
                s.advance(row)
        return
    chunk, last = filling.next_chunk(), filling.last_chunk
    at = ([len(chunk) - 1] if last else []) + [len(chunk) + i for i in range(len(seqs))]
    logits = forward_rows(model, [chunk] + [[s.pending] for s in seqs], [filling.cache] + [s.cache for s in seqs], at)
    filling.chunk_done(logits[0] if last else None)
    for s, row in zip(seqs, logits[1:] if last else logits):
        s.advance(row)


class StopMatcher:
    """Holds back text that may be the start of a stop string."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None  # the stop string reached

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                out, self.pending, self.hit = self.pending[:i], "", s
                return out, True
        hold = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
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


def stream(
    model,
    tokenizer,
    prompt: list[int],
    cache: list,
    params: SamplingParams,
    max_tokens: int,
    stop: list[str] | None = None,
    progress=None,
    sampler: Callable[[torch.Tensor, list[int]], int] | None = None,
    prompt_cache: PromptCache | None = None,
    speculator=None,
) -> Iterator[GenerationStep]:
    """Yield one `GenerationStep` per token, then a last one carrying the stats and the generated ids.
    `sampler` (logits, history) -> token replaces the one `params` describe; `speculator`:
    see `Sequence`."""
    sampler = sampler or Sampler(params)
    seq = Sequence(model, tokenizer, prompt, cache, sampler, max_tokens, stop, progress, prompt_cache)
    seq.speculator = speculator
    return steps(seq)


def steps(seq: Sequence) -> Iterator[GenerationStep]:
    """Run one sequence to its end: one `GenerationStep` per token, then the last. With a
    `speculator`, a pending token runs with a draft after it (`Speculator.run`), and the
    positions verified come out as steps of their own."""
    seq.prefill()
    while True:
        step = seq.step()
        yield step
        if step.stats:
            return
        if seq.pending is None:
            continue
        if seq.speculator is None:
            seq.advance(decode_step(seq.model, seq.pending, seq.cache))
            continue
        for step in seq.speculator.run(seq):
            yield step
            if step.stats:
                return
