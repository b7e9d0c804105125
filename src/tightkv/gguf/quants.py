"""GGML weight block codecs in torch: the reference dequantizers.

A port of gguf-py's ``quants.py``: one small class per GGML type, registered by
type name through ``__init_subclass__``, each turning a whole
``(n_blocks, type_size)`` uint8 tensor into ``(n_blocks, block_size)`` float32
with vectorized torch ops and no per-block loops. The arithmetic follows gguf-py
operation by operation so the results are bit-exact with
``gguf.quants.dequantize``.

Block layouts (bytes), ``d``/``dmin``/``m`` fp16:

- Q4_0 (32, 18): d, 16 nibble bytes (low nibbles = elements 0-15, high = 16-31)
- Q4_1 (32, 20): d, m, 16 nibble bytes
- Q5_0 (32, 22): d, qh u32 (bit i = 5th bit of element i), 16 nibble bytes
- Q5_1 (32, 24): d, m, qh, 16 nibble bytes
- Q8_0 (32, 34): d, 32 int8
- Q2_K (256, 84): 16 scale bytes (lo 4 bits scale, hi 4 bits min), 64 qs, d, dmin
- Q3_K (256, 110): 32 hmask, 64 qs, 12 packed 6-bit scales, d
- Q4_K (256, 144): d, dmin, 12 packed 6-bit scales/mins, 128 nibble bytes
- Q5_K (256, 176): d, dmin, 12 scales/mins, 32 qh, 128 nibble bytes
- Q6_K (256, 210): 128 ql, 64 qh, 16 int8 scales, d
- Q1_0 (128, 18): d, 16 sign bytes (bit j of byte j/8: element j is +d if set, else -d)
- Q2_0 (64, 18): d, 16 bytes of 2-bit codes (element j in bits 2(j%4) of byte j/4), (q-1)*d
- TQ1_0 (256, 54): 48 bytes of 5 base-3 digits each, 4 bytes of 4 digits, d; (digit-1)*d
- TQ2_0 (256, 66): 64 bytes of 2-bit codes (as Q2_K's layout), d; (q-1)*d
- IQ4_NL (32, 18): d, 16 nibble bytes (as Q4_0) indexing a 16-value non-linear table
- IQ4_XS (256, 136): d, 16 bits of scale high bits, 4 bytes of scale low nibbles, 128 nibble bytes
- IQ3_XXS (256, 98): d, 64 grid indices (4 values each), 8 u32 (4 7-bit sign indices, 4-bit scale)
- IQ3_S (256, 110): d, 64 grid index low bytes, 8 bytes of 9th bits, 32 sign bytes, 4 scale bytes
- IQ2_XXS (256, 66): d, 8 x (4 grid index bytes (8 values each), u32 of 4 sign indices + scale)
- IQ2_XS (256, 74): d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of 4-bit scales
- IQ2_S (256, 82): d, 32 grid index low bytes, 32 sign bytes, 8 bytes of 2-bit high index bits, 8 scale bytes
- IQ1_S (256, 50): d, 32 grid index low bytes, 8 u16 (4 3-bit high index bits, 3-bit scale, delta sign)
- IQ1_M (256, 56): 32 grid index low bytes, 16 bytes (per 8 values: 3 high index bits, delta sign),
  4 u16 of 3-bit scales whose top nibbles together hold d
- MXFP4 (32, 17): e8m0 exponent e, 16 nibble bytes indexing doubled E2M1 values; value * 2^(e-128)
- NVFP4 (64, 36): 4 unsigned E4M3 scales (one per 16), 4 x 8 nibble bytes (low: 0-7, high: 8-15)

The IQ grids (every allowed group of 8 or 4 magnitudes) are data: they are taken from
gguf-py's tables (`gguf.quants.IQ2_XXS.grid` ...) on first use, not copied here.
"""

from __future__ import annotations

import torch

from ..errors import GGUFError

QK_K = 256

# name -> (elements per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
BLOCK_SIZES: dict[str, tuple[int, int]] = {}
_DEQUANTIZERS: dict[str, type["BlockDequantizer"]] = {}


