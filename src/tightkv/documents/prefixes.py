"""Filled KV caches by token prefix: in RAM (least recently used first out, by
bytes) over the on-disk store.

Whatever prompt starts with tokens already prefilled (an RLV read of a section
read before, a question about a document read by another process) takes the
longest stored prefix and prefills only the rest. An entry is each layer's
`state()` (a copy: what the cache holds, compressed as it is held), so a cache
restored from it and extended gives the same K/V as one prefill of the whole:
the caches see the same data whatever the chunking.

Entries are found by exact token ids at the lengths a caller marks (an RLV read
marks where each section ends), so a lookup costs a few hashes, not a scan of
every stored prompt. A store belongs to one model and one KV spec; the disk
files carry the same checks as the document cache (`store.cache_key`).
"""
from __future__ import annotations

import collections
from typing import Callable

from .store import DocumentStore


def available_ram() -> int:
    """Bytes of RAM available now (MemAvailable), or 4 GiB when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def default_ram_budget() -> int:
    """A quarter of the RAM available now."""
    return available_ram() // 4


def _state_bytes(states: list[dict]) -> int:
    return sum(t.numel() * t.element_size() for s in states for t in s.values())


class PrefixStore:
    """Caches by token prefix for one model and KV spec: RAM under `ram_bytes`, then
    the `disk` store (for prefixes of at least `disk_tokens` tokens).

    Attributes:
        hits, misses: lookups that found a prefix, and that found none.
        reused_tokens: tokens taken from the store instead of prefilled.
    """

    def __init__(self, model, kv, *, ram_bytes: int | None = None, disk: DocumentStore | None = None,
                 disk_tokens: int = 0, doc=None, kind: str = "prefix",
                 notice: Callable[[str], None] | None = None):
        self.model, self.kv = model, kv
        self.ram_bytes = default_ram_budget() if ram_bytes is None else ram_bytes
        self.disk, self.disk_tokens = disk, disk_tokens
        self.doc, self.kind = doc, kind  # named in the disk files' headers
        self.notice = notice
        self._ram: collections.OrderedDict[tuple[int, ...], tuple[list[dict], int]] = collections.OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._ram)

    # --- lookup ---------------------------------------------------------------------
    def get(self, ids: list[int]) -> list | None:
        """A fresh cache holding exactly `ids`, from RAM or disk, or None."""
        key = tuple(ids)
        if key in self._ram:
            self._ram.move_to_end(key)
            return self._restore(self._ram[key][0])
        if self.disk is None or len(ids) < self.disk_tokens:
            return None
        cache = self.disk.load(self.model, self.doc, self.kv, list(ids), notice=self.notice)
        if cache is not None:
            self._remember(key, [c.state() for c in cache])
        return cache

    def longest(self, ids: list[int], marks: list[int]) -> tuple[int, list | None]:
        """The longest stored prefix of `ids` among the lengths `marks`: (its length, a
        fresh cache holding it), or (0, None)."""
        for n in sorted({m for m in marks if 0 < m <= len(ids)}, reverse=True):
            cache = self.get(ids[:n])
            if cache is not None:
                self.hits += 1
                self.reused_tokens += n
                return n, cache
        self.misses += 1
        return 0, None

    # --- fill and store -------------------------------------------------------------------
    def fill(self, ids: list[int], marks: list[int],
             progress: Callable[[int, int], None] | None = None) -> tuple[int, list]:
        """A cache holding `ids`: the longest stored prefix at a mark, then prefilled
        from mark to mark (`len(ids)` is always one), each new mark stored. Returns
        (tokens taken from the store, the cache). `progress(done, total)` counts the
        tokens prefilled here, of those not taken from the store."""
        from ..engine.generate import prefill

        ends = sorted({m for m in [*marks, len(ids)] if 0 < m <= len(ids)})
        reused, cache = self.longest(ids, ends)
        cache = cache if cache is not None else self.model.new_cache(self.kv)
        held = reused
        if progress and held < len(ids):
            progress(0, len(ids) - reused)
        for end in (e for e in ends if e > held):
            prefill(self.model.net, ids[held:end], cache,
                    progress=(lambda d, n, h=held: progress(h - reused + d, len(ids) - reused)) if progress else None)
            held = end
            self.put(ids[:end], cache)
        return reused, cache

    def put(self, ids: list[int], cache: list) -> None:
        """Store a copy of `cache` (which holds exactly `ids`) in RAM, and on disk when
        long enough; the cache itself stays the caller's."""
        key = tuple(ids)
        if key in self._ram:
            self._ram.move_to_end(key)
            return
        self._remember(key, [c.state() for c in cache])
        if self.disk is not None and len(ids) >= self.disk_tokens:
            self.disk.save(self.model, self.doc, self.kv, list(ids), cache, kind=self.kind)

    def _remember(self, key: tuple[int, ...], states: list[dict]) -> None:
        size = _state_bytes(states)
        if size > self.ram_bytes:
            return
        self._ram[key] = (states, size)
        self.bytes += size
        while self.bytes > self.ram_bytes:
            _, (_, dropped) = self._ram.popitem(last=False)
            self.bytes -= dropped

    def _restore(self, states: list[dict]) -> list:
        cache = self.model.new_cache(self.kv)
        for c, s in zip(cache, states):
            c.load_state(s)
        return cache

    def stats(self) -> dict:
        """Entries, bytes, budget and hit counts (for logs, /metrics and /api/ps)."""
        looked = self.hits + self.misses
        return {"entries": len(self._ram), "bytes": self.bytes, "budget_bytes": self.ram_bytes,
                "hits": self.hits, "misses": self.misses, "hit_rate": round(self.hits / looked, 4) if looked else 0.0,
                "reused_tokens": self.reused_tokens}
