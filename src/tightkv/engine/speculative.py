"""Speculative decoding: draft the next tokens cheaply, verify them in one forward of the target.

A drafter (`Drafter`) proposes the tokens after a sequence's history: `NgramDrafter` looks the
recent tokens up in the prompt and the reply so far (as llama.cpp's ngram-simple does: the
tokens that followed the longest match; ours compares tokens by their text without whitespace,
so a quote with other line breaks or indentation stays matched), `ModelDrafter` runs a small
model of the same vocabulary greedily. `Speculator.run` then feeds the pending token and the draft,
``[pending, d1 .. dk]``, through the target in one forward of the sequence's own cache, and the
sequence samples each verified position in turn as it would without speculation: while the
token it draws is the draft's, the draft's next position is already computed; at the first
that differs (or where the sequence ends) the cache is trimmed back past the rest.

Exact, not approximate:

- Each row of the verification computes what a one-token decode step computes: the weights go
  through the block-dot kernel for all rows at once (its rows are independent: batch
  invariance), and attention takes all rows (`rowwise`), each row appended and attended as a
  decode step is, in one call of the fused kernel that computes each row as its decode step
  would (`steps` calls: the paths chosen for one position's rows, each row's tokens split where
  its decode step splits them, from wherever its window starts); elsewhere (the torch
  reference, a layer still fitting its key scales) row by row.
  Recurrent layers (hybrid models) step row by row.
- Drafts are point masses (a lookup, or a draft model's greedy choice). For those the standard
  speculative-sampling rule (accept d with probability p(d), else draw from p without d) is the
  same as drawing t from p and keeping d when t == d; so each verified position draws exactly
  as the plain path draws (penalties, logit bias, grammar, stop strings, one uniform number per
  token), and a seeded run gives the same tokens with speculation as without.
- The cache is only ever trimmed where the trim gives back the very state a decode step would
  have: `room` caps a draft so that no layer compresses (but on the first row, the pending
  token's, which is never trimmed), drops out of its window or fits its channel scales during
  the verification; a recurrent state goes back to a checkpoint taken before it, and the
  accepted tokens are stepped again.

Adaptive (`Speculator`): the draft length is the one expected to give the most tokens per unit
of time, from the recent acceptance of drafts of the same strength (a lookup that matches 20
tokens is taken far more often than one that matches 2) and the timed seconds of a forward of
each row count (a verification of k rows cost 1.38 steps at k = 2, 2.44 at 8 and 4.11 at 16 on
Gemma 3 270M, 1.44, 3.09 and 5.43 on Qwen2.5-Coder-0.5B: docs/speed.md); where no draft of a
strength pays, its drafts pause for a number of their turns that doubles each time in a row,
then probe with a short draft.

Lookup drafts are on by default (`DEFAULT_SPEC`): measured at about 3,800 tokens of context on
both real models (docs/speed.md, `bench/speculative.py`), they gave 1.36-2.76x our plain decode,
open generation included. Draft models do not pay with these two: Qwen's Q2_K copy (5.2 bits a
weight) reads the prompt into its own cache and costs about what the target does (0.20x).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from ..errors import TightKVError
from ..kv.cache import Batch, BatchLayer, trim_to

SPEC_TYPES = ("none", "ngram-simple", "draft")  # llama.cpp's --spec-type names where they exist
DEFAULT_SPEC = "ngram-simple"  # what generate speculates with when not told (measured: see above)
DRAFT_MAX = 16  # llama.cpp's --draft-max default
NGRAM_MIN = 2  # the fewest tokens a lookup matches
LOOKUP_PLACES, LOOKUP_CORES = 256, 32  # a lookup compares the latest places, this many tokens back at most
DRAFT_P_MIN = 0.75  # a draft model stops drafting below this probability of its best token
MAX_PAUSE = 32  # steps without speculation at most, when no draft pays
PROBE = 2  # the draft length that probes after a pause
ACCEPT_DECAY = 0.9  # the weight a drafted token keeps in the acceptance odds for each newer one
ROW_COST = 0.3  # a verified row's cost beyond a decode step, in steps, where no forward of its rows is timed
COST_SAMPLES = 5  # the timings of each row count kept (their median: a slow step now and then does not count)
VOCAB_SLACK = 128  # a draft model's vocabulary may be this much shorter or longer (llama.cpp's)


@dataclass
class SpecOptions:
    """How a sequence speculates: `spec_type` "none", "ngram-simple" (prompt lookup) or "draft"
    (a draft model, `model_draft`: a GGUF path or registry name); drafts of `draft_min` to
    `draft_max` tokens."""

    spec_type: str = "none"
    draft_max: int = DRAFT_MAX
    draft_min: int = 0
    model_draft: str | None = None

    def validate(self) -> None:
        """Raise TightKVError, in one line, on a spec type, draft model or length that cannot be."""
        if self.spec_type not in SPEC_TYPES:
            raise TightKVError(f"spec_type must be one of {', '.join(SPEC_TYPES)}, got {self.spec_type!r}")
        if self.spec_type == "draft" and not self.model_draft:
            raise TightKVError("spec_type 'draft' needs a draft model (model_draft, -md/--model-draft)")
        if self.draft_max < 0 or self.draft_min < 0 or self.draft_min > max(self.draft_max, 0):
            raise TightKVError(
                f"draft_min and draft_max must be >= 0, draft_min <= draft_max; got {self.draft_min}, {self.draft_max}"
            )

    @property
    def active(self) -> bool:
        return self.spec_type != "none" and self.draft_max > 0


class Drafter(Protocol):
    """What proposes tokens: at most `n` likely next tokens after `history`; and, before it,
    how strong a draft after `history` would be (0: no draft; a draft model: 1, always), the
    odds of its tokens being taken kept apart by strength (`Speculator`)."""

    def strength(self, history: list[int]) -> int: ...

    def propose(self, history: list[int], n: int) -> list[int]: ...


class NgramDrafter:
    """Prompt lookup, robust to the whitespace a reply rewrites: the tokens after the place in
    the history (prompt and reply) whose tokens before it match the history's last tokens
    longest, at least NGRAM_MIN of them; the latest such place on a tie.

    Tokens are compared by their text without whitespace (`core`, from `piece`: the
    tokenizer's `token_piece`), and tokens of whitespace alone are skipped, so a reply that
    quotes the document with other line breaks or indentation (a paragraph rewrapped, a
    method taken out of its class) stays matched to it. Where a verification refused a
    whitespace token of the draft for another whitespace token, later drafts put the one the
    model chose in its place (an indentation of 8 spaces copied as 4). A match that runs to
    the end of the history drafts its repetition (a loop). Without `piece` every token is its
    own core."""

    def __init__(self, piece=None, ngram_min: int = NGRAM_MIN):
        self.piece, self.ngram_min = piece, ngram_min
        self._start()

    def _start(self) -> None:
        self.cores: list = []  # the cores of the history's tokens that are not whitespace alone
        self.after: list[int] = []  # the history position after each of them
        self.places: dict[tuple, list[int]] = {}  # NGRAM_MIN cores -> where in `cores` they end
        self.indexed = 0  # the history positions indexed
        self.swap: dict[int, int] = {}  # a whitespace token -> the one the model writes for it
        self.last: tuple[int, list[int]] | None = None  # the history length and the draft after it
        self.found: tuple[int, int | None, int] = (-1, None, 0)  # history length, where the match ends, its cores
        self._core: dict[int, object] = {}

    def core(self, token: int):
        """The token's text without whitespace (None: whitespace alone); memoized."""
        c = self._core.get(token, 0)
        if c == 0:
            text = self.piece(token, True) if self.piece else b""
            c = self._core[token] = (text.strip() or None) if text else token
        return c

    def strength(self, history: list[int]) -> int:
        """How many cores the best match agrees on (0: none; LOOKUP_CORES at most)."""
        if self.indexed > len(history):  # another history (a trimmed chat): start over
            self._start()
        if self.found[0] != len(history):
            self._learn(history)
            self._index(history)
            self.found = (len(history), *self._match())
        return self.found[2]

    def propose(self, history: list[int], n: int) -> list[int]:
        self.strength(history)
        at = self.found[1]
        if at is None:
            self.last = None
            return []
        tail = len(history) - self.after[-1]  # whitespace the history ends with
        while tail and at < len(history) and self.core(history[at]) is None:
            at += 1  # the model wrote its own whitespace already
        out = history[at : at + n]
        while out and len(out) < n:  # past the history's end: what the draft itself repeats
            out.append(out[len(out) - (len(history) - at)])
        out = [self.swap.get(t, t) for t in out]
        self.last = (len(history), out)
        return out

    def _match(self) -> tuple[int | None, int]:
        """The history position after the best earlier match of the last cores (None: none),
        and how many cores it matches."""
        k, m = len(self.cores), self.ngram_min
        if k <= m:
            return None, 0
        best, longest = None, 0
        for end in reversed(self.places.get(tuple(self.cores[k - m :]), [])[-LOOKUP_PLACES:]):
            n = m
            while n < LOOKUP_CORES and end - n >= 0 and self.cores[end - n] == self.cores[k - 1 - n]:
                n += 1
            if n > longest and end < k - 1:
                best, longest = end, n
        return (None, 0) if best is None else (self.after[best], longest)

    def _index(self, history: list[int]) -> None:
        m = self.ngram_min
        for pos in range(self.indexed, len(history)):
            c = self.core(history[pos])
            if c is None:
                continue
            self.cores.append(c)
            self.after.append(pos + 1)
            if len(self.cores) >= m:
                self.places.setdefault(tuple(self.cores[-m:]), []).append(len(self.cores) - 1)
        self.indexed = len(history)

    def _learn(self, history: list[int]) -> None:
        """A whitespace token of the last draft that the model wrote as another."""
        if self.last is None:
            return
        start, draft = self.last
        for d, t in zip(draft, history[start:]):
            if d != t:
                if self.core(d) is None and self.core(t) is None:
                    self.swap[d] = t
                return


class ModelDrafter:
    """A small model of the same vocabulary, drafting greedily from its own cache (f16), which
    follows the history by trimming back to what it shares and prefilling the rest. It stops
    early where its best token's probability falls below `p_min`. Running it costs a step each
    time (`costly`): when it offers nothing, speculation pauses as after a rejected draft."""

    costly = True

    def __init__(self, draft, p_min: float = DRAFT_P_MIN):
        self.draft, self.p_min = draft, p_min
        self.cache: list | None = None
        self.held: list[int] = []  # the tokens in the cache

    def strength(self, history: list[int]) -> int:
        return 1

    @torch.inference_mode()
    def propose(self, history: list[int], n: int) -> list[int]:
        from .generate import decode_step, prefill, reuse_prefix

        n = min(n, self.draft.context_length - len(history))
        if n <= 0:
            return []
        if self.cache is None or not reuse_prefix(self.cache, self.held, history):
            self.cache = self.draft.new_cache("f16")
        start = self.cache[0].offset
        logits = prefill(self.draft.net, history[start:], self.cache)
        self.held = list(history)
        out: list[int] = []
        while len(out) < n:
            probs = torch.softmax(logits.float(), dim=-1)
            p, token = torch.max(probs, dim=-1)
            if float(p) < self.p_min:
                break
            out.append(int(token))
            if len(out) < n:
                logits = decode_step(self.draft.net, out[-1], self.cache)
                self.held.append(out[-1])
        return out


def check_vocab(target, draft, name: str) -> None:
    """Refuse a draft model whose vocabulary is not the target's (tokens beyond the shorter
    list, up to VOCAB_SLACK of them, may differ: padding), in one line."""
    a = list(target.gguf.metadata.get("tokenizer.ggml.tokens", []))
    b = list(draft.gguf.metadata.get("tokenizer.ggml.tokens", []))
    n = min(len(a), len(b))
    if not n or abs(len(a) - len(b)) > VOCAB_SLACK or a[:n] != b[:n]:
        raise TightKVError(
            f"draft model {name}: its vocabulary ({len(b)} tokens) is not the target model's ({len(a)} tokens)"
        )


def room(cache: list) -> int:
    """How many rows a verification may append to `cache` and still be trimmed back to any of
    them exactly: the state a decode step would have had there (0: none may)."""
    from ..kv.cache import DenseCache
    from ..kv.compressed import CompressedCache
    from ..kv.recurrent import RecurrentState

    most = 1 << 30
    for c in cache:
        if isinstance(c, RecurrentState):
            continue  # restored from a checkpoint (`Speculator.run`)
        if isinstance(c, DenseCache):
            if c.window is not None:  # before the append that drops what left the window
                most = min(most, c.step + c.window - 1 - c.length)
        elif isinstance(c, CompressedCache):
            most = min(most, _compressed_room(c))
        else:  # a layer reading another's KV (`kv.shared`) sees only the source's last row
            return 0
    return max(0, most)


def _compressed_room(c) -> int:
    """Rows before a compressed layer encodes (its flush boundary) or compacts its stores (a
    sliding layer drops what left its window: `CompressedCache.compacts_after`). Where the
    first row (the pending token, never trimmed) is the one that encodes, the rows after it
    up to the next boundary: a trim back to any of them keeps the encode. (While its key
    scales are still to be fitted, the queries' squares it sums are kept row by row and put
    back by `RowLayer.keep`.)"""
    encodes_at = c.sink + c.recent - 1 + c.flush * ((c.body_end - c.sink) // c.flush + 1)
    most = encodes_at - c.offset
    if c.window is not None:
        return min(most, c.compacts_after() - 1)
    return most or c.flush


def rowwise(cache: list, rows: int):
    """`cache` as the model takes it for `rows` tokens of one sequence computed as `rows`
    decode steps: each layer's attention (and a recurrent layer's step) row by row, in order
    (`RowLayer`)."""
    batch = Batch(RowLayer(c, rows) for c in cache)
    batch.positions = torch.arange(cache[0].offset, cache[0].offset + rows)
    return batch


class RowLayer(BatchLayer):
    """One layer's cache taking `rows` rows of one sequence as that many decode steps (a
    `BatchLayer` of the same cache `rows` times: a recurrent layer steps row by row through
    it). A compressed layer still summing its queries' squares (its key scales not fitted
    yet) has them kept after each row, so that `keep` puts back what a decode step would hold."""

    def __init__(self, layer, rows: int):
        at = [layer] * rows if hasattr(layer, "checkpoints") else [_At(layer, layer.offset + i) for i in range(rows)]
        super().__init__(at, [1] * rows)
        self.layer = layer
        self.sums: list | None = [_sums(layer)] if _summing(layer) else None  # before each row, and after the last

    @property
    def offset(self) -> int:
        """Where the layer's rows start (a batch's query scale by position reads it)."""
        return self.layer.offset

    def attend(self, q, k, v, scale, sinks=None) -> torch.Tensor:
        if self.sums is None:
            if _steps_exact(self.layer, q.shape[1]):  # one kernel call, each row its step's
                return self.layer.attend(q, k, v, scale, sinks, steps=True)
            return super().attend(q, k, v, scale, sinks)
        c, outs = self.layer, []
        for i in range(q.shape[1]):
            outs.append(c.attend(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], scale, sinks))
            self.sums.append(_sums(c))
        return torch.cat(outs, dim=1)

    def keep(self, rows: int) -> None:
        """Back to the query sums after the first `rows` rows (the cache trimmed there)."""
        if self.sums:
            self.layer._qstep, self.layer._qn = self.sums[rows]


def _steps_exact(layer, rows: int) -> bool:
    """Whether the layer attends `rows` rows in one call as that many decode steps would."""
    exact = getattr(layer, "steps_exact", None)
    return exact is not None and exact(rows)


def _sums(c) -> tuple:
    """A compressed layer's running sums of its decode steps' query squares (a copy)."""
    return None if c._qstep is None else c._qstep.clone(), c._qn


class _At:
    """An attention layer as row `offset` of a verification sees it: its position (what a
    query scale by position reads: `models.decoder.temperature`), attending as the layer does."""

    def __init__(self, layer, offset: int):
        self.layer, self.offset = layer, offset

    def attend(self, q, k, v, scale, sinks=None) -> torch.Tensor:
        return self.layer.attend(q, k, v, scale, sinks)


def _summing(c) -> bool:
    """Whether a compressed layer still sums its queries' squares (`CompressedCache.append`)."""
    return getattr(c, "kscale", 0) is None and c.kc.balance


@torch.inference_mode()
def verify(model, tokens: list[int], cache: list) -> tuple[torch.Tensor, list]:
    """Logits (len(tokens), vocab) after each of `tokens`, run into `cache` in one forward, each
    row what a decode step gives; and the `RowLayer`s that ran them (`rowwise`)."""
    from .generate import torch_threads_for

    batch = rowwise(cache, len(tokens))
    with torch_threads_for(len(tokens)):
        logits = model(torch.tensor(tokens), batch, logits_at=torch.arange(len(tokens), dtype=torch.long))
    return logits, batch


def batch_drafts(seqs: list) -> list[list[int]]:
    """Each sequence's draft for one forward beside the others' (`verify_batch`): the rows
    the block-dot kernel takes beyond one a sequence, shared alike among those that
    speculate; none for a sequence with recurrent layers (its state steps row by row)."""
    from ..kernels import qmatmul
    from ..kv.recurrent import RecurrentState

    drafting = [s for s in seqs if s.speculator is not None and not any(isinstance(c, RecurrentState) for c in s.cache)]
    each = (qmatmul.kernel_rows() - len(seqs)) // max(1, len(drafting))
    if each < 1:
        return [[] for _ in seqs]
    picked = {id(s) for s in drafting}
    return [s.speculator.draft(s, limit=each) if id(s) in picked else [] for s in seqs]


@torch.inference_mode()
def verify_batch(model, parts: list[list[int]], caches: list[list]) -> list[tuple[torch.Tensor, list | None]]:
    """Several sequences' rows in one forward: `parts[i]` (a pending token and its draft, or
    the pending token alone) into `caches[i]`, each row what its decode step gives (the
    weights' rows are independent within `qmatmul.kernel_rows()`); per sequence its logits
    (len(parts[i]), vocab) and the `RowLayer`s that ran a draft (None: one row, a decode
    step's)."""
    from .generate import torch_threads_for

    rows = [len(p) for p in parts]
    per = [rowwise(c, n) if n > 1 else None for c, n in zip(caches, rows)]
    layers = [c if b is None else b for c, b in zip(caches, per)]
    batch = Batch(BatchLayer([seq[i] for seq in layers], rows) for i in range(len(caches[0])))
    batch.positions = torch.cat([torch.arange(c[0].offset, c[0].offset + n) for c, n in zip(caches, rows)])
    tokens = [t for p in parts for t in p]
    with torch_threads_for(len(tokens)):
        logits = model(torch.tensor(tokens), batch, logits_at=torch.arange(len(tokens)))
    return list(zip(logits.split(rows), per))


class Speculator:
    """One sequence's speculation: its drafter, the draft length that pays, the pauses, and
    the counts (`drafted`, `accepted`: llama-server's draft_n and draft_n_accepted).

    The length: with p the recent chance that a drafted token is taken, kept apart for drafts
    of each strength (`Drafter.strength`: a lookup's match of 2, 3-4, 5-8, 9-16 or 17-32
    tokens, where the odds start at 1:1, 2:1, 4:1, 8:1 and 16:1; drafted tokens counted with
    weights that decay by ACCEPT_DECAY a token), and the seconds a forward of n rows takes
    (`costs`: the median of its latest timings), a draft of n tokens is expected to give
    1 + p + .. + p^n tokens in a forward of n + 1 rows; the n with the most tokens a second
    is drafted, none where no draft beats a plain step. Then drafts of that strength pause
    for a number of its turns that doubles each time in a row, and probe with a draft of
    PROBE tokens after it."""

    def __init__(self, drafter: Drafter, draft_max: int = DRAFT_MAX, draft_min: int = 0):
        self.drafter, self.draft_max, self.draft_min = drafter, draft_max, draft_min
        self.odds: dict[int, list[float]] = {}  # strength group -> drafted tokens taken and refused, by age
        self.secs: dict[int, list[float]] = {}  # rows -> the latest timings of a forward of that many
        self.pause: dict[int, int] = {}  # strength group -> the turns of its last pause
        self.wait: dict[int, int] = {}  # strength group -> turns left in its pause (absent: not paused)
        self.group = 0  # the strength group of the last draft
        self.drafted = self.accepted = 0
        self.draft_s = 0.0  # the last draft's seconds (a draft model's forward)

    def costs(self, most: int) -> list[float]:
        """The seconds of a forward of 1 .. `most` rows: the median of the latest timings of
        each row count timed (a slow one, an encode, counts only once most are slow), linear
        between them, scaled by ROW_COST a row from the nearest beyond them (in those units
        before any is timed); never less than for fewer rows."""
        known = {r: sorted(t)[(len(t) - 1) // 2] for r, t in self.secs.items()}  # the lower of two middles
        out: list[float] = []
        for n in range(1, most + 1):
            lo = max((r for r in known if r <= n), default=None)
            hi = min((r for r in known if r >= n), default=None)
            if lo is not None and hi is not None:
                c = known[lo] if lo == hi else known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
            else:
                near = lo if hi is None else hi
                c = (1 + ROW_COST * (n - 1)) * (1 if near is None else known[near] / (1 + ROW_COST * (near - 1)))
            out.append(max(c, out[-1]) if out else c)
        return out

    def length(self, group: int = 0) -> int:
        """The draft length expected to give the most tokens per second (0: none pays), for a
        draft of the strength group."""
        taken, refused = self._odds(group)
        p = taken / (taken + refused)
        cost = self.costs(self.draft_max + 1)
        best, n_best, tokens, pn = 1 / cost[0], 0, 1.0, 1.0
        for n in range(1, self.draft_max + 1):
            pn *= p
            tokens += pn
            if tokens / cost[n] > best:
                best, n_best = tokens / cost[n], n
        return n_best

    def draft(self, seq, limit: int | None = None) -> list[int]:
        """The draft after the sequence's history (its pending token last), of `limit` tokens
        at most; [] to step plainly."""
        from ..kernels import qmatmul

        strength = self.drafter.strength(seq.history)
        if not strength:
            return []
        group = (strength - 1).bit_length()
        n = self.length(group) or self._probe(group)
        n = min(n, seq.max_tokens - len(seq.ids) - 1, room(seq.cache) - 1, qmatmul.kernel_rows() - 1)
        n = n if limit is None else min(n, limit)
        if n < max(1, self.draft_min):
            return []
        t = time.perf_counter()
        out = self.drafter.propose(seq.history, n)
        self.draft_s = time.perf_counter() - t
        self.group = group
        if len(out) >= max(1, self.draft_min):
            return out
        if getattr(self.drafter, "costly", False):  # a draft model that ran for nothing: as a token refused
            self._count(group, 0, 1)
        return []

    def _probe(self, group: int) -> int:
        """Where no draft of the group pays: 0 while its pause lasts (a new pause, twice the
        last, starts now if none does), PROBE when it is over."""
        left = self.wait.get(group)
        if left is None:
            self.pause[group] = self.wait[group] = min(MAX_PAUSE, max(1, 2 * self.pause.get(group, 0)))
            return 0
        if left:
            self.wait[group] = left - 1
            return 0
        del self.wait[group]
        return PROBE

    def _odds(self, group: int) -> list[float]:
        """The group's drafted tokens taken and refused, weighted by age; before any, 1:1 for
        a match of 2 tokens (and a draft model), 2:1 for 3-4, 4:1 for 5-8 .. ."""
        return self.odds.get(group) or [2 ** max(0, group - 1), 1]

    def _count(self, group: int, taken: float, refused: float, drafted: int = 0) -> None:
        old = self._odds(group)
        fade = ACCEPT_DECAY**drafted
        self.odds[group] = [old[0] * fade + taken, old[1] * fade + refused]

    def taken(self, drafted: int, accepted: int) -> None:
        """Count a verification that took `accepted` of `drafted` tokens."""
        self.drafted += drafted
        self.accepted += accepted
        self._count(self.group, accepted, accepted < drafted, drafted)
        if accepted:
            self.pause[self.group] = 0

    def timed(self, rows: int, seconds: float) -> None:
        """Keep the timing of a forward of `rows` rows that took `seconds` (a decode step: 1 row)."""
        times = self.secs.setdefault(rows, [])
        times.append(seconds)
        del times[:-COST_SAMPLES]

    def run(self, seq) -> Iterator:
        """Run the sequence's pending token, with drafts after it where they are offered, and
        yield the `GenerationStep` of each position verified; on return the sequence holds the
        logits after its last token in the cache (or has ended)."""
        from .generate import decode_step

        while seq.pending is not None:
            draft = self.draft(seq)
            if not draft:
                t = time.perf_counter()
                seq.advance(decode_step(seq.model, seq.pending, seq.cache))
                self.timed(1, time.perf_counter() - t)
                return
            yield from self._verify(seq, draft)

    def _verify(self, seq, draft: list[int]) -> Iterator:
        held = _checkpoint(seq.cache)
        t = time.perf_counter()
        rows, layers = verify(seq.model, [seq.pending] + draft, seq.cache)
        self.timed(len(draft) + 1, time.perf_counter() - t + self.draft_s)
        yield from self.verified(seq, draft, rows, layers, held)

    def verified(self, seq, draft: list[int], rows: torch.Tensor, layers: list, held=None) -> Iterator:
        """The `GenerationStep`s of a verification that has run: `rows` the logits after the
        pending token and each drafted one, `layers` the `RowLayer`s that ran them, `held`
        the recurrent layers' checkpoints from before it (`_checkpoint`)."""
        self.layers = layers
        o = seq.cache[0].offset - len(draft) - 1
        for i, d in enumerate(draft):
            seq.advance(rows[i])
            if not seq.can_sample:
                break
            step = seq.step()
            if step.token == d and seq.pending is not None:
                seq.pending = None  # in the cache already
                try:
                    yield step
                except GeneratorExit:  # the reader stopped here: the cache holds what was read
                    self._back(seq, o + 2 + i, held)
                    raise
                continue
            self._back(seq, o + 1 + i, held)
            self.taken(len(draft), i)
            if step.stats:
                step.stats.kv_bytes = sum(c.nbytes for c in seq.cache)
            yield step
            return
        else:
            seq.advance(rows[len(draft)])
            self._back(seq, o + 1 + len(draft), held)
            self.taken(len(draft), len(draft))
            return
        self._back(seq, o + 1 + i, held)  # ended before position i was sampled
        self.taken(len(draft), i)

    def _back(self, seq, keep: int, held) -> None:
        """Trim the cache back to `keep` tokens; recurrent layers go back to the checkpoint taken
        before the verification and step the kept tokens again."""
        from .generate import decode_step

        start = seq.cache[0].offset - len(self.layers[0].rows)
        if held is None:
            if not trim_to(seq.cache, keep):
                raise RuntimeError(f"speculation: the cache cannot go back to {keep} tokens")
            for layer in self.layers:
                layer.keep(keep - start)
            return
        saved = held
        if seq.cache[0].offset != keep:
            if not trim_to(seq.cache, start):
                raise RuntimeError(f"speculation: the cache cannot go back to {start} tokens")
            for layer in self.layers:
                layer.keep(0)
            for t in seq.history[start:keep]:
                decode_step(seq.model, t, seq.cache)
        for c, points in saved:
            c.checkpoints = points


def _checkpoint(cache: list):
    """For a cache with recurrent layers: [(layer, its checkpoints before)] after checkpointing
    each at the current offset; None for attention only."""
    from ..kv.recurrent import RecurrentState

    layers = [c for c in cache if isinstance(c, RecurrentState)]
    if not layers:
        return None
    saved = [(c, dict(c.checkpoints)) for c in layers]
    for c in layers:
        c.checkpoint()
    return saved


def make_speculator(model, options: SpecOptions | None) -> Speculator | None:
    """The `Speculator` for one sequence of `model` (an `api.Model`), or None."""
    if options is None or not options.active:
        return None
    if options.spec_type == "ngram-simple":
        drafter = NgramDrafter(model.tokenizer.token_piece)
    else:
        drafter = ModelDrafter(model.draft_model(options.model_draft))
    return Speculator(drafter, options.draft_max, options.draft_min)
