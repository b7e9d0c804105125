"""A layer that keeps no KV of its own: it attends over an earlier layer's cache.

Gemma 4's last ``attention.shared_kv_layers`` layers compute queries only; each reads the KV
of the last earlier layer of its own kind (sliding or global) that has KV, as llama.cpp and
transformers decide. Its cache entry is a `SharedCache` over that layer's cache: the history
is stored once, a shared layer holds 0 bytes, and `trim`, `state`, `load_state` leave it to
the source, which is earlier in the same list (so restored, trimmed and batched first).

`attend(q, None, None, scale)` attends q, the rows of this forward, over the source as it
stands after the source appended them (`attend_last` of `cache.DenseCache` and
`compressed.CompressedCache`). A source (``reread``) drops what leaves its window, and a
compressed one the exact copies of what it encoded, before its next append instead of after
its attend: the first rows of a prefill chunk see further back than the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SharedLayout:
    """A layer's entry in `ModelArgs.cache_layout`: it reads the KV of layer `source`."""

    source: int

    def make_cache(self, caches: list) -> SharedCache:
        """Its cache over `caches[source]` (the caches made so far for the earlier layers),
        which from now on keeps what its last rows saw until its next append (`reread`)."""
        source = caches[self.source]
        source.reread = True
        return SharedCache(source)


class SharedCache:
    """The cache protocol over another layer's cache, holding nothing itself."""

    exact_trim = True  # nothing to restore: the source restores itself

    def __init__(self, source):
        self.source = source

    @property
    def offset(self) -> int:
        return self.source.offset

    @property
    def window(self) -> int | None:
        return self.source.window

    @property
    def sink(self) -> int:
        return self.source.sink

    @property
    def recent(self) -> int:
        return self.source.recent

    def attend(self, q: torch.Tensor, k, v, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q (H, T, D) at the last T positions the source appended -> (H, T, Dv); k, v unused (None)."""
        return self.source.attend_last(q, scale, sinks)

    def can_trim(self, n: int) -> bool:
        return True

    def trim(self, n: int) -> None:
        """Nothing: the source's own trim moves this layer's history too."""

    @property
    def nbytes(self) -> int:
        return 0

    def bytes_at(self, tokens: int) -> int:
        return 0

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Nothing to load: the source's state is this layer's."""
