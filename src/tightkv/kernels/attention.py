"""Fused decode attention over a KV cache, straight from the stored format.

One C++ call per layer and step (`csrc/attention.cpp`, compiled into the
kernel library and sharing its thread pool) scores a few query rows against
the stored keys and sums the stored values, block by block with an online
softmax, for:

- the dense cache (f32 / f16 / bf16): dot products straight from f16 storage,
  no float32 copy of the history;
- the compressed cache: its exact sink and recent pool (f16) plus a body of
  ``tq4`` codes, ``q8_0`` or ``q4_0`` blocks, or a dense half (what a codec
  hands over is its `kernel_kind` and `kernel_fields`). tq4 is scored in the rotated
  domain: with AVX-512 VNNI and a head size that is a multiple of 128, the query
  is quantized to int8 (one scale per row), each key's nibbles become u8
  codebook bytes by one byte shuffle per 64 channels, and one VNNI instruction
  multiplies 64 of them; values are summed the same way with the softmax
  weights of each 32-token block as u8 and four tokens' codes interleaved per
  instruction (`set_int8`). Otherwise: one float permute per 16 channels
  (AVX2: two per 8), then float dots. Queries are rotated and scaled once,
  value sums are rotated back once; nothing is decoded beyond one vector at a
  time.

Work is split into chunks that the pool's threads claim: for a decode step
(KV head, token range); for a prefill chunk (KV head, 64 query rows), each over
the rows' visible range, with rows skipping the 32-token blocks they cannot see
(causal masks, windows). The partial (max, sum, accumulator) states are merged
by log-sum-exp. The torch code in kv/cache.py and kv/compressed.py stays the
reference. The compressed cache takes this path for decode and prefill alike;
the dense cache for up to `MAX_T` query positions (its prefill goes to torch's
fused SDPA). ``set_backend("reference")`` turns it off.
"""
from __future__ import annotations

import ctypes

import torch

from . import library
from . import qmatmul as qm

MAX_T = 16  # query positions per call the kernel takes for a dense cache (decode, speculative steps)
CHUNK_TOKENS = 256  # tokens per chunk a thread claims

F32, F16, BF16, Q8_0, TQ4, Q4_0 = range(6)  # the kernel's storage kinds
_DENSE_KIND = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
_BACKEND = "fast"


def set_backend(name: str) -> None:
    """"fast" (the fused kernel where supported) or "reference" (torch only)."""
    global _BACKEND
    _BACKEND = qm.check_backend(name, "attention")


def get_backend() -> str:
    return _BACKEND


def set_int8(keys: bool = True, values: bool = True) -> bool:
    """Let tq4 keys / values take the int8 (VNNI) path; False keeps float dots.
    Returns whether the loaded kernel has that path at all."""
    lib_ = lib()
    return bool(lib_ and lib_.tk_attn_int8(int(keys) | 2 * int(values)))


def lib():
    """The loaded kernel library, or None (reference backend, no compiler)."""
    if _BACKEND != "fast":
        return None
    return library.library()


def dims_ok(d: int, dv: int) -> bool:
    return d % 32 == 0 and dv % 32 == 0 and d <= 1024 and dv <= 1024


def _strides(t: torch.Tensor | None) -> tuple[int, int, int]:
    if t is None:
        return 0, 0, 0
    es = t.element_size()
    return t.data_ptr(), t.stride(0) * es, t.stride(1) * es


