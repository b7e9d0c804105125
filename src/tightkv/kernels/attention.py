"""Fused decode attention over a KV cache, straight from the stored format.

One C++ call per layer and step (`csrc/attention.cpp`, compiled into the
kernel library and sharing its thread pool) scores a few query rows against
the stored keys and sums the stored values, block by block with an online
softmax, for:

- the dense cache (f32 / f16 / bf16): dot products straight from f16 storage,
  no float32 copy of the history;
- the compressed cache: its exact sink and recent pool (f16) plus a body of
  ``tq4``/``tq3``/``tq2`` codes, ``q8_0`` or ``q4_0`` blocks, KVarN or KIVI codes
  (every bit width), or a dense half (what a codec hands over is its `kernel_kind`,
  an `abi.Kind`, `kernel_fields` and `kernel_rows`). Affine codes are never dequantized: KVarN and
  KIVI keys score as (q*A) . code + q.B per tile or group of tokens, times the
  token's row scale; KVarN values sum as codes weighted by the row scales, times
  the tile's channel scales once per block. tq4 is scored in the rotated
  domain: with AVX-512 VNNI and a head size that is a multiple of 128, the query
  is quantized to int8 (one scale per row), each key's nibbles become u8
  codebook bytes by one byte shuffle per 64 channels, and one VNNI instruction
  multiplies 64 of them; values are summed the same way with the softmax
  weights of each 32-token block as u8 and four tokens' codes interleaved per
  instruction (`set_int8`). Otherwise: one float permute per 16 channels
  (AVX2: two per 8), then float dots. On AVX2, decode steps sum in integers as
  llama.cpp's AVX2 dots do (head dims that are multiples of 64, `set_int8`):
  tq4 keys as maddubs of a 7-bit codebook (one byte shuffle per 32 channels)
  against the int8 query; 4-bit KVarN keys as maddubs of their u8 nibbles
  against the int8 query q*A (one scale per row and tile), its values as
  maddubs of the u8 weights against two tokens' centred codes interleaved per
  channel. Queries are rotated and scaled once,
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

This module knows buffers, shapes and the library's ABI only (the structs and kind
numbers are in `abi.py`); what a cache hands over (segments, ranges, tables) is
worked out in `kv/fused.py`.
"""

from __future__ import annotations

import ctypes

import torch

from . import abi, build
from . import qmatmul as qm
from .abi import Kind, Seg

MAX_T = 32  # query positions of a steps call at most; a dense cache's calls beyond are prompt chunks
CHUNK_TOKENS = 256  # tokens per chunk a thread claims
BLOCK = 32  # tokens the kernel scores and sums at a time (aligned to each segment's start)

DENSE_KINDS = {torch.float32: Kind.F32, torch.float16: Kind.F16, torch.bfloat16: Kind.BF16}
_BACKEND = "fast"


def set_backend(name: str) -> None:
    """ "fast" (the fused kernel where supported) or "reference" (torch only)."""
    global _BACKEND
    _BACKEND = qm.check_backend(name, "attention")


def get_backend() -> str:
    return _BACKEND


def set_int8(keys: bool = True, values: bool = True) -> bool:
    """Let keys / values take the integer paths (tq4 on AVX-512 VNNI; in decode steps on AVX2,
    tq4 keys and 4-bit KVarN); False keeps float dots. Returns whether the loaded kernel has such paths."""
    lib_ = lib()
    return bool(lib_ and lib_.tk_attn_int8(int(keys) | 2 * int(values)))


def lib():
    """The loaded kernel library, or None (reference backend, no compiler)."""
    if _BACKEND != "fast":
        return None
    return build.library()


def dims_ok(d: int, dv: int) -> bool:
    """Head dims the kernel takes: multiples of 16 up to 1024 (80: two 32-channel blocks and a tail)."""
    return d % 16 == 0 and dv % 16 == 0 and d <= 1024 and dv <= 1024


def _strides(t: torch.Tensor | None) -> tuple[int, int, int]:
    if t is None:
        return 0, 0, 0
    es = t.element_size()
    return t.data_ptr(), t.stride(0) * es, t.stride(1) * es


def segment(kkind: Kind, vkind: Kind, body: bool, k: tuple, v: tuple, krows=(1, 1), vrows=(1, 1)) -> Seg:
    """A segment descriptor (`abi.Seg`). k, v: up to four tensors (or None) per side, each
    (Hkv, rows, ...) with unit inner stride: the codes and field 1 one row per token,
    fields 2 and 3 one row per `krows` / `vrows` tokens. The tensors must outlive its use."""
    seg = Seg(kkind=kkind, vkind=vkind, body=int(body))
    for side, fields, rows in (("k", k, krows), ("v", v, vrows)):
        for i, t in enumerate((*fields, None, None, None)[:4]):
            ptr, head, row = _strides(t)
            setattr(seg, f"{side}{i}", ptr)
            setattr(seg, f"{side}h{i}", head)
            setattr(seg, f"{side}t{i}", row)
        setattr(seg, f"{side}d2", rows[0])
        setattr(seg, f"{side}d3", rows[1])
    return seg


