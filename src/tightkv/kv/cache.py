"""The per-layer KV-cache protocol, and the dense (f32 / f16 / bf16) cache.

A model calls ``cache.attend(q, k, v, scale)`` once per layer and step: the cache
stores the new keys and values in its own format, then attends the queries over
what it stores. Model files know nothing about formats; a format knows nothing
about models.

Shapes: ``q`` (H, T, D) for the T new positions ``offset .. offset+T-1``;
``k`` (Hkv, T, D) and ``v`` (Hkv, T, Dv) are the new tokens after RoPE; the output
is (H, T, Dv). H is a multiple of Hkv (grouped-query attention). ``sinks`` (H,), where a
model has them (gpt-oss), is a learned logit per head that joins every softmax as one more
score with no value: it takes weight from the tokens without adding anything.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from . import fused
from .codecs import DENSE_DTYPES


class LayerCache(Protocol):
    """What every per-layer cache provides."""

    offset: int  # absolute position of the next token
    window: int | None  # sliding window in tokens, None for global attention
    sink: int  # exact first tokens kept beside a compressed body (0 for a dense cache)
    recent: int  # exact last tokens kept beside a compressed body (0 for a dense cache)
    exact_trim: bool  # trim(n) gives back exactly the state of n tokens ago

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append k, v for the new positions, then attend q over the stored history."""
        ...

    def can_trim(self, n: int) -> bool:
        """Whether `trim(n)` is possible (a sliding window or a compressed tile may have
        dropped what going back needs)."""
        ...

    def trim(self, n: int) -> None:
        """Forget the last n tokens; ValueError where `can_trim(n)` is False."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held for the stored history, metadata included."""
        ...

    def bytes_at(self, tokens: int) -> int:
        """What `nbytes` is once this (empty) layout holds `tokens` tokens."""
        ...

    def state(self) -> dict[str, torch.Tensor]:
        """Tensors (copies) that reproduce this cache with `load_state`: what it holds, no more."""
        ...

    def load_state(self, state: dict[str, torch.Tensor]) -> None: ...


def trim_to(cache: list, keep: int) -> bool:
    """Trim every layer back to `keep` tokens if every layer can; False (nothing changed) otherwise."""
    if not all(c.can_trim(c.offset - keep) for c in cache):
        return False
    for c in cache:
        c.trim(c.offset - keep)
    return True


def positions(cache: list, T: int) -> torch.Tensor:
    """The positions (T,) of the rows a forward over `cache` runs: one sequence's next T
    tokens, or the next token of each sequence of a batch (`batch_layers`)."""
    held = getattr(cache, "positions", None)
    return held if held is not None else torch.arange(cache[0].offset, cache[0].offset + T)


class BatchLayer:
    """One layer of N sequences' caches in one forward pass: sequence i takes the next
    `rows[i]` rows (one token of a decode step, or a prompt chunk) into its own cache."""

    def __init__(self, layers: list, rows: list[int]):
        self.layers, self.rows = layers, rows

    def attend(self, q, k, v, scale, sinks=None) -> torch.Tensor:
        """q (H, R, D), k and v (Hkv, R, D), R = sum(rows): each sequence's rows in turn -> (H, R, Dv)."""
        if k is None:  # a layer reading another's KV (`kv.shared`): queries only
            k = v = q.new_empty(0, q.shape[1], 0)
        if len(self.rows) == q.shape[1]:  # a decode step: one row each, taken apart in one copy per tensor
            qs, ks, vs = (t.transpose(0, 1).contiguous().unsqueeze(2) for t in (q, k, v))  # (N, H, 1, D)
            outs = [c.attend(qs[i], ks[i], vs[i], scale, sinks) for i, c in enumerate(self.layers)]
            return torch.cat(outs, dim=1)
        outs, s = [], 0
        for c, n in zip(self.layers, self.rows):
            outs.append(c.attend(q[:, s : s + n], k[:, s : s + n], v[:, s : s + n], scale, sinks))
            s += n
        return torch.cat(outs, dim=1)


