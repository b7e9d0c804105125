"""Filled KV caches by token prefix: in RAM (least recently used first out, by
bytes) over the on-disk store.

Whatever prompt starts with tokens already prefilled (an RLV read of a section
read before, a question about a document read by another process) takes the
longest stored prefix and prefills only the rest. An entry is each layer's
`state()` (a copy: what the cache holds, compressed as it is held); a cache
restored from it continues bit for bit like the cache it was taken from. What a
prompt row computes still depends on the prefill chunk it falls in (the weight
kernels' path for a few rows or many, the attention sums), which is why entries
are taken and used only at chunk ends.

Entries are found by exact token ids, and the chunk ends off the grid they were
filled with, at the lengths a caller names (`best`), in RAM and then on disk: an
RLV read names where each of its sections ends; the server names the new prompt's
chunk ends (`engine.generate.chunk_ends`: the grid, chat turns, a turn's last
paragraph break), so the rest is computed exactly as a cold prefill computes it,
and the prompt's own length, whose entry brings the logits after it (nothing is
prefilled then). A store belongs to one model and one KV spec; the disk files
carry the same checks as the document cache (`kv.saved.cache_key`).
"""

from __future__ import annotations

import collections
from typing import Callable

import torch

from ..kv.saved import CacheStore


def available_ram() -> int:
    """Bytes of RAM available now."""
    import psutil

    return psutil.virtual_memory().available


def default_ram_budget() -> int:
    """A quarter of the RAM available now."""
    return available_ram() // 4