class BlockDequantizer:
    """Base of the per-type dequantizers; subclasses register by GGML type name."""

    qtype: str
    block_size: int
    type_size: int

    def __init_subclass__(cls, qtype: str, block_size: int, type_size: int) -> None:
        cls.qtype, cls.block_size, cls.type_size = qtype, block_size, type_size
        BLOCK_SIZES[qtype] = (block_size, type_size)
        _DEQUANTIZERS[qtype] = cls

    @classmethod
    def dequantize_blocks(cls, blocks: torch.Tensor) -> torch.Tensor:
        """(n_blocks, type_size) uint8 -> (n_blocks, block_size) float32."""
        raise NotImplementedError


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2k) uint8 little-endian fp16 fields -> (n, k) float32."""
    if b.stride(-1) != 1 or b.storage_offset() % 2 or any(s % 2 for s in b.stride()[:-1]):
        b = b.contiguous()
    return b.view(torch.float16).float()


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """(n, m) uint8 -> (n, m // group, 2, group) uint8: low nibbles, then high nibbles."""
    n = qs.shape[0]
    qs = qs.reshape(n, -1, 1, group)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2)


def _bits(b: torch.Tensor, n_bits: int, width: int) -> torch.Tensor:
    """(n, m) uint8 -> (n, m // group, 8 // width, group) uint8 fields of `width` bits.

    Field k of each byte (bits k*width ..) goes to slot k, as gguf-py's
    ``reshape(..., 1, group) >> shifts`` pattern does.
    """
    n, m = b.shape
    shifts = torch.arange(0, 8, width, dtype=torch.uint8).reshape(1, 1, -1, 1)
    return (b.reshape(n, -1, 1, n_bits) >> shifts) & ((1 << width) - 1)


class F32(BlockDequantizer, qtype="F32", block_size=1, type_size=4):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float32)


class F16(BlockDequantizer, qtype="F16", block_size=1, type_size=2):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float16).float()


class BF16(BlockDequantizer, qtype="BF16", block_size=1, type_size=2):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.bfloat16).float()


class Q4_0(BlockDequantizer, qtype="Q4_0", block_size=32, type_size=18):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        q = _nibbles(blocks[:, 2:], 16).reshape(n, 32).to(torch.int8) - 8
        return d * q.float()


class Q4_1(BlockDequantizer, qtype="Q4_1", block_size=32, type_size=20):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        q = _nibbles(blocks[:, 4:], 16).reshape(n, 32).float()
        return d * q + m


