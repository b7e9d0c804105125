"""What the caches hand to the fused attention kernel (`kernels/attention.py`).

The kernel knows buffers and shapes only. Here a cache's stores become its
segments (exact sink, exact pool, compressed body), each query position's
visible range in each, and the codec tables (rotation, channel centre and
scale, codebook); a codec says what it hands over through `kernel_kind` (an
`abi.Kind`) and `kernel_fields`. Every function returns None where the kernel does not apply
(the reference backend, no compiler, a format or shape it does not take): the
caller then takes the torch reference path.
"""

from __future__ import annotations

import torch

from ..kernels import attention as kernel
from ..kernels.abi import CODEBOOK_KINDS, Kind
from ..kernels.attention import BLOCK, MAX_T
from .rotation import rotation_block, rotation_signs


def takes(kcodec, vcodec, tile: int) -> bool:
    """Whether the kernel can attend over a compressed cache with these codecs: kinds it
    knows, head dims it takes, and groups of tokens that its 32-token blocks never straddle."""
    return (
        isinstance(kcodec.kernel_kind, Kind)
        and isinstance(vcodec.kernel_kind, Kind)
        and kernel.dims_ok(kcodec.dim, vcodec.dim)
        and all(r == 1 or (r % BLOCK == 0 and tile % r == 0) for c in (kcodec, vcodec) for r in c.kernel_rows)
    )


def steps_exact(T: int, d: int, dv: int, takes_kernel: bool = True) -> bool:
    """Whether one call (``attend(..., steps=True)``) for the next T positions of a cache of head
    dims d, dv computes each position bit for bit as its own decode step would: the kernel's
    steps calls (each row's tokens split as its decode step splits them, from the first token
    its window shows); `takes_kernel`: whether the cache's formats take the kernel."""
    return takes_kernel and T <= MAX_T and kernel.dims_ok(d, dv) and kernel.lib() is not None


# --- dense cache ------------------------------------------------------------------
def dense_attend(
    cache, q: torch.Tensor, scale: float, sinks: torch.Tensor | None = None, steps: bool = False
) -> torch.Tensor | None:
    """DenseCache attention for its last T positions -> (H, T, Dv) float32, straight from
    the stores (a prompt chunk too: no float32 copy of the history, no (T, S) mask);
    sinks (H,): a value-less logit per head in each softmax, or None; steps: `steps_exact`."""
    H, T, D = q.shape
    if not kernel.dims_ok(D, cache.values.shape[2]):
        return None
    lib = kernel.lib()
    if lib is None:
        return None
    keys, values = cache.keys, cache.values
    kind = kernel.DENSE_KINDS[cache.dtype]
    start, win = cache.start, cache.window
    if T > MAX_T:  # a prompt chunk: a segment from the first key a row sees, so that what the
        # store holds below it (not yet shifted out of the window) cannot change the sums
        p = cache.offset - T + torch.arange(T)
        lo = (p - win + 1).clamp_min(start) if win is not None else torch.full_like(p, start)
        base = int(lo[0]) - start
        ks, vs = keys[:, base : cache.length], values[:, base : cache.length]
        seg = kernel.pack([kernel.segment(kind, kind, False, (ks,), (vs,))])
        ranges = torch.stack([lo, (p + 1).clamp_max(start + cache.length)], 1) - (start + base)
        return kernel.run(lib, q, keys.shape[0], values.shape[2], scale, seg, ranges.contiguous(), sinks=sinks)
    held = cache._packed  # the packed segment, kept while the stores stay
    if held is None or held[0] is not keys or held[1] is not values:
        held = cache._packed = (keys, values, kernel.pack([kernel.segment(kind, kind, False, (keys,), (values,))]))
    ranges = []
    for t in range(T):
        p = cache.offset - T + t
        lo = max(start, p - win + 1) if win is not None else start
        ranges += [lo - start, min(p + 1, start + cache.length) - start]
    return kernel.run(lib, q, keys.shape[0], values.shape[2], scale, held[2], ranges, sinks=sinks, steps=steps)


# --- compressed cache -------------------------------------------------------------
def compressed_attend(
    cache,
    q: torch.Tensor,
    q_pos0: int,
    b: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    steps: bool = False,
) -> torch.Tensor | None:
    """CompressedCache attention for T positions q_pos0.. whose bodies end at b (T,):
    decode steps and prefill chunks alike (no limit on T) -> (H, T, Dv) float32; steps:
    `steps_exact`."""
    if not cache.fused:
        return None
    lib = kernel.lib()
    if lib is None:
        return None
    body = cache.body_end > cache.body_start and bool(cache.body_k)
    ranges = (_decode_ranges if q.shape[1] <= MAX_T else _prefill_ranges)(cache, q.shape[1], q_pos0, b, body)
    segs, tables = cache.kernel_inputs()
    if not body:
        return kernel.run(lib, q, cache.hkv, cache.dv, scale, segs, ranges, nseg=2, sinks=sinks, steps=steps)
    return kernel.run(lib, q, cache.hkv, cache.dv, scale, segs, ranges, sinks=sinks, steps=steps, **tables)


