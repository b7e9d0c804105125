"""Continuous batching: many requests' sequences advanced together, one step at a time.

A `Batch` owns what runs on every request: the checks a prepared job passes
(`prepare`), its cache (restored from the prefix store where a stored prefix matches,
`engine.prefixes`) and its `engine.generate.Sequence` (`start`), and the step (`step`):
one prefill chunk of the oldest sequence still reading its prompt and one token of
every other, in one forward pass where their rows fit the block-dot kernel
(`decode_sequences`: the weights are read once for the batch, attention runs per
sequence over its own cache), else the chunk first and the tokens in one pass after it.
Sequences that speculate put their drafts beside their tokens in that pass
(`engine.speculative.verify_batch`) and take every token verified.
A step returns its events, (slot, kind, value): LOGPROB, PIECE (text), DONE (the
`GenerationStats`), ERROR, and PREFILLED (the prompt is in the cache). A slot that is
done or failed is closed (its sequence and cache dropped) before the step returns.

The caller (the server's scheduler) owns the thread, the queue and the requests; the
batch owns no thread and never blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..kernels.qmatmul import kernel_rows
from .generate import PromptCache, chunk_ends, check_context, decode_sequences
from .requests import Prepared, prepare
from .sampling import SamplingParams
from .speculative import batch_drafts, verify_batch

# event kinds of a step (the server posts the same to its jobs)
ACCEPTED, PIECE, LOGPROB, DONE, ERROR, PREFILLED = "accepted", "piece", "logprob", "done", "error", "prefilled"


@dataclass
class Slot:
    """One request in the batch: its prepared job, its sequence and its cache (None once
    closed); `owner` is the caller's (the scheduler's job)."""

    prepared: Prepared
    owner: Any = None
    seq: Any = None
    cache: list | None = None
    started: float = field(default_factory=time.perf_counter)

    def close(self) -> None:
        self.seq = self.cache = None


class Batch:
    """The running sequences of one model: prepare, start, step.

    `prefixes`: an `engine.prefixes.PrefixStore` that prompts are restored from and stored
    into (None: none). Counters: `batch_size` (sequences in the last decode pass),
    `decode_steps` (batched forward passes) and `decode_rows` (the tokens they carried)."""

    def __init__(self, model, prefixes=None):
        self.model, self.prefixes = model, prefixes
        self.batch_size = self.decode_steps = self.decode_rows = 0

    @classmethod
    def for_model(cls, model, ram: int | None, disk: int = 0, disk_tokens: int = 1024, notice=None) -> "Batch":
        """A batch with a prefix store of `ram` bytes (None: the default, 0: none) over a
        disk store of `disk` bytes (0: none) for prompts of at least `disk_tokens` tokens."""
        if ram == 0:
            return cls(model)
        from ..kv.saved import CacheStore
        from .prefixes import PrefixStore

        store = PrefixStore(
            model,
            model.kv,
            ram_bytes=ram,
            disk=CacheStore() if disk else None,
            disk_tokens=disk_tokens,
            disk_bytes=disk,
            kind="prompt",
            notice=notice,
        )
        return cls(model, store)

    # --- requests ----------------------------------------------------------------------
    def prepare(self, request) -> Prepared:
        """A request (`engine.requests`) made a job, checked: its prompt fits the context
        with its budget, its sampling options are valid. Raises the request's error."""
        prep = prepare(self.model, request)
        check_context(len(prep.ids), prep.max_tokens, self.model.context_length)
        fields = SamplingParams.__dataclass_fields__
        self.model.sampling_params(**{k: v for k, v in prep.options.items() if k in fields})
        return prep

    def start(self, prep: Prepared, owner: Any = None) -> Slot:
        """A slot for a prepared job: its cache (a stored prefix where one matches) and its
        sequence, not yet stepped."""
        slot = Slot(prep, owner)
        slot.cache, prompt_cache = self._cache_for(prep.ids)
        slot.seq = self.model.sequence(
            prep.ids, max_tokens=prep.max_tokens, cache=slot.cache, prompt_cache=prompt_cache, **prep.options
        )
        return slot

    def _cache_for(self, ids: list[int]):
        """A prompt's cache and how it meets the prefix store: the longest stored prefix
        that ends on one of the prompt's chunk ends and was filled with the same ones (the
        prefill grid and `PromptBuilder.cut_points`: so the rest is computed exactly as a
        cold prefill computes it), or the whole prompt with its logits; the prompt is
        stored at its keep points and end."""
        cuts, breaks = (tuple(c) for c in self.model.prompts.cut_points(ids))
        if self.prefixes is None:
            return self.model.new_cache(), PromptCache(cuts=cuts)
        _, cache, logits = self.prefixes.best(ids, chunk_ends(0, len(ids), cuts=cuts), complete=True, cuts=cuts)
        keep = lambda end, c, lg: self.prefixes.put(ids[:end], c, lg, cuts)  # noqa: E731
        return (cache if cache is not None else self.model.new_cache()), PromptCache(logits, cuts, keep, breaks)

    def prefix_stats(self) -> dict:
        """The prefix store's entries, bytes, budget and hits (zeros when it is off)."""
        if self.prefixes is None:
            keys = ("entries", "bytes", "budget_bytes", "hits", "misses", "reused_tokens")
            return {**dict.fromkeys(keys, 0), "hit_rate": 0.0}
        return self.prefixes.stats()

    # --- steps -------------------------------------------------------------------------
    def step(self, slots: list[Slot]) -> list[tuple[Slot, str, Any]]:
        """One prefill chunk of the first slot still reading its prompt and one token of
        every other: in one forward pass where their rows fit the block-dot kernel, else
        the chunk first, then the decodes in one batch. Returns the step's events."""
        events: list[tuple[Slot, str, Any]] = []
        filling = next((s for s in slots if not s.seq.prefilled), None)
        ready = [s for s in slots if s.seq.prefilled]
        chunk = len(filling.seq.next_chunk()) if filling is not None else 0
        if chunk and ready and chunk + len(ready) <= kernel_rows():
            self._merged_step(filling, ready, events)
            return events
        if filling is not None:
            try:
                if filling.seq.prefill(chunks=1):
                    events.append((filling, PREFILLED, None))
                    ready.append(filling)
            except Exception as err:  # noqa: BLE001 - the request's error (logged on its stream)
                self._fail(filling, err, events)
        batch = self._sample(ready, events)
        if len(batch) == 1 and batch[0].seq.speculator is not None:
            self._speculate(batch[0], events)
        elif batch and not self._speculate_together(batch, events):
            try:
                decode_sequences(self.model.net, [s.seq for s in batch])
            except Exception as err:  # noqa: BLE001 - a failed batch fails each of its slots
                for slot in batch:
                    self._fail(slot, err, events)
        self._count(batch)
        return events

    def _speculate(self, slot: Slot, events: list) -> None:
        """A lone sequence's pending token with a draft after it, verified in one forward
        (`engine.speculative.Speculator.run`): the step's events carry each accepted token."""
        try:
            for item in slot.seq.speculator.run(slot.seq):
                self._emit(slot, item, events)
                if slot.seq is None:
                    break
        except Exception as err:  # noqa: BLE001 - the request's error (logged on its stream)
            self._fail(slot, err, events)

    def _speculate_together(self, batch: list[Slot], events: list) -> bool:
        """Every slot's pending token, with its draft after it where its speculator offers
        one, in one forward (`engine.speculative.verify_batch`); False, having run nothing,
        where no slot drafts."""
        drafts = batch_drafts([s.seq for s in batch])
        if not any(drafts):
            return False
        try:
            parts = [[s.seq.pending] + d for s, d in zip(batch, drafts)]
            done = verify_batch(batch[0].seq.model, parts, [s.cache for s in batch])
        except Exception as err:  # noqa: BLE001 - a failed pass fails each of its slots
            for slot in batch:
                self._fail(slot, err, events)
            return True
        for slot, draft, (rows, layers) in zip(batch, drafts, done):
            if not draft:
                slot.seq.advance(rows[0])
                continue
            try:
                for item in slot.seq.speculator.verified(slot.seq, draft, rows, layers):
                    self._emit(slot, item, events)
                    if slot.seq is None:
                        break
            except Exception as err:  # noqa: BLE001 - the request's error (logged on its stream)
                self._fail(slot, err, events)
        return True

    def _merged_step(self, filling: Slot, ready: list[Slot], events: list) -> None:
        """The filling slot's next chunk beside one token of each ready slot, in one forward
        pass; a slot whose prompt is then in takes its first token at once."""
        batch = self._sample(ready, events)
        try:
            decode_sequences(self.model.net, [s.seq for s in batch], filling=filling.seq)
        except Exception as err:  # noqa: BLE001 - a failed pass fails each of its slots
            for slot in [filling, *batch]:
                self._fail(slot, err, events)
            batch = []
        self._count(batch)
        if filling.seq is not None and filling.seq.prefilled:
            events.append((filling, PREFILLED, None))
            self._sample([filling], events)

    def _sample(self, slots: list[Slot], events: list) -> list[Slot]:
        """Each slot's next step (its token, or its end), unless its last token is still to
        run (a first token sampled after a merged pass); those with a token to run."""
        for slot in slots:
            if slot.seq.pending is not None:
                continue
            try:
                self._emit(slot, slot.seq.step(), events)
            except Exception as err:  # noqa: BLE001
                self._fail(slot, err, events)
        return [s for s in slots if s.seq is not None and s.seq.pending is not None]

    def _count(self, batch: list[Slot]) -> None:
        self.batch_size = len(batch)
        if batch:
            self.decode_steps += 1
            self.decode_rows += len(batch)

    @staticmethod
    def _emit(slot: Slot, item, events: list) -> None:
        if item.logprob is not None:
            events.append((slot, LOGPROB, item.logprob))
        if item.text:
            events.append((slot, PIECE, item.text))
        if item.stats:
            events.append((slot, DONE, item.stats))
            slot.close()

    @staticmethod
    def _fail(slot: Slot, err: BaseException, events: list) -> None:
        events.append((slot, ERROR, err))
        slot.close()