def segment(kkind: int, vkind: int, body: bool, k0, k1, v0, v1) -> list[int]:
    """A 20-int segment descriptor: tensors (Hkv, tokens, ...) with unit inner stride."""
    kp0, kh0, kt0 = _strides(k0)
    kp1, kh1, kt1 = _strides(k1)
    vp0, vh0, vt0 = _strides(v0)
    vp1, vh1, vt1 = _strides(v1)
    return [kkind, vkind, int(body), 0, kp0, kp1, kh0, kt0, kh1, kt1, vp0, vp1, vh0, vt0, vh1, vt1, 0, 0, 0, 0]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def run(lib_, q: torch.Tensor, hkv: int, dv: int, scale: float, segs: list[list[int]], ranges,
        keep: tuple = (), rkT=None, kscale=None, kcenter=None, rv=None, vscale=None, vcenter=None,
        kcb=None, vcb=None) -> torch.Tensor:
    """q (H, T, D) -> (H, T, Dv) float32. ranges: per segment and query position, lo, hi
    (a list of ints, or a contiguous int64 tensor)."""
    H, T, D = q.shape
    qf = q if q.dtype == torch.float32 and q.is_contiguous() else q.float().contiguous()
    R = (H // hkv) * T
    out = torch.empty(H, T, dv)
    flat = [x for s in segs for x in s]
    seg_arr = (ctypes.c_int64 * len(flat))(*flat)
    if isinstance(ranges, torch.Tensor):
        rng_arr = ranges.data_ptr()
    else:
        rng_arr = (ctypes.c_int64 * len(ranges))(*ranges)
    threads = library.threads()
    rc = lib_.tk_attn(qf.data_ptr(), hkv, R, T, D, dv, scale, _ptr(rkT), _ptr(kscale), _ptr(kcenter),
                      _ptr(rv), _ptr(vscale), _ptr(vcenter), len(segs), seg_arr, rng_arr,
                      _ptr(kcb), _ptr(vcb), CHUNK_TOKENS, out.data_ptr(), threads)
    if rc:
        raise RuntimeError(f"tightkv attention kernel: unsupported shape D={D} Dv={dv} T={T}")
    return out


# --- dense cache ------------------------------------------------------------------
def dense_decode(cache, q: torch.Tensor, scale: float) -> torch.Tensor | None:
    """DenseCache attention for the last T positions, or None where the kernel does not apply."""
    H, T, D = q.shape
    if T > MAX_T or not dims_ok(D, cache.values.shape[2]):
        return None
    lib_ = lib()
    if lib_ is None:
        return None
    kind = _DENSE_KIND[cache.dtype]
    keys, values = cache.keys, cache.values
    seg = segment(kind, kind, False, keys, None, values, None)
    ranges = []
    start, win = cache.start, cache.window
    for t in range(T):
        p = cache.offset - T + t
        lo = max(start, p - win + 1) if win is not None else start
        ranges += [lo - start, min(p + 1, start + cache.length) - start]
    return run(lib_, q, keys.shape[0], values.shape[2], scale, [seg], ranges)


# --- compressed cache -------------------------------------------------------------
KINDS = {"f32": F32, "f16": F16, "bf16": BF16, "q8_0": Q8_0, "tq4": TQ4, "q4_0": Q4_0}


def codec_kind(codec) -> int | None:
    """The kernel's storage kind for a codec, from what the codec declares."""
    return KINDS.get(codec.kernel_kind)


def _fields(codec, fields: dict) -> tuple:
    codes, scales = codec.kernel_fields
    return fields[codes], (fields[scales] if scales else None)


def _codebook(codec) -> torch.Tensor | None:
    cb = getattr(codec, "_fast_cb", None)
    if cb is None and hasattr(codec, "values"):
        cb = codec._fast_cb = torch.tensor(codec.values, dtype=torch.float32)
    return cb


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float().contiguous()


def compressed_supported(cache) -> bool:
    ok = getattr(cache, "_fast_ok", None)
    if ok is None:
        ok = (cache.tile == 1 and codec_kind(cache.kc) is not None and codec_kind(cache.vc) is not None
              and dims_ok(cache.dk, cache.dv))
        cache._fast_ok = ok
    # an instrumented codec (a test spying on decode) takes the reference path
    return ok and "decode" not in vars(cache.kc) and "decode" not in vars(cache.vc)


def _extras(cache) -> tuple:
    """Float32 rotation / centre / scale tensors, cached while the fp16 ones stay the same."""
    key = (id(cache.kscale), id(cache.kcenter), id(cache.vscale), id(cache.vcenter))
    ex = getattr(cache, "_fast_extras", None)
    if ex is None or ex[0] != key:
        kc, vc = cache.kc, cache.vc
        rkT = kc.rotation.mT.contiguous() if kc.rotation is not None else None
        rv = vc.rotation.contiguous() if vc.rotation is not None else None
        ex = (key, (rkT, _f32(cache.kscale), _f32(cache.kcenter), rv, _f32(cache.vscale), _f32(cache.vcenter),
                    cache.kscale, cache.kcenter, cache.vscale, cache.vcenter))
        cache._fast_extras = ex
    return ex[1]


def compressed_attend(cache, q: torch.Tensor, q_pos0: int, b: torch.Tensor, scale: float) -> torch.Tensor | None:
    """CompressedCache attention for T positions q_pos0.. whose bodies end at b (T,):
    decode steps and prefill chunks alike (no limit on T)."""
    H, T, D = q.shape
    if not compressed_supported(cache):
        return None
    lib_ = lib()
    if lib_ is None:
        return None
    kk, vk = codec_kind(cache.kc), codec_kind(cache.vc)
    win = cache.window
    n_ex_end = cache.nsink + max(0, cache.offset - cache.pool0)
    ek, ev = cache.ek, cache.ev
    segs = [segment(F16, F16, False, ek, None, ev, None), segment(F16, F16, False, ek, None, ev, None)]
    n_units = cache.cend - cache.cstart
    body = n_units > 0 and cache.kf
    if T <= MAX_T:  # decode: plain ints
        b = b.tolist()
        ranges_sink, ranges_pool, ranges_body = [], [], []
        for t in range(T):
            p = q_pos0 + t
            wlo = p - win + 1 if win is not None else 0
            ranges_sink += [max(0, wlo), min(cache.nsink, p + 1)]
            lo = max(cache.pool0, b[t], wlo)
            ranges_pool += [cache.nsink + lo - cache.pool0, min(n_ex_end, cache.nsink + p + 1 - cache.pool0)]
            ranges_body += [max(0, wlo - cache.cstart), min(n_units, b[t] - cache.cstart, p + 1 - cache.cstart)]
        ranges = ranges_sink + ranges_pool + (ranges_body if body else [])
    else:  # prefill: the same bounds as tensors
        p = q_pos0 + torch.arange(T)
        wlo = p - win + 1 if win is not None else torch.zeros_like(p)
        lo = torch.maximum(b.clamp_min(cache.pool0), wlo)
        parts = [wlo.clamp_min(0), (p + 1).clamp_max(cache.nsink),
                 cache.nsink + lo - cache.pool0, (cache.nsink + p + 1 - cache.pool0).clamp_max(n_ex_end)]
        if body:
            parts += [(wlo - cache.cstart).clamp_min(0),
                      torch.minimum(b - cache.cstart, p + 1 - cache.cstart).clamp_max(n_units)]
        ranges = torch.stack(parts, 1).view(T, -1, 2).transpose(0, 1).contiguous()  # (segments, T, 2)
    extras = (None,) * 6
    if body:
        k0, k1 = _fields(cache.kc, cache.kf)
        v0, v1 = _fields(cache.vc, cache.vf)
        segs.append(segment(kk, vk, True, k0, k1, v0, v1))
        extras = _extras(cache)[:6]
    rkT, ks, kcn, rv, vs, vcn = extras
    return run(lib_, q, cache.hkv, cache.dv, scale, segs, ranges, rkT=rkT, kscale=ks, kcenter=kcn,
               rv=rv, vscale=vs, vcenter=vcn, kcb=_codebook(cache.kc) if kk == TQ4 else None,
               vcb=_codebook(cache.vc) if vk == TQ4 else None)


# --- tq4 encode -------------------------------------------------------------------
def encode(codec, x: torch.Tensor) -> dict | None:
    """TurboQuant 4-bit fields of x (Hkv, n, D) float32 by the C++ kernel (the same
    steps as `codecs.TurboQuant.encode`, per vector, rotation in float64), or None
    where it does not apply."""
    from ..kv.rotation import rotation_block, rotation_signs

    if codec.kernel_kind != "tq4" or "encode" in vars(codec):
        return None
    lib_ = lib()
    if lib_ is None:
        return None
    h, n, d = x.shape
    xf = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
    c = getattr(codec, "_fast_enc", None)
    if c is None:
        signs = rotation_signs(codec.dim, codec.seed)  # the rotation is H diag(signs) per block
        c = codec._fast_enc = (codec.rotation.float().mT.contiguous(), signs, rotation_block(codec.dim),
                               codec.thresholds.float().contiguous(), codec.codebook.float().contiguous())
    idx = torch.empty(h, n, d // 2, dtype=torch.uint8)
    norm = torch.empty(h, n, dtype=torch.float16)
    threads = library.threads()
    if lib_.tk_tq4_encode(xf.data_ptr(), h * n, d, c[0].data_ptr(), c[1].data_ptr(), c[2], c[3].data_ptr(),
                          c[4].data_ptr(), int(codec.paper), idx.data_ptr(), norm.data_ptr(), threads):
        return None
    return {"idx": idx, "norm": norm}