def kernel_inputs(cache) -> tuple:
    """What the kernel takes from a compressed cache that changes only when a store is
    reallocated or the channel vectors are fitted: the packed segments (exact sink, exact
    pool, then the body if it has fields) and the keyword tables of `kernel.run`."""
    ek, ev = cache.exact_k, cache.exact_v
    segs = [kernel.segment(Kind.F16, Kind.F16, False, (ek,), (ev,))] * 2  # sink, pool
    kc, vc = cache.kc, cache.vc
    if cache.body_k:
        segs.append(
            kernel.segment(
                kc.kernel_kind,
                vc.kernel_kind,
                True,
                _fields(kc, cache.body_k, cache.tile),
                _fields(vc, cache.body_v, cache.tile),
                kc.kernel_rows,
                vc.kernel_rows,
            )
        )
    ks, kcn, vs, vcn = (
        None if t is None else t.float().contiguous()
        for t in (cache.kscale, cache.kcenter, cache.vscale, cache.vcenter)
    )
    return kernel.pack(segs), dict(
        krot=_rotation(kc),
        kscale=ks,
        kcenter=kcn,
        vrot=_rotation(vc),
        vscale=vs,
        vcenter=vcn,
        kcb=_codebook(kc),
        vcb=_codebook(vc),
    )


def _rotation(codec) -> tuple | None:
    """A codec's rotation R = H diag(signs) per block (kv/rotation.py) as (signs, block)."""
    if codec.rotation is None:
        return None
    return rotation_signs(codec.dim, codec.seed), rotation_block(codec.dim)


def _fields(codec, fields: dict, tile: int) -> tuple:
    """The codec's kernel fields as (Hkv, rows, ...) views of the body store (Hkv, units, ...):
    fields 0 and 1 with a row per token, fields 2 and 3 a row per `kernel_rows` tokens."""
    out = []
    for name, rows in zip(codec.kernel_fields, (1, 1, *codec.kernel_rows)):
        t = fields[name] if name else None
        out.append(None if t is None else t.reshape(t.shape[0], t.shape[1] * (tile // rows), -1))
    return tuple(out)


def _codebook(codec) -> torch.Tensor | None:
    """A codebook kind's centroids padded to the kernel's 16 floats."""
    if codec.kernel_kind not in CODEBOOK_KINDS:
        return None
    cb = codec.codebook.float()
    return torch.cat([cb, cb.new_zeros(16 - cb.numel())]).contiguous()


def _decode_ranges(cache, T: int, q_pos0: int, b: torch.Tensor, body: bool) -> list[int]:
    """Per segment and query position: lo, hi (plain ints, for a few positions)."""
    win, nsink, pool0, c0 = cache.window, cache.nsink, cache.pool_start, cache.body_start
    n_ex_end = nsink + max(0, cache.offset - pool0)
    n_units = cache.body_end - c0
    sink, pool, comp = [], [], []
    for t, bt in enumerate(b.tolist()):
        p = q_pos0 + t
        wlo = p - win + 1 if win is not None else 0
        sink += [max(0, wlo), min(nsink, p + 1)]
        pool += [nsink + max(pool0, bt, wlo) - pool0, min(n_ex_end, nsink + p + 1 - pool0)]
        comp += [max(0, wlo - c0), min(n_units, bt - c0, p + 1 - c0)]
    return sink + pool + (comp if body else [])


def _prefill_ranges(cache, T: int, q_pos0: int, b: torch.Tensor, body: bool) -> torch.Tensor:
    """The same bounds as `_decode_ranges`, as an int64 tensor (segments, T, 2)."""
    win, nsink, pool0, c0 = cache.window, cache.nsink, cache.pool_start, cache.body_start
    n_ex_end = nsink + max(0, cache.offset - pool0)
    p = q_pos0 + torch.arange(T)
    wlo = p - win + 1 if win is not None else torch.zeros_like(p)
    lo = torch.maximum(b.clamp_min(pool0), wlo)
    parts = [
        wlo.clamp_min(0),
        (p + 1).clamp_max(nsink),
        nsink + lo - pool0,
        (nsink + p + 1 - pool0).clamp_max(n_ex_end),
    ]
    if body:
        parts += [(wlo - c0).clamp_min(0), torch.minimum(b - c0, p + 1 - c0).clamp_max(cache.body_end - c0)]
    return torch.stack(parts, 1).view(T, -1, 2).transpose(0, 1).contiguous()


# --- encoders ---------------------------------------------------------------------
def encode(codec, x: torch.Tensor) -> dict | None:
    """The codec's fields of x (Hkv, n, D) float32 by the C++ encoder, for TurboQuant (the steps
    of `codecs.TurboQuant.encode` per vector, rotation in float64) and KVarN (those of
    `codecs.KVarN.encode` per tile); None for other codecs or without the kernel."""
    if codec.kernel_encoder is None:
        return None
    lib = kernel.lib()
    if lib is None:
        return None
    if codec.kernel_encoder == "tq":
        return kernel.tq_encode(lib, x, codec.code_bits, *codec.encoder_tables, codec.paper)
    return kernel.kvarn_encode(
        lib,
        x,
        codec.tile,
        codec.code_bits,
        codec.role,
        codec.iters,
        rotation_signs(codec.dim, codec.seed),
        rotation_block(codec.dim),
    )