class Batch(list):
    """The per-layer `BatchLayer`s of N sequences, with their rows' positions."""

    positions: torch.Tensor


def batch_layers(caches: list[list], rows: list[int] | None = None) -> Batch:
    """N sequences' caches as one cache list for a forward of their next rows: one token
    each, or `rows[i]` tokens of sequence i."""
    rows = rows or [1] * len(caches)
    batch = Batch(BatchLayer([c[i] for c in caches], rows) for i in range(len(caches[0])))
    if all(n == 1 for n in rows):
        batch.positions = torch.tensor([c[0].offset for c in caches])
    else:
        batch.positions = torch.cat([torch.arange(c[0].offset, c[0].offset + n) for c, n in zip(caches, rows)])
    return batch


def with_sinks(
    acc: torch.Tensor, l: torch.Tensor, m: torch.Tensor, sinks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An online softmax's state (acc (Hkv, g T, Dv), l and its max m (Hkv, g, T)) with one more
    score per head, sinks (Hkv, g, 1), that has no value: (acc, l) rescaled to the new max."""
    top = torch.maximum(m, sinks)
    alpha = torch.exp(m - top)  # 0 where nothing was visible (m = -inf)
    return acc * alpha.view(acc.shape[0], -1, 1), l * alpha + torch.exp(sinks - top)


def causal_window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean (T, S): query at q_pos sees key at k_pos if k <= q and q - k < window."""
    diff = q_pos[:, None] - k_pos[None, :]
    mask = diff >= 0
    if window is not None:
        mask &= diff < window
    return mask


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention, q (H, T, D), k (Hkv, S, D), v (Hkv, S, Dv), mask (T, S) -> (H, T, Dv);
    sinks (H,) or None.

    Grouped-query heads share their KV head (``enable_gqa``), so K and V are never
    repeated; the 4-D call takes torch's fused CPU kernel (measured 1.45x faster
    than the 3-D call with the groups folded into rows). A sink is a zero key and value in
    front whose score the float mask sets to the head's logit.
    """
    H, T, D = q.shape
    if sinks is not None:
        k, v = (torch.cat([t.new_zeros(t.shape[0], 1, t.shape[2]), t], 1) for t in (k, v))
        bias = torch.zeros(T, mask.shape[1], dtype=q.dtype).masked_fill(~mask, float("-inf"))
        mask = torch.cat([sinks.to(q.dtype).view(H, 1, 1).expand(H, T, 1), bias.expand(H, T, -1)], 2)
    k, v = k.to(q.dtype)[None], v.to(q.dtype)[None]  # (1, Hkv, S, D)
    out = F.scaled_dot_product_attention(q[None], k, v, attn_mask=mask, scale=scale, enable_gqa=H != k.shape[1])
    return out[0]


class DenseCache:
    """Keys and values stored as plain tensors of one float dtype.

    Global layers keep every token; sliding-window layers keep only their last
    ``window`` tokens (unlike llama.cpp, which keeps a full-size cache for them).
    Storage grows in steps so that decode appends without reallocating.
    """

    step = 256
    sink = recent = 0
    reread = False  # a later layer attends this one's last rows again (`kv.shared`)

    def __init__(
        self, kind: str, num_kv_heads: int, head_dim: int, value_dim: int | None = None, window: int | None = None
    ):
        self.kind = kind
        self.dtype = DENSE_DTYPES[kind]
        self.window = window
        self.offset = 0
        self.start = 0  # absolute position of the first stored token
        self.length = 0  # tokens stored
        self.keys = torch.empty(num_kv_heads, 0, head_dim, dtype=self.dtype)  # (Hkv, capacity, D)
        self.values = torch.empty(num_kv_heads, 0, value_dim or head_dim, dtype=self.dtype)  # (Hkv, capacity, Dv)
        self._packed = None  # the fused kernel's segment for these stores (`fused.dense_attend`)

    def attend(self, q, k, v, scale, sinks=None, steps=False):
        """steps: the rows computed as decode steps, where `steps_exact` said so (a verification)."""
        if self.reread:  # what these rows see stays held for attend_last: drop before the next append
            self._drop_outside_window()
        self._append(k, v)
        out = self.attend_last(q, scale, sinks, steps)
        if not self.reread:
            self._drop_outside_window()
        return out

    def steps_exact(self, T: int) -> bool:
        """Whether attending T new positions at once gives each what T decode steps give."""
        return fused.steps_exact(T, self.keys.shape[2], self.values.shape[2])

    def attend_last(self, q, scale, sinks=None, steps=False):
        """Attend q (H, T, D) at the last T positions over the stored history, appending
        nothing: a layer sharing this one's KV (`kv.shared`), after this one's attend."""
        T = q.shape[1]
        out = fused.dense_attend(self, q, scale, sinks, steps)  # the fused kernel, straight from storage
        if out is not None:
            return out if out.dtype == q.dtype else out.to(q.dtype)
        # only the keys some query of the chunk can see: what else is held (tokens not yet
        # shifted out of the window) must not change the sums, so a restored cache attends alike
        lo = self.start if self.window is None else max(self.start, self.offset - T - self.window + 1)
        q_pos = torch.arange(self.offset - T, self.offset)
        k_pos = torch.arange(lo, self.start + self.length)
        mask = causal_window_mask(q_pos, k_pos, self.window)
        i0 = lo - self.start
        return dense_attention(q, self.keys[:, i0 : self.length], self.values[:, i0 : self.length], mask, scale, sinks)

    def _append(self, k, v):
        T = k.shape[1]
        need = self.length + T
        if need > self.keys.shape[1]:
            capacity = (need + self.step - 1) // self.step * self.step
            self.keys = _grow(self.keys, capacity)
            self.values = _grow(self.values, capacity)
        self.keys[:, self.length : need] = k
        self.values[:, self.length : need] = v
        self.length = need
        self.offset += T

    def _drop_outside_window(self):
        if self.window is None or self.length <= self.window:
            return
        drop = self.length - self.window
        if drop < self.step:
            return  # shift a whole step at once; the mask hides the extra tokens
        keep = self.window
        self.keys[:, :keep] = self.keys[:, drop : self.length].clone()
        self.values[:, :keep] = self.values[:, drop : self.length].clone()
        self.start += drop
        self.length = keep

    @property
    def exact_trim(self) -> bool:
        return self.window is None

    def can_trim(self, n):
        needed_from = max(0, self.offset - n - self.window + 1) if self.window else 0
        return 0 <= n <= self.length and self.start <= needed_from

    def trim(self, n):
        if not self.can_trim(n):
            raise ValueError("cannot trim: this sliding-window cache no longer holds the tokens it would need")
        self.offset -= n
        self.length -= n

    @property
    def nbytes(self):
        return self.bytes_at(self.length)

    def bytes_at(self, tokens):
        per_token = (self.keys.shape[0] * (self.keys.shape[2] + self.values.shape[2])) * self.keys.element_size()
        return (min(tokens, self.window) if self.window else tokens) * per_token

    def state(self):
        drop = max(0, self.length - self.window) if self.window else 0  # tokens not shifted out yet
        meta = torch.tensor([self.offset, self.start + drop, self.length - drop], dtype=torch.int64)
        return {
            "keys": self.keys[:, drop : self.length].clone(),
            "values": self.values[:, drop : self.length].clone(),
            "meta": meta,
        }

    def load_state(self, state):
        self.offset, self.start, self.length = (int(x) for x in state["meta"])
        self.keys = state["keys"].to(self.dtype).clone()
        self.values = state["values"].to(self.dtype).clone()


def _grow(t: torch.Tensor, capacity: int) -> torch.Tensor:
    new = torch.empty(t.shape[0], capacity, t.shape[2], dtype=t.dtype)
    new[:, : t.shape[1]] = t
    return new