def _qh32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) uint8 little-endian u32 -> (n, 32) uint8 bits, bit i in column i."""
    n = qh.shape[0]
    shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8)
    return ((qh.reshape(n, 4, 1) >> shifts) & 1).reshape(n, 32)


class Q5_0(BlockDequantizer, qtype="Q5_0", block_size=32, type_size=22):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qh = _qh32(blocks[:, 2:6])
        ql = _nibbles(blocks[:, 6:], 16).reshape(n, 32)
        q = (ql | (qh << 4)).to(torch.int8) - 16
        return d * q.float()


class Q5_1(BlockDequantizer, qtype="Q5_1", block_size=32, type_size=24):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        qh = _qh32(blocks[:, 4:8])
        ql = _nibbles(blocks[:, 8:], 16).reshape(n, 32)
        q = (ql | (qh << 4)).float()
        return d * q + m


class Q8_0(BlockDequantizer, qtype="Q8_0", block_size=32, type_size=34):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        x = blocks[:, 2:].contiguous().view(torch.int8).float()
        return x * d


class Q2_K(BlockDequantizer, qtype="Q2_K", block_size=QK_K, type_size=84):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        scales, qs = blocks[:, :16], blocks[:, 16:80]
        d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
        dl = (d * (scales & 0xF).float()).reshape(n, 16, 1)  # (n, 16 sub-blocks, 1)
        ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
        q = _bits(qs, 32, 2).reshape(n, 16, 16).float()
        return (dl * q - ml).reshape(n, QK_K)


class Q3_K(BlockDequantizer, qtype="Q3_K", block_size=QK_K, type_size=110):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        hmask, qs = blocks[:, :32], blocks[:, 32:96]
        lsc, hsc = blocks[:, 96:104], blocks[:, 104:108]
        d = _f16(blocks[:, 108:110])
        lsc = _bits(lsc, 8, 4).reshape(n, 16)
        hsc = _bits(hsc, 4, 2).reshape(n, 16)
        sc = ((lsc | (hsc << 4)).to(torch.int8) - 32).float()
        dl = (d * sc).reshape(n, 16, 1)
        ql = _bits(qs, 32, 2).reshape(n, 16, 16)
        qh = _bits(hmask, 32, 1).reshape(n, 16, 16) ^ 1  # offset applies when the bit is 0
        q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
        return (dl * q).reshape(n, QK_K)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 12) packed 6-bit scales and mins of Q4_K/Q5_K -> two (n, 8) uint8."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


class Q4_K(BlockDequantizer, qtype="Q4_K", block_size=QK_K, type_size=144):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        d = (d * sc.float()).reshape(n, 8, 1)  # (n, 8 sub-blocks of 32, 1)
        dm = (dmin * mn.float()).reshape(n, 8, 1)
        q = _nibbles(blocks[:, 16:], 32).reshape(n, 8, 32).float()
        return (d * q - dm).reshape(n, QK_K)


class Q5_K(BlockDequantizer, qtype="Q5_K", block_size=QK_K, type_size=176):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        d = (d * sc.float()).reshape(n, 8, 1)
        dm = (dmin * mn.float()).reshape(n, 8, 1)
        ql = _nibbles(blocks[:, 48:], 32).reshape(n, 8, 32)
        qh = _bits(blocks[:, 16:48], 32, 1).reshape(n, 8, 32)
        q = (ql | (qh << 4)).float()
        return (d * q - dm).reshape(n, QK_K)


class Q6_K(BlockDequantizer, qtype="Q6_K", block_size=QK_K, type_size=210):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        ql, qh = blocks[:, :128], blocks[:, 128:192]
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(blocks[:, 208:210])
        d = (d * scales).reshape(n, 16, 1)  # (n, 16 sub-blocks of 16, 1)
        ql = _nibbles(ql, 64).reshape(n, 8, 32)
        qh = _bits(qh, 32, 2).reshape(n, 8, 32)
        q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
        return (d * q).reshape(n, QK_K)


# -- ternary, 1- and 2-bit types -------------------------------------------------


def _u16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2k) uint8 little-endian u16 fields -> (n, k) int32."""
    b = b.to(torch.int32)
    return b[:, 0::2] | (b[:, 1::2] << 8)


