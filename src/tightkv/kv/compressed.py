"""The compressed per-layer KV cache: attention straight from the packed codes.

Layout of one layer's history (positions are absolute token indices):

    [0, S)           sink: exact (fp16), the first S tokens
    [S, body_end)    body: compressed by the K and V codecs, in units of `tile` tokens
    [body_end, offset) recent pool: exact (fp16); holds at least the last R tokens

A query at position p sees the key/value j as it is stored *for it*: exact when
j < S or j >= b(p), compressed otherwise, where

    c(p) = S + G * floor(max(0, p + 1 - S - R) / G)   (body end at p in decode)
    b(p) = max(c(p), body end before this call)

G (`flush`) is the tile, raised to a multiple of it of at least FLUSH tokens when
the cache keeps a recent window: tokens then leave the window FLUSH at a time, so
the window holds R to R + G - 1 exact tokens and decode encodes once per G steps
instead of every step. Without a recent window (``-paper`` types, ``window=0``)
G is the tile: every token is encoded as soon as it is written.

So decode and a chunked prefill of any chunk size see exactly the same data, and
a prefill really attends over compressed keys: the chunk is appended (its tokens
that leave the recent window are encoded) before it is attended. Tokens are
encoded from their fp16 exact copy, so the codes never depend on the chunking.

Attention (`attend`) never materializes the history in full precision: it rotates
the queries into the key codec's domain once, walks the body block by block (a
block is decoded, scored and folded into an online softmax, then freed), keeps
value sums for the body in the value codec's domain and rotates them back once.

Our variants centre: a fixed per-channel vector c_k (the mean of the first keys
the layer compresses) is subtracted before encoding; scores of body keys get
q . c_k added back, which is exact. Values likewise: out += c_v * (body weight).
Sliding-window layers keep only what a future query can see.
"""

from __future__ import annotations

import torch

from . import fused
from .cache import with_sinks
from .codecs import Codec

_NEG_INF = float("-inf")
FLUSH = 32  # tokens leave the recent window in groups of at least this many


