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
"""
from __future__ import annotations

import torch

from ..errors import GGUFError

QK_K = 256

# name -> (elements per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
BLOCK_SIZES: dict[str, tuple[int, int]] = {}
_CODECS: dict[str, type["Codec"]] = {}


class Codec:
    """Base of the per-type dequantizers; subclasses register by GGML type name."""

    qtype: str
    block_size: int
    type_size: int

    def __init_subclass__(cls, qtype: str, block_size: int, type_size: int) -> None:
        cls.qtype, cls.block_size, cls.type_size = qtype, block_size, type_size
        BLOCK_SIZES[qtype] = (block_size, type_size)
        _CODECS[qtype] = cls

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


class F32(Codec, qtype="F32", block_size=1, type_size=4):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float32)


class F16(Codec, qtype="F16", block_size=1, type_size=2):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float16).float()


class BF16(Codec, qtype="BF16", block_size=1, type_size=2):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.bfloat16).float()


class Q4_0(Codec, qtype="Q4_0", block_size=32, type_size=18):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        q = _nibbles(blocks[:, 2:], 16).reshape(n, 32).to(torch.int8) - 8
        return d * q.float()


class Q4_1(Codec, qtype="Q4_1", block_size=32, type_size=20):
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


class Q5_0(Codec, qtype="Q5_0", block_size=32, type_size=22):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _f16(blocks[:, :2])
        qh = _qh32(blocks[:, 2:6])
        ql = _nibbles(blocks[:, 6:], 16).reshape(n, 32)
        q = (ql | (qh << 4)).to(torch.int8) - 16
        return d * q.float()


class Q5_1(Codec, qtype="Q5_1", block_size=32, type_size=24):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        qh = _qh32(blocks[:, 4:8])
        ql = _nibbles(blocks[:, 8:], 16).reshape(n, 32)
        q = (ql | (qh << 4)).float()
        return d * q + m


class Q8_0(Codec, qtype="Q8_0", block_size=32, type_size=34):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        x = blocks[:, 2:].contiguous().view(torch.int8).float()
        return x * d


class Q2_K(Codec, qtype="Q2_K", block_size=QK_K, type_size=84):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        scales, qs = blocks[:, :16], blocks[:, 16:80]
        d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
        dl = (d * (scales & 0xF).float()).reshape(n, 16, 1)  # (n, 16 sub-blocks, 1)
        ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
        q = _bits(qs, 32, 2).reshape(n, 16, 16).float()
        return (dl * q - ml).reshape(n, QK_K)


class Q3_K(Codec, qtype="Q3_K", block_size=QK_K, type_size=110):
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


class Q4_K(Codec, qtype="Q4_K", block_size=QK_K, type_size=144):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        d = (d * sc.float()).reshape(n, 8, 1)  # (n, 8 sub-blocks of 32, 1)
        dm = (dmin * mn.float()).reshape(n, 8, 1)
        q = _nibbles(blocks[:, 16:], 32).reshape(n, 8, 32).float()
        return (d * q - dm).reshape(n, QK_K)


class Q5_K(Codec, qtype="Q5_K", block_size=QK_K, type_size=176):
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


class Q6_K(Codec, qtype="Q6_K", block_size=QK_K, type_size=210):
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


FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}  # the float GGML types


def check_supported(qtype: str, name: str) -> None:
    """Raise a one-line `GGUFError` for a tensor type we cannot decode (e.g. IQ types)."""
    if qtype not in _CODECS:
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
    codec = _CODECS[qtype]
    blocks = raw.reshape(-1, codec.type_size)  # (n_blocks, type_size)
    return codec.dequantize_blocks(blocks).reshape(shape)