def _u32(b: torch.Tensor) -> torch.Tensor:
    """(..., 4k) uint8 little-endian u32 fields -> (..., k) int64."""
    b = b.to(torch.int64).reshape(*b.shape[:-1], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _bitfield(x: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """(...) integers -> (..., len(shifts)): (x >> shift) & mask for each shift."""
    return (x.unsqueeze(-1) >> torch.tensor(shifts, dtype=x.dtype)) & mask


class Q1_0(BlockDequantizer, qtype="Q1_0", block_size=128, type_size=18):
    """llama.cpp's 1-bit type (ggml-quants.c dequantize_row_q1_0): the signs of d."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])  # (n, 1)
        bits = _bitfield(blocks[:, 2:18], list(range(8)), 1).reshape(n, 128)  # bit j of byte j/8
        return torch.where(bits.bool(), d, -d)


class Q2_0(BlockDequantizer, qtype="Q2_0", block_size=64, type_size=18):
    """llama.cpp's 2-bit type (dequantize_row_q2_0): codes 0..3 are -1, 0, 1, 2 times d."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        q = _bitfield(blocks[:, 2:18], [0, 2, 4, 6], 3).reshape(n, 64).to(torch.int8) - 1
        return q.float() * d


class TQ1_0(BlockDequantizer, qtype="TQ1_0", block_size=QK_K, type_size=54):
    """Ternary, 1.69 bits: bytes hold 5 (or 4) base-3 digits as a fixed-point fraction."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        qs, qh, d = blocks[:, :48].int(), blocks[:, 48:52].int(), _f16(blocks[:, 52:54])
        p5 = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int32).reshape(1, 5, 1)
        q0 = (qs[:, :32].reshape(n, 1, 32) * p5).reshape(n, 160)  # digit k of each byte, k = 0..4
        q1 = (qs[:, 32:].reshape(n, 1, 16) * p5).reshape(n, 80)
        q2 = (qh.reshape(n, 1, 4) * p5[:, :4]).reshape(n, 16)
        q = torch.cat([q0, q1, q2], dim=1) & 0xFF  # the byte times 3^k, as uint8 arithmetic wraps
        return d * (((q * 3) >> 8) - 1).float()


class TQ2_0(BlockDequantizer, qtype="TQ2_0", block_size=QK_K, type_size=66):
    """Ternary in 2-bit codes (0..2 used): (q - 1) * d."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, 64:66])
        q = _bits(blocks[:, :64], 32, 2).reshape(n, QK_K).to(torch.int8) - 1
        return d * q.float()


# -- 4-bit tables ----------------------------------------------------------------

IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # kvalues_iq4nl
FP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # E2M1 doubled, kvalues_mxfp4


def _lookup(values: tuple[int, ...], q: torch.Tensor) -> torch.Tensor:
    """Codes q (any shape, 0..15) -> float32 table values."""
    return torch.tensor(values, dtype=torch.float32)[q.long()]


class IQ4_NL(BlockDequantizer, qtype="IQ4_NL", block_size=32, type_size=18):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        return d * _lookup(IQ4_VALUES, _nibbles(blocks[:, 2:], 16).reshape(n, 32))


class IQ4_XS(BlockDequantizer, qtype="IQ4_XS", block_size=QK_K, type_size=136):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        hi = _bitfield(_u16(blocks[:, 2:4]), list(range(0, 16, 2)), 3).reshape(n, 8)  # (n, 8 sub-blocks)
        lo = _bitfield(blocks[:, 4:8], [0, 4], 0xF).reshape(n, 8)
        dl = (d * ((lo.int() | (hi << 4)) - 32).float()).reshape(n, 8, 1)
        q = _nibbles(blocks[:, 8:], 16).reshape(n, 8, 32)
        return (dl * _lookup(IQ4_VALUES, q)).reshape(n, QK_K)


class MXFP4(BlockDequantizer, qtype="MXFP4", block_size=32, type_size=17):
    """OCP microscaling FP4: an E8M0 exponent, E2M1 codes (ggml_e8m0_to_fp32_half)."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        e = blocks[:, :1].int()
        bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)  # 2^(e-128), denormal below e = 2
        d = bits.view(torch.float32)  # (n, 1)
        return d * _lookup(FP4_VALUES, _nibbles(blocks[:, 1:], 16).reshape(n, 32))


def _ue4m3_table() -> torch.Tensor:
    """(256,) float32: unsigned E4M3 (bias 7) halved, 0 and 0x7F as 0 (ggml_ue4m3_to_fp32)."""
    out = []
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 7
        raw = man * 2.0**-9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        out.append(0.0 if x in (0, 0x7F) else raw * 0.5)
    return torch.tensor(out, dtype=torch.float32)


UE4M3 = _ue4m3_table()


class NVFP4(BlockDequantizer, qtype="NVFP4", block_size=64, type_size=36):
    """NVIDIA FP4: four 16-value sub-blocks, each an E4M3 scale and E2M1 codes."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = UE4M3[blocks[:, :4].long()].reshape(n, 4, 1)  # (n, 4 sub-blocks, 1)
        qs = blocks[:, 4:].reshape(n, 4, 8)
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1)  # (n, 4, 16)
        return (d * _lookup(FP4_VALUES, q)).reshape(n, 64)


# -- grid types (IQ1, IQ2, IQ3) ------------------------------------------------------

GRID_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S")  # the kernel's table numbers
_GRIDS: dict[str, torch.Tensor] = {}
# ksigns_iq2xs: a 7-bit sign index -> 8 sign bits, the 8th making the count of minus signs even
KSIGNS = torch.tensor([i | (bin(i).count("1") & 1) << 7 for i in range(128)], dtype=torch.int64)


def iq_grid(qtype: str) -> torch.Tensor:
    """(entries, width) float32: the grid of `qtype` (IQ1_M shares IQ1_S's), from gguf-py's
    tables: magnitudes for IQ2/IQ3 (width 8 or 4), -1/0/1 for IQ1 (width 8)."""
    name = "IQ1_S" if qtype == "IQ1_M" else qtype
    if name not in _GRIDS:
        from gguf import quants as gq

        cls = getattr(gq, name)
        cls.init_grid()
        _GRIDS[name] = torch.from_numpy(cls.grid.reshape(cls.grid_shape).copy())
    return _GRIDS[name]


def grid_bytes(qtype: str):
    """`iq_grid(qtype)` as int8 numpy (entries, width): what the kernels are given at load time."""
    return iq_grid(qtype).to(torch.int8).numpy()


def kernel_tables() -> list:
    """The tables the C++ kernels take at load time (csrc/lowbit.h, tk_lowbit_table), in its
    order: the grids of GRID_TYPES as int8 (entries, width), the IQ4 and FP4 values as int8,
    the NVFP4 scales as float32 (256,)."""
    import numpy as np

    return [
        *(grid_bytes(t) for t in GRID_TYPES),
        np.array(IQ4_VALUES, dtype=np.int8),
        np.array(FP4_VALUES, dtype=np.int8),
        UE4M3.numpy(),
    ]


def _signs(bits: torch.Tensor) -> torch.Tensor:
    """(...) sign bytes -> (..., 8) float32: -1 where bit i is set, else 1."""
    b = _bitfield(bits.to(torch.int64), list(range(8)), 1)
    return torch.where(b == 0, 1.0, -1.0)


def _scale_nibbles(b: torch.Tensor) -> torch.Tensor:
    """(n, m) uint8 -> (n, 2m) float32: each byte's low nibble, then its high nibble."""
    return _bitfield(b, [0, 4], 0xF).reshape(b.shape[0], -1).float()


class IQ2_XXS(BlockDequantizer, qtype="IQ2_XXS", block_size=QK_K, type_size=66):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        q = blocks[:, 2:].reshape(n, 8, 8)  # (n, 8 sub-blocks of 32, 4 grid indices + u32)
        aux = _u32(q[:, :, 4:]).reshape(n, 8)
        db = (d * (0.5 + (aux >> 28).float()) * 0.25).reshape(n, 8, 1, 1)
        signs = _signs(KSIGNS[_bitfield(aux, [0, 7, 14, 21], 0x7F)])  # (n, 8, 4, 8)
        grid = iq_grid(cls.qtype)[q[:, :, :4].long()]  # (n, 8, 4, 8)
        return (db * grid * signs).reshape(n, QK_K)


class IQ2_XS(BlockDequantizer, qtype="IQ2_XS", block_size=QK_K, type_size=74):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qs = _u16(blocks[:, 2:66]).long()  # (n, 32): 9-bit grid index, 7-bit sign index
        db = (d * (0.5 + _scale_nibbles(blocks[:, 66:74])) * 0.25).reshape(n, 16, 1, 1)
        signs = _signs(KSIGNS[qs >> 9]).reshape(n, 16, 2, 8)
        grid = iq_grid(cls.qtype)[qs & 511].reshape(n, 16, 2, 8)
        return (db * grid * signs).reshape(n, QK_K)


class IQ2_S(BlockDequantizer, qtype="IQ2_S", block_size=QK_K, type_size=82):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qs, sg, qh = blocks[:, 2:34], blocks[:, 34:66], blocks[:, 66:74]
        db = (d * (0.5 + _scale_nibbles(blocks[:, 74:82])) * 0.25).reshape(n, 16, 1, 1)
        signs = _signs(sg).reshape(n, 16, 2, 8)
        idx = qs.long() | (_bitfield(qh.long(), [0, 2, 4, 6], 3).reshape(n, 32) << 8)
        grid = iq_grid(cls.qtype)[idx].reshape(n, 16, 2, 8)
        return (db * grid * signs).reshape(n, QK_K)


class IQ3_XXS(BlockDequantizer, qtype="IQ3_XXS", block_size=QK_K, type_size=98):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        aux = _u32(blocks[:, 66:98])  # (n, 8): 4 sign indices and a scale per 32
        db = (d * (0.5 + (aux >> 28).float()) * 0.5).reshape(n, 8, 1, 1)
        signs = _signs(KSIGNS[_bitfield(aux, [0, 7, 14, 21], 0x7F)])  # (n, 8, 4, 8)
        grid = iq_grid(cls.qtype)[blocks[:, 2:66].long()].reshape(n, 8, 4, 8)
        return (db * grid * signs).reshape(n, QK_K)


class IQ3_S(BlockDequantizer, qtype="IQ3_S", block_size=QK_K, type_size=110):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qs, qh, sg = blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:106]
        db = (d * (1 + 2 * _scale_nibbles(blocks[:, 106:110]))).reshape(n, 8, 1, 1)
        signs = _signs(sg).reshape(n, 8, 4, 8)
        idx = qs.long() | (_bitfield(qh.long(), list(range(8)), 1).reshape(n, 64) << 8)
        grid = iq_grid(cls.qtype)[idx].reshape(n, 8, 4, 8)
        return (db * grid * signs).reshape(n, QK_K)