def flush_tokens(tile: int, recent: int) -> int:
    """G: the compression granularity of a cache with this tile and recent window."""
    return tile * -(-FLUSH // tile) if recent else tile


def boundary(p: torch.Tensor | int, sink: int, recent: int, tile: int):
    """c(p): where the compressed body ends for a query at position p (decode order)."""
    if isinstance(p, int):
        return sink + tile * (max(0, p + 1 - sink - recent) // tile)
    return sink + tile * torch.div((p + 1 - sink - recent).clamp_min(0), tile, rounding_mode="floor")


class CompressedCache:
    """A layer cache with independent K and V codecs, an exact sink and recent window.

    Args:
        kcodec, vcodec: codecs for keys and values (see codecs.py).
        num_kv_heads: Hkv.
        window: the layer's sliding window in tokens, or None for global attention.
        sink, recent: exact first / last tokens (0 turns each off).
        max_tokens: the context length, if known: the body store is reserved for it once
            (address space only; pages become resident as codes are written), so it is
            never copied to grow. Without it the store grows by half its size at a time.
    """

    step = 256  # growth of the exact store, in tokens
    reread = False  # a later layer attends this one's last rows again (`kv.shared`)
    block_elems = 1 << 18  # body elements decoded at a time per K or V (1 MiB of float32)

    def __init__(
        self,
        kcodec: Codec,
        vcodec: Codec,
        num_kv_heads: int,
        window: int | None = None,
        sink: int = 4,
        recent: int = 128,
        max_tokens: int | None = None,
    ):
        self.kc, self.vc = kcodec, vcodec
        self.tile = max(kcodec.tile, vcodec.tile)
        if self.tile % kcodec.tile or self.tile % vcodec.tile:
            raise ValueError(f"tiles {kcodec.tile} and {vcodec.tile} do not nest")
        self.hkv, self.dk, self.dv = num_kv_heads, kcodec.dim, vcodec.dim
        self.window, self.sink, self.recent = window, sink, recent
        self.max_tokens = max_tokens
        self.offset = 0
        # exact store: [sink entries for positions 0..nsink-1][pool entries for positions pool_start..offset-1]
        self.exact_k = torch.empty(self.hkv, 0, self.dk, dtype=torch.float16)  # (Hkv, capacity, D)
        self.exact_v = torch.empty(self.hkv, 0, self.dv, dtype=torch.float16)  # (Hkv, capacity, Dv)
        self.nsink = 0  # sink entries at the front of the exact store
        self.pool_start = sink  # position of the first pool entry
        # body store: fields (Hkv, capacity units, ...); unit u holds positions body_start + u*tile ..
        self.body_k: dict[str, torch.Tensor] = {}
        self.body_v: dict[str, torch.Tensor] = {}
        self.body_start = self.body_end = sink
        self.k_units, self.v_units = self.tile // kcodec.tile, self.tile // vcodec.tile  # codec units per unit
        self.flush = flush_tokens(self.tile, recent)
        # fixed per-channel vectors set at the first compression: x = centre + scale * code
        self.kcenter: torch.Tensor | None = None  # (Hkv, D) fp16
        self.vcenter: torch.Tensor | None = None  # (Hkv, Dv) fp16
        self.kscale: torch.Tensor | None = None  # (Hkv, D) fp16
        self.vscale: torch.Tensor | None = None  # (Hkv, Dv) fp16
        self._qsq = torch.zeros(self.hkv, self.dk, dtype=torch.float64)  # query sum of squares, first block
        self._qstep: torch.Tensor | None = None  # decode steps' squares (Hkv, H/Hkv, D) float32, folded into _qsq
        self._qn = 0
        self._bound: tuple[int, torch.Tensor | None] = (-1, None)  # the last decode bound and its tensor (1,)
        self.fused = fused.takes(kcodec, vcodec, self.tile)  # attention may take the fused kernel
        self._kernel_inputs: tuple = ((), None)

    # --- protocol -------------------------------------------------------------
    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        sinks: torch.Tensor | None = None,
        steps: bool = False,
    ) -> torch.Tensor:
        """steps: the rows computed as decode steps, where `steps_exact` said so (a verification)."""
        if self.reread:  # what these rows see stays held for attend_last: forget before the next append
            self._forget()
        b = self._last_b = self.append(k, v, q)
        out = self.attend_stored(q, b, scale, sinks, steps)
        if not self.reread:
            self._forget()
        return out

    def steps_exact(self, T: int) -> bool:
        """Whether attending T new positions at once gives each what T decode steps give."""
        return fused.steps_exact(T, self.dk, self.dv, self.fused)

    def attend_last(self, q: torch.Tensor, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Attend q (H, T, D) at the last T positions over the stored history, appending
        nothing: a layer sharing this one's KV (`kv.shared`), after this one's attend."""
        b = self._last_b
        return self.attend_stored(q, b[b.shape[0] - q.shape[1] :], scale, sinks)

    def append(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """Store new tokens: exact first, then encode those that leave the recent window.
        Returns b (T,): for each new position, where the body it sees ends. The queries
        q (H, T, D), if given, inform the key channel scales."""
        start, end = self.offset, self.offset + k.shape[1]
        body_before = self.body_end
        if q is not None and self.kc.balance and self.kscale is None:
            self._add_query_squares(q, start, end)
        self._append_exact(k, v)
        self._compress(max(self.body_end, boundary(end - 1, self.sink, self.recent, self.flush)))
        if end - start == 1:  # decode: plain ints, and the tensor of the step before while the bound holds
            bound = max(boundary(start, self.sink, self.recent, self.flush), body_before)
            if bound != self._bound[0]:
                self._bound = (bound, torch.tensor([bound]))
            return self._bound[1]
        return boundary(torch.arange(start, end), self.sink, self.recent, self.flush).clamp_min(body_before)

    def attend_stored(
        self, q: torch.Tensor, b: torch.Tensor, scale: float, sinks: torch.Tensor | None = None, steps: bool = False
    ) -> torch.Tensor:
        """Attend q (H, T, D), the last T positions, over the stored history -> (H, T, Dv);
        sinks (H,): a logit per head that joins each softmax with no value, or None."""
        T = q.shape[1]
        out = fused.compressed_attend(self, q, self.offset - T, b, scale, sinks, steps)
        if out is None:  # formats or shapes it does not take: the torch reference
            out = self._attention(q, torch.arange(self.offset - T, self.offset), b, scale, sinks)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def kernel_inputs(self) -> tuple:
        """`fused.kernel_inputs` of this cache, kept while its stores and channel vectors stay."""
        key = (
            self.exact_k,
            self.exact_v,
            *self.body_k.values(),
            *self.body_v.values(),
            self.kscale,
            self.kcenter,
            self.vscale,
            self.vcenter,
        )
        old = self._kernel_inputs[0]
        if len(key) != len(old) or any(a is not b for a, b in zip(key, old)):
            self._kernel_inputs = (key, fused.kernel_inputs(self))
        return self._kernel_inputs[1]

    exact_trim = False  # trimming keeps codes and centring fitted on the later tokens

    def can_trim(self, n: int) -> bool:
        return isinstance(self._trim_plan(n), tuple)

    def trim(self, n: int) -> None:
        plan = self._trim_plan(n)
        if isinstance(plan, str):
            raise ValueError(plan)
        new, body_end, nsink, pool_start = plan
        self.body_end, self.nsink, self.pool_start, self.offset = body_end, nsink, pool_start, new
        if self.body_end == self.body_start == self.sink:  # nothing compressed: centre afresh, as a new cache would
            self.kcenter = self.vcenter = self.kscale = self.vscale = None

    def _trim_plan(self, n: int) -> tuple[int, int, int, int] | str:
        """(offset, body_end, nsink, pool_start) after trimming n tokens, or why it cannot be done."""
        new = self.offset - n
        if n == 0:
            return new, self.body_end, self.nsink, self.pool_start
        if n < 0 or new < 0:
            return f"cannot trim {n} tokens from a cache holding {self.offset}"
        if self.window is not None and not self._holds_from(max(0, new - self.window + 1)):
            return "cannot trim: this sliding-window cache no longer holds the tokens it would need"
        # the body end for the new offset, as far as exact copies of its tokens remain
        top = max(self.sink, new)
        target = boundary(new - 1, self.sink, self.recent, self.flush) if new > self.sink else self.sink
        lower = max(target, min(self.pool_start, top))
        g = self.body_start + -(-max(0, lower - self.body_start) // self.tile) * self.tile
        body_end = self.body_end
        if g < self.body_end and g <= top:
            body_end = g
        elif self.body_end > top:
            return f"cannot trim into a compressed tile of {self.tile} tokens"
        nsink = min(self.nsink, new) if new < self.sink else self.nsink
        return new, body_end, nsink, min(self.pool_start, top)

    @property
    def nbytes(self) -> int:
        """Bytes held: body codes and scales, exact sink and pool, centring vectors."""
        u0, u1 = self._live_units()
        total = sum(t[:, u0:u1].numel() * t.element_size() for f in (self.body_k, self.body_v) for t in f.values())
        ns, p0, p1 = self._live_exact()
        total += (ns + p1 - p0) * self.hkv * (self.dk + self.dv) * 2
        for c in (self.kcenter, self.vcenter, self.kscale, self.vscale):
            if c is not None:
                total += c.numel() * c.element_size()
        return total

    def bytes_at(self, tokens: int) -> int:
        return layer_bytes(self.kc, self.vc, self.hkv, self.window, self.sink, self.recent, tokens)

    def state(self) -> dict[str, torch.Tensor]:
        u0, u1 = self._live_units()
        p0, p1 = self._live_exact()[1:]
        p0 = max(p0, self.sink)  # below the sink (offset < sink) the pool is empty and starts at the sink
        out = {f"k.{n}": t[:, u0:u1].clone() for n, t in self.body_k.items()}
        out.update({f"v.{n}": t[:, u0:u1].clone() for n, t in self.body_v.items()})
        idx = torch.cat([torch.arange(self.nsink), self._pool_index(p0) + torch.arange(max(0, p1 - p0))])
        out["ek"], out["ev"] = self.exact_k[:, idx].clone(), self.exact_v[:, idx].clone()
        for name in ("kcenter", "vcenter", "kscale", "vscale"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).clone()
        out["meta"] = torch.tensor(
            [
                self.offset,
                self.body_start + u0 * self.tile,
                self.body_end,
                self.nsink,
                p0,
                self.sink,
                self.recent,
                self.tile,
                self._qn,
            ],
            dtype=torch.int64,
        )
        out["query_sq"] = self._query_sq().clone()  # what the key scales are fitted from, until they are
        return out

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        offset, body_start, body_end, nsink, p0, sink, recent, tile, qn = (int(x) for x in state["meta"])
        if (sink, recent, tile) != (self.sink, self.recent, self.tile):
            raise ValueError("state was saved by a cache with another sink, recent window or tile")
        self.offset, self.body_start, self.body_end, self.nsink, self.pool_start = (
            offset,
            body_start,
            body_end,
            nsink,
            p0,
        )
        self._qsq, self._qn = state["query_sq"].to(torch.float64).clone(), qn
        self._qstep = None
        self.body_k = {n[2:]: t.clone() for n, t in state.items() if n.startswith("k.")}
        self.body_v = {n[2:]: t.clone() for n, t in state.items() if n.startswith("v.")}
        self.kcenter, self.vcenter = state.get("kcenter"), state.get("vcenter")
        self.kscale, self.vscale = state.get("kscale"), state.get("vscale")
        self.exact_k, self.exact_v = state["ek"].to(torch.float16).clone(), state["ev"].to(torch.float16).clone()

    # --- storage ----------------------------------------------------------------
    def _pool_index(self, pos: int) -> int:
        return self.nsink + (pos - self.pool_start)

    def _append_exact(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens after the held ones: sink entries first, then the pool."""
        T = k.shape[1]
        start, end = self.offset, self.offset + T
        i0 = start if start < self.sink else self._pool_index(start)  # below the sink the pool is empty
        if i0 + T > self.exact_k.shape[1]:
            cap = (i0 + T + self.step - 1) // self.step * self.step
            self.exact_k, self.exact_v = _grow(self.exact_k, cap, 1), _grow(self.exact_v, cap, 1)
        self.exact_k[:, i0 : i0 + T] = k
        self.exact_v[:, i0 : i0 + T] = v
        if start < self.sink:
            self.nsink = min(self.sink, end)
        self.offset = end

    def _compress(self, new_end: int) -> None:
        """Encode positions [body_end, new_end) from their exact copies into the body."""
        if new_end <= self.body_end:
            return
        i0 = self._pool_index(self.body_end)
        k = self.exact_k[:, i0 : i0 + new_end - self.body_end].float()
        v = self.exact_v[:, i0 : i0 + new_end - self.body_end].float()
        if self.kcenter is None and self.kscale is None and (self.kc.center or self.kc.balance):
            self.kcenter, self.kscale = self._fit_channels(self.exact_k, self.kc, self._query_rms())
        if self.vcenter is None and self.vscale is None and (self.vc.center or self.vc.balance):
            self.vcenter, self.vscale = self._fit_channels(self.exact_v, self.vc, None)
        if self.kcenter is not None:
            k = k - self.kcenter.float()[:, None]
        if self.kscale is not None:
            k = k / self.kscale.float()[:, None]
        if self.vcenter is not None:
            v = v - self.vcenter.float()[:, None]
        if self.vscale is not None:
            v = v / self.vscale.float()[:, None]
        kf = fused.encode(self.kc, k) or self.kc.encode(k)  # tq4: the C++ encoder where available
        vf = fused.encode(self.vc, v) or self.vc.encode(v)
        units = (new_end - self.body_end) // self.tile
        have = (self.body_end - self.body_start) // self.tile
        for store, new in ((self.body_k, kf), (self.body_v, vf)):
            for name, t in new.items():
                if t.shape[1] != units:  # several codec units per cache unit
                    t = t.reshape(t.shape[0], units, t.shape[1] // units, *t.shape[2:])
                old = store.get(name)
                if old is None or old.shape[1] < have + units:
                    old = _grow(old if old is not None else t[:, :0], self._body_capacity(have + units), 1)
                    store[name] = old
                old[:, have : have + units] = t
        self.body_end = new_end

    def _body_capacity(self, need: int) -> int:
        """Units to allocate for the body when `need` do not fit."""
        if self.window is not None:  # live units, and as many dead ones before `_forget` compacts
            live = -(-(self.window + self.tile) // self.tile) + 1
            return max(need, 2 * live + 2)
        if self.max_tokens is not None and need * self.tile <= self.max_tokens:
            return -(-(self.max_tokens - self.sink) // self.tile)
        return max(need, 64, need * 3 // 2)

    def _decode(self, which: str, u0: int, u1: int) -> torch.Tensor:
        """Body units [u0, u1) of keys or values, decoded to the codec's domain (Hkv, n, dim)."""
        codec, fields, r = (
            (self.kc, self.body_k, self.k_units) if which == "k" else (self.vc, self.body_v, self.v_units)
        )
        if r == 1:
            return codec.decode({n: t[:, u0:u1] for n, t in fields.items()})
        return codec.decode({n: t[:, u0:u1].flatten(1, 2) for n, t in fields.items()})

    def _first_block(self, store: torch.Tensor) -> torch.Tensor:
        """The first recent + flush pool tokens (Hkv, n, dim): those held when decode first
        compresses, so what is fitted on them does not depend on the prompt's chunking."""
        first = max(self.body_end, self.pool_start)
        i0 = self._pool_index(first)
        i1 = self._pool_index(min(self.offset, first + self.recent + self.flush))
        return store[:, i0:i1].float()

    def _add_query_squares(self, q: torch.Tensor, start: int, end: int) -> None:
        """Add the squares of the queries q (H, T, D) at positions [start, end) that fall in
        the first block to the sums the key scales are fitted from. A decode step adds its
        row into a float32 buffer in one op (the sums of a few hundred squares: float32 is
        plenty; a step's torch calls cost more than its attention at short context)."""
        lo, hi = max(start, self.sink), min(end, self.sink + self.recent + self.flush)
        if hi <= lo:
            return
        if end - start == 1:
            qv = q.reshape(self.hkv, -1, self.dk)  # (Hkv, H/Hkv, D)
            if self._qstep is None:
                self._qstep = torch.zeros(qv.shape)  # float32 whatever q's dtype
            self._qstep.addcmul_(qv, qv)
        else:
            qs = q[:, lo - start : hi - start].reshape(self.hkv, -1, self.dk)  # (Hkv, rows, D)
            self._qsq += torch.linalg.vecdot(qs, qs, dim=1)
        self._qn += (hi - lo) * q.shape[0] // self.hkv

    def _query_sq(self) -> torch.Tensor:
        """The queries' sums of squares so far (Hkv, D) float64."""
        return self._qsq if self._qstep is None else self._qsq + self._qstep.double().sum(1)

    def _query_rms(self) -> torch.Tensor | None:
        return (self._query_sq() / self._qn).sqrt().float() if self._qn else None

    def _fit_channels(self, store: torch.Tensor, codec: Codec, query_rms: torch.Tensor | None):
        """Centre c and scale w per channel, so the codec encodes (x - c) / w.

        w balances the error across channels: for values w = sqrt(std), which minimizes
        the output error of a per-vector codec; for keys w = sqrt(std / rms(q)), which
        minimizes the score error given the queries seen so far. Both are exact for
        attention: w folds into the query and into the value sum."""
        x = self._first_block(store)
        center = x.mean(1) if codec.center else torch.zeros(x.shape[0], x.shape[2])
        scale = None
        if codec.balance:
            std = (x - center[:, None]).pow(2).mean(1).sqrt().clamp_min(1e-6)
            w = std / query_rms.clamp_min(1e-6) if query_rms is not None else std
            w = w.sqrt()
            w = (w / w.log().mean(-1, keepdim=True).exp()).clamp(1 / 64, 64)
            scale = w.half()
        return (center.half() if codec.center else None), scale

    def _horizon(self) -> int:
        """Positions below this are invisible to every future query."""
        return 0 if self.window is None else max(0, self.offset - self.window + 1)

    def _live_units(self) -> tuple[int, int]:
        n = (self.body_end - self.body_start) // self.tile
        dead = max(0, self._horizon() - self.body_start) // self.tile
        return min(dead, n), n

    def _live_exact(self) -> tuple[int, int, int]:
        """Live sink entries [0, ns) (the sink lives while any of it is visible) and live
        pool positions [p0, offset)."""
        h = self._horizon()
        ns = self.nsink if self.nsink > h else 0
        return ns, min(self.offset, max(self.body_end, h, self.pool_start)), self.offset

    def compacts_after(self) -> int | float:
        """How many more tokens (no encode between) until `_forget` compacts the stores of this
        sliding layer, dropping what trimming back would need: the k-th new token's; inf if never."""
        o, w, inf = self.offset, self.window, float("inf")
        n = (self.body_end - self.body_start) // self.tile
        need = _units_to_compact(n)
        body = self.body_start + need * self.tile + w - 1 - o if n >= need else inf
        dead = max(self.body_end, self.pool_start) - self.pool_start  # pool entries dead already
        sink = inf
        if _compacts_exact(dead + self.nsink, self.exact_k.shape[1]):  # once the sink leaves the window
            sink = 1 if _compacts_exact(dead, self.exact_k.shape[1]) else self.nsink + w - 1 - o
        return max(1, min(body, sink))

    def _holds_from(self, pos: int) -> bool:
        """Whether every position in [pos, offset) is still stored (exact or compressed)."""
        if pos < self.sink and self.nsink < min(self.sink, self.offset):
            return False
        p = max(pos, self.sink)
        return self.body_start <= p if self.body_end > self.body_start else self.pool_start <= p

    def _forget(self) -> None:
        """Compact the stores once enough of them is dead (compressed, or out of the window)."""
        if self.window is None and self.body_end <= self.pool_start:
            return  # nothing dead: a global cache whose pool holds no token the body also holds
        u0, n = self._live_units()
        if u0 >= _units_to_compact(n):  # (`compacts_after` says when, ahead)
            for store in (self.body_k, self.body_v):
                for t in store.values():  # move the live units to the front, in place
                    t[:, : n - u0] = t[:, u0:n].clone()
            self.body_start += u0 * self.tile
        ns, p0, p1 = self._live_exact()
        p0 = max(self.body_end, self.pool_start)  # dead tokens not yet compressed stay until they are
        dead = (self.nsink - ns) + (p0 - self.pool_start)
        if _compacts_exact(dead, self.exact_k.shape[1]):
            idx = torch.cat([torch.arange(ns), self._pool_index(p0) + torch.arange(p1 - p0)])
            cap = max(self.step, (idx.numel() + self.step - 1) // self.step * self.step)
            self.exact_k, self.exact_v = _take(self.exact_k, idx, cap), _take(self.exact_v, idx, cap)
            self.nsink, self.pool_start = ns, p0
            self._kernel_inputs = ((), None)  # let the old stores go now, not at the next attend

    # --- attention ----------------------------------------------------------------
    def _attention(
        self, q: torch.Tensor, q_pos: torch.Tensor, b: torch.Tensor, scale: float, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q (H, T, D) at positions q_pos (T,); body visible below b (T,) -> (H, T, Dv)."""
        H, T, D = q.shape
        g = H // self.hkv
        qf = q.float().reshape(self.hkv, g * T, D)
        win = self.window
        # exact part: sink and pool, masked per query
        pos = torch.cat([torch.arange(self.nsink), torch.arange(self.pool_start, max(self.pool_start, self.offset))])
        n_ex = pos.numel()
        diff = q_pos[:, None] - pos[None, :]
        mask = (diff >= 0) & ((pos[None, :] < self.sink) | (pos[None, :] >= b[:, None]))
        if win is not None:
            mask &= diff < win
        s = (qf @ self.exact_k[:, :n_ex].float().transpose(1, 2)).view(self.hkv, g, T, n_ex) * scale
        s = s.masked_fill(~mask, _NEG_INF)
        m = s.amax(-1)
        m_safe = torch.where(m == _NEG_INF, 0.0, m)
        p = torch.exp(s - m_safe[..., None])
        l = p.sum(-1)
        acc = p.view(self.hkv, g * T, n_ex) @ self.exact_v[:, :n_ex].float()  # (Hkv, gT, Dv)
        # compressed body, block by block
        n_units = (self.body_end - self.body_start) // self.tile
        u0 = 0
        lo = int(q_pos[0]) - win + 1 if win is not None else 0
        hi = int(b.max())
        u_lo = max(u0, (lo - self.body_start) // self.tile) if lo > self.body_start else u0
        u_hi = min(n_units, max(0, -(-(hi - self.body_start) // self.tile)))
        if u_hi > u_lo:
            qk = self.kc.to_code(qf if self.kscale is None else qf * self.kscale.float()[:, None, :])
            qc = (qf @ self.kcenter.float()[:, :, None]).view(self.hkv, g, T, 1) if self.kcenter is not None else None
            acc_c = torch.zeros(self.hkv, g * T, self.dv)
            l_c = torch.zeros(self.hkv, g, T) if self.vcenter is not None else None
            step = max(1, self.block_elems // (self.tile * self.hkv * max(self.dk, self.dv)))
            for u in range(u_lo, u_hi, step):
                ue = min(u + step, u_hi)
                kb = self._decode("k", u, ue)  # (Hkv, n, D) code domain
                n = kb.shape[1]
                kpos = self.body_start + u * self.tile + torch.arange(n)
                diff = q_pos[:, None] - kpos[None, :]
                mask = (kpos[None, :] < b[:, None]) & (diff >= 0)
                if win is not None:
                    mask &= diff < win
                s = (qk @ kb.transpose(1, 2)).view(self.hkv, g, T, n)
                if qc is not None:
                    s = s + qc
                s = (s * scale).masked_fill(~mask, _NEG_INF)
                m_new = torch.maximum(m, s.amax(-1))
                m_safe = torch.where(m_new == _NEG_INF, 0.0, m_new)
                alpha = torch.exp(m - m_safe)
                p = torch.exp(s - m_safe[..., None])
                l = l * alpha + p.sum(-1)
                a = alpha.view(self.hkv, g * T, 1)
                acc = acc * a
                vb = self._decode("v", u, ue)  # (Hkv, n, Dv)
                acc_c = acc_c * a + p.view(self.hkv, g * T, n) @ vb
                if l_c is not None:
                    l_c = l_c * alpha + p.sum(-1)
                m = m_new
            acc_c = self.vc.from_code(acc_c)
            acc = acc + (acc_c if self.vscale is None else acc_c * self.vscale.float()[:, None, :])
            if l_c is not None:
                acc = acc + l_c.view(self.hkv, g * T, 1) * self.vcenter.float()[:, None, :]
        if sinks is not None:
            acc, l = with_sinks(acc, l, m, sinks.view(self.hkv, g, 1))
        out = acc / l.view(self.hkv, g * T, 1)
        return out.view(H, T, self.dv)

    # --- for tests and tools: never used by attention -------------------------------
    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The held history decoded to float32 in the original domain: keys (Hkv, N, D),
        values (Hkv, N, Dv), positions (N,), exact flags (N,). Test helper: builds the
        full-precision copy that `attend` never does."""
        u0, n = 0, (self.body_end - self.body_start) // self.tile
        ks = [self.exact_k[:, : self.nsink].float()]
        vs = [self.exact_v[:, : self.nsink].float()]
        pos = [torch.arange(self.nsink)]
        exact = [torch.ones(self.nsink, dtype=torch.bool)]
        if n > u0:
            k = self.kc.from_code(self._decode("k", u0, n))
            v = self.vc.from_code(self._decode("v", u0, n))
            if self.kscale is not None:
                k = k * self.kscale.float()[:, None]
            if self.vscale is not None:
                v = v * self.vscale.float()[:, None]
            if self.kcenter is not None:
                k = k + self.kcenter.float()[:, None]
            if self.vcenter is not None:
                v = v + self.vcenter.float()[:, None]
            ks.append(k)
            vs.append(v)
            pos.append(self.body_start + u0 * self.tile + torch.arange(k.shape[1]))
            exact.append(torch.zeros(k.shape[1], dtype=torch.bool))
        i0 = self._pool_index(self.pool_start)
        top = max(self.pool_start, self.offset)
        ks.append(self.exact_k[:, i0 : self._pool_index(top)].float())
        vs.append(self.exact_v[:, i0 : self._pool_index(top)].float())
        pos.append(torch.arange(self.pool_start, top))
        exact.append(torch.ones(top - self.pool_start, dtype=torch.bool))
        return torch.cat(ks, 1), torch.cat(vs, 1), torch.cat(pos), torch.cat(exact)


def _grow(t: torch.Tensor, capacity: int, dim: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = capacity
    new = torch.empty(shape, dtype=t.dtype)
    new.narrow(dim, 0, t.shape[dim]).copy_(t)
    return new


def _units_to_compact(n: int) -> int:
    """Dead body units from which `_forget` compacts a body of n units (64, or half of it)."""
    return max(1, min(64, -(-n // 2)))


def _compacts_exact(dead: int, capacity: int) -> bool:
    """Whether `_forget` compacts an exact store of `capacity` entries with `dead` of them dead."""
    return dead >= 64 or bool(dead and 2 * dead >= capacity)


def _take(t: torch.Tensor, idx: torch.Tensor, capacity: int) -> torch.Tensor:
    new = torch.empty(t.shape[0], capacity, t.shape[2], dtype=t.dtype)
    new[:, : idx.numel()] = t[:, idx]
    return new


def layer_bytes(
    kcodec: Codec, vcodec: Codec, num_kv_heads: int, window: int | None, sink: int, recent: int, tokens: int
) -> int:
    """What `CompressedCache.nbytes` is after `tokens` tokens: bits per element times
    elements for the body, fp16 for the exact sink and pool, plus centring vectors."""
    tile = max(kcodec.tile, vcodec.tile)
    h = num_kv_heads
    cend = boundary(tokens - 1, sink, recent, flush_tokens(tile, recent)) if tokens > sink else sink
    horizon = 0 if window is None else max(0, tokens - window + 1)
    units = (cend - sink) // tile
    dead = min(units, max(0, horizon - sink) // tile)
    live = units - dead
    body = live * tile * h * (kcodec.dim * kcodec.bits + vcodec.dim * vcodec.bits) / 8
    n_sink = min(sink, tokens)
    exact = (n_sink if n_sink > horizon else 0) + max(0, tokens - max(cend, horizon, sink))
    meta = 0
    if units:
        for c in (kcodec, vcodec):
            meta += h * c.dim * 2 * (int(c.center) + int(c.balance))
    return int(round(body)) + exact * h * (kcodec.dim + vcodec.dim) * 2 + meta