def _key(ids: list[int], cuts: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An entry's key: its token ids, and the chunk ends off the grid before its end."""
    return tuple(ids), tuple(c for c in cuts if c < len(ids))


def _state_bytes(states: list[dict]) -> int:
    return sum(t.numel() * t.element_size() for s in states for t in s.values())


class PrefixStore:
    """Caches by token prefix for one model and KV spec: RAM under `ram_bytes`, then
    the `disk` store (for prefixes of at least `disk_tokens` tokens).

    `disk_bytes` bounds the disk files of this store's `kind` (None: no bound).

    Attributes:
        hits, misses: lookups that found a prefix, and that found none.
        reused_tokens: tokens taken from the store instead of prefilled.
    """

    def __init__(
        self,
        model,
        kv,
        *,
        ram_bytes: int | None = None,
        disk: CacheStore | None = None,
        disk_tokens: int = 0,
        disk_bytes: int | None = None,
        doc=None,
        kind: str = "prefix",
        notice: Callable[[str], None] | None = None,
    ):
        self.model, self.kv = model, kv
        self.ram_bytes = default_ram_budget() if ram_bytes is None else ram_bytes
        self.disk, self.disk_tokens, self.disk_bytes = disk, disk_tokens, disk_bytes
        self.doc, self.kind = doc, kind  # named in the disk files' headers
        self.notice = notice
        # (ids, cuts: `_key`) -> (each layer's state, bytes, the logits after the last token or None)
        self._ram: collections.OrderedDict[tuple, tuple[list[dict], int, torch.Tensor | None]] = (
            collections.OrderedDict()
        )
        self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._ram)

    # --- lookup ---------------------------------------------------------------------
    def _entry(self, ids: list[int], cuts: tuple) -> tuple[list, torch.Tensor | None] | None:
        """(a fresh cache holding exactly `ids`, filled with chunk ends at `cuts` off the
        grid, the logits after them or None), from RAM, else from disk (then remembered
        in RAM), or None."""
        key = _key(ids, cuts)
        if key in self._ram:
            self._ram.move_to_end(key)
            states, _, logits = self._ram[key]
            return self._restore(states), logits
        if self.disk is None or len(ids) < self.disk_tokens:
            return None
        cache, extras = self.disk.load_entry(self.model, self.kv, list(ids), notice=self.notice, cuts=key[1])
        if cache is None:
            return None
        logits = extras.get("logits")
        self._remember(key, [c.state() for c in cache], logits)
        return cache, logits

    def best(
        self, ids: list[int], ends: list[int], complete: bool = False, cuts: tuple = ()
    ) -> tuple[int, list | None, torch.Tensor | None]:
        """The longest stored prefix of `ids` among the lengths `ends`: (its length, a fresh
        cache holding it, the logits after it or None), or (0, None, None). Only an entry
        filled with the same chunk ends counts (`cuts`: those off the grid; what a row
        computes depends on its chunk). With `complete` (ids is a whole prompt, and
        something must predict its next token) an entry of all of `ids` counts only with
        its logits."""
        for n in sorted({e for e in ends if 0 < e <= len(ids)}, reverse=True):
            found = self._entry(ids[:n], cuts)
            if found is not None and not (complete and n == len(ids) and found[1] is None):
                return self._hit(n), found[0], found[1]
        self.misses += 1
        return 0, None, None

    def _hit(self, n: int) -> int:
        self.hits += 1
        self.reused_tokens += n
        return n

    # --- fill and store -------------------------------------------------------------------
    def fill(
        self, ids: list[int], marks: list[int], progress: Callable[[int, int], None] | None = None
    ) -> tuple[int, list]:
        """A cache holding `ids`: the longest stored prefix at a mark, then prefilled
        with chunks ending at each mark (`len(ids)` is always one), each new mark stored
        in RAM and the whole of `ids` on disk too (a file per mark would hold the earlier
        marks' codes again: a 3-section read took 3 files of nearly its size). Returns (tokens taken from the store, the cache). `progress(done, total)` counts
        the tokens prefilled here, of those not taken from the store."""
        from .generate import prefill

        ends = sorted({m for m in [*marks, len(ids)] if 0 < m <= len(ids)})
        reused, cache, _ = self.best(ids, ends)
        cache = cache if cache is not None else self.model.new_cache(self.kv)
        if reused < len(ids):
            if progress:
                progress(0, len(ids) - reused)
            keep = set(ends)
            prefill(
                self.model.net,
                ids[reused:],
                cache,
                progress=progress,
                cuts=ends,
                after=lambda e: self.put(ids[:e], cache, disk=e == len(ids)) if e in keep else None,
            )
        return reused, cache

    def put(
        self, ids: list[int], cache: list, logits: torch.Tensor | None = None, cuts: tuple = (), disk: bool = True
    ) -> None:
        """Store a copy of `cache` (which holds exactly `ids`, filled with chunk ends at
        `cuts` off the grid; `logits`, if given, are those after its last token) in RAM,
        and on disk when long enough and `disk` (then the disk's files of this kind are
        pruned to `disk_bytes`). The cache stays the caller's."""
        key = _key(ids, cuts)
        if key in self._ram:
            self._ram.move_to_end(key)
            states, size, held = self._ram[key]
            if held is None and logits is not None:
                self._ram[key] = (states, size, logits.clone())
            return
        self._remember(key, [c.state() for c in cache], None if logits is None else logits.clone())
        if disk and self.disk is not None and len(ids) >= self.disk_tokens:
            extras = {"logits": logits} if logits is not None else None
            path = self.disk.save(
                self.model, self.doc, self.kv, list(ids), cache, kind=self.kind, extras=extras, cuts=key[1]
            )
            if self.disk_bytes is not None:
                self.disk.prune(self.disk_bytes, self.kind, keep=path)

    def _remember(self, key: tuple[int, ...], states: list[dict], logits: torch.Tensor | None) -> None:
        size = _state_bytes(states) + (logits.numel() * logits.element_size() if logits is not None else 0)
        if size > self.ram_bytes:
            return
        self._ram[key] = (states, size, logits)
        self.bytes += size
        while self.bytes > self.ram_bytes:
            _, (_, dropped, _) = self._ram.popitem(last=False)
            self.bytes -= dropped

    def _restore(self, states: list[dict]) -> list:
        cache = self.model.new_cache(self.kv)
        for c, s in zip(cache, states):
            c.load_state(s)
        return cache

    def stats(self) -> dict:
        """Entries, bytes, budget and hit counts (for logs, /metrics and /api/ps)."""
        looked = self.hits + self.misses
        return {
            "entries": len(self._ram),
            "bytes": self.bytes,
            "budget_bytes": self.ram_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / looked, 4) if looked else 0.0,
            "reused_tokens": self.reused_tokens,
        }