IQ1_DELTA = 0.125


class IQ1_S(BlockDequantizer, qtype="IQ1_S", block_size=QK_K, type_size=50):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qh = _u16(blocks[:, 34:50])  # (n, 8): 4 x 3 high index bits, 3-bit scale, delta sign
        dl = (d * (2 * ((qh >> 12) & 7) + 1).float()).reshape(n, 8, 1, 1)
        delta = torch.where(qh & 0x8000 == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 1, 1)
        idx = blocks[:, 2:34].long() | (_bitfield(qh.long(), [0, 3, 6, 9], 7).reshape(n, 32) << 8)
        grid = iq_grid(cls.qtype)[idx].reshape(n, 8, 4, 8)
        return (dl * (grid + delta)).reshape(n, QK_K)


class IQ1_M(BlockDequantizer, qtype="IQ1_M", block_size=QK_K, type_size=56):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        sc = _u16(blocks[:, 48:56])  # (n, 4): 4 x 3-bit scales, and a nibble of d on top
        d = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
        d = d.to(torch.int16).view(torch.float16).float().reshape(n, 1)
        dl = (d * (2 * _bitfield(sc, [0, 3, 6, 9], 7).reshape(n, 16) + 1).float()).reshape(n, 8, 2, 1, 1)
        qh = _bitfield(blocks[:, 32:48].long(), [0, 4], 0xF).reshape(n, 32)  # per 8 values
        delta = torch.where(qh & 8 == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 2, 2, 1)
        idx = blocks[:, :32].long() | ((qh & 7) << 8)
        grid = iq_grid(cls.qtype)[idx].reshape(n, 8, 2, 2, 8)
        return (dl * (grid + delta)).reshape(n, QK_K)