def pack(segs: list[Seg]) -> ctypes.Array:
    """Segment descriptors as the kernel's array: build once, `run` with it many times."""
    return (Seg * len(segs))(*segs)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def run(
    lib_,
    q: torch.Tensor,
    hkv: int,
    dv: int,
    scale: float,
    segs,
    ranges,
    nseg: int | None = None,
    krot=None,
    kscale=None,
    kcenter=None,
    vrot=None,
    vscale=None,
    vcenter=None,
    kcb=None,
    vcb=None,
    sinks=None,
    steps: bool = False,
) -> torch.Tensor:
    """q (H, T, D) -> (H, T, Dv) float32. segs: `Seg`s (`segment`), as a list or `pack`ed,
    of which the first `nseg` (default all) are attended. ranges: per segment and query
    position, lo, hi (a list of ints, or a contiguous int64 tensor). krot, vrot: the body
    codecs' rotations as (signs (D,) float32, Hadamard block), or None. sinks: (H,) float32,
    a logit per head that joins each row's softmax with no value (gpt-oss), or None. steps: each
    position computed as its decode step would (a verification: `kv.fused.steps_exact`)."""
    H, T, D = q.shape
    qf = q if q.dtype == torch.float32 and q.is_contiguous() else q.float().contiguous()
    out = torch.empty(H, T, dv)
    seg_arr = pack(segs) if isinstance(segs, list) else segs
    if isinstance(ranges, torch.Tensor):
        rng_ptr = ranges.data_ptr()
    else:
        rng_arr = (ctypes.c_int64 * len(ranges))(*ranges)  # kept alive until the call returns
        rng_ptr = ctypes.addressof(rng_arr)
    (ks, kb), (vs, vb) = krot or (None, 0), vrot or (None, 0)
    args = abi.AttnArgs(
        q=qf.data_ptr(),
        Hkv=hkv,
        R=(H // hkv) * T,
        T=T,
        D=D,
        Dv=dv,
        ksigns=_ptr(ks),
        khb=kb,
        kscale=_ptr(kscale),
        kcenter=_ptr(kcenter),
        vsigns=_ptr(vs),
        vhb=vb,
        vscale=_ptr(vscale),
        vcenter=_ptr(vcenter),
        nseg=len(seg_arr) if nseg is None else nseg,
        segs=ctypes.addressof(seg_arr),
        ranges=rng_ptr,
        kcb=_ptr(kcb),
        vcb=_ptr(vcb),
        chunk_tokens=CHUNK_TOKENS,
        out=out.data_ptr(),
        sinks=_ptr(sinks),
        steps=int(steps),
        scale=scale,
        nth=build.threads(),
    )
    if lib_.tk_attn(ctypes.byref(args)):
        raise RuntimeError(f"tightkv attention kernel: unsupported shape or kind D={D} Dv={dv} T={T}")
    return out


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()


def tq_encode(
    lib_,
    x: torch.Tensor,
    bits: int,
    rotation_t: torch.Tensor,
    signs: torch.Tensor,
    block: int,
    thresholds: torch.Tensor,
    codebook: torch.Tensor,
    paper: bool,
) -> dict | None:
    """TurboQuant fields {"idx", "norm"} of x (Hkv, n, D) at 2-4 bits by the C++ encoder: x @ rotation_t
    (D, D; the rotation is H diag(signs) per `block` channels, done in float64), bucketed by
    `thresholds` against `codebook`. None where the kernel declines the shape."""
    h, n, d = x.shape
    xf = _f32(x)
    idx = torch.empty(h, n, d * bits // 8, dtype=torch.uint8)
    norm = torch.empty(h, n, dtype=torch.float16)
    if lib_.tk_tq_encode(
        xf.data_ptr(),
        h * n,
        d,
        bits,
        rotation_t.data_ptr(),
        signs.data_ptr(),
        block,
        thresholds.data_ptr(),
        codebook.data_ptr(),
        int(paper),
        idx.data_ptr(),
        norm.data_ptr(),
        build.threads(),
    ):
        return None
    return {"idx": idx, "norm": norm}


def kvarn_encode(
    lib_, x: torch.Tensor, tile: int, bits: int, role: str, iters: int, signs: torch.Tensor, block: int
) -> dict | None:
    """KVarN fields {"q", "s_col", "zp", "s_row"} of x (Hkv, units * tile, D) by the C++ encoder
    (rotation H diag(signs) per `block` channels, Sinkhorn of `iters` steps per tile, affine
    codes per channel for keys, per token for values). None where it declines the shape."""
    h, n, d = x.shape
    nt = n // tile
    xf = _f32(x)
    q = torch.empty(h, nt, tile, d * bits // 8, dtype=torch.uint8)
    s_col = torch.empty(h, nt, d, dtype=torch.float16)
    zp = torch.empty(h, nt, d if role == "k" else tile, dtype=torch.float16)
    s_row = torch.empty(h, nt, tile, dtype=torch.float16)
    if lib_.tk_kvarn_encode(
        xf.data_ptr(),
        h * nt,
        tile,
        d,
        bits,
        int(role == "v"),
        iters,
        signs.data_ptr(),
        block,
        q.data_ptr(),
        s_col.data_ptr(),
        zp.data_ptr(),
        s_row.data_ptr(),
        build.threads(),
    ):
        return None
    return {"q": q, "s_col": s_col, "zp": zp, "s_row": s_row}