# GGML type ids of block types that not every gguf-py version names (the reader decodes them)
EXTRA_TYPE_IDS = {41: "Q1_0", 42: "Q2_0"}

FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}  # the float GGML types


def check_supported(qtype: str, name: str) -> None:
    """Raise a one-line `GGUFError` for a tensor type we cannot decode (e.g. IQ types)."""
    if qtype not in _DEQUANTIZERS:
        raise GGUFError(f"tensor {name}: unsupported tensor type {qtype}")


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one row of `cols` elements."""
    block, size = BLOCK_SIZES[qtype]
    if cols % block:
        raise GGUFError(f"row of {cols} elements is not a multiple of the {qtype} block size {block}")
    return cols // block * size


def dequantize(raw: torch.Tensor, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode GGML blocks to a float32 tensor of `shape` (numpy order, e.g. (rows, cols)).

    `raw` is uint8 row bytes, (rows, row_bytes) or (n_blocks, type_size); for
    F32/F16/BF16 it may also be the typed array itself. Bit-exact with
    ``gguf.quants.dequantize``.
    """
    check_supported(qtype, "<dequantize>")
    if raw.dtype != torch.uint8:
        if qtype in FLOAT_TYPES and raw.dtype in (torch.float32, torch.float16, torch.bfloat16):
            if raw.dtype != FLOAT_TYPES[qtype]:
                raise ValueError(f"{qtype} data given as {raw.dtype}")
            return raw.float().reshape(shape)
        if qtype == "BF16" and raw.dtype in (torch.int16, torch.uint16):
            return raw.contiguous().view(torch.bfloat16).float().reshape(shape)
        raise ValueError(f"{qtype} data must be uint8 bytes, not {raw.dtype}")
    dequantizer = _DEQUANTIZERS[qtype]
    blocks = raw.reshape(-1, dequantizer.type_size)  # (n_blocks, type_size)
    return dequantizer.dequantize_blocks(blocks).reshape(shape)
