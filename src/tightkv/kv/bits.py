"""Bit packing of small integer codes along the last axis, and table decoding.

Layouts (little-endian, low bits first), for n codes along the last axis:

- 8 bits: one code per byte.
- 4 bits: byte j = code[2j] | code[2j+1] << 4.
- 2 bits: byte j = code[4j] | code[4j+1] << 2 | code[4j+2] << 4 | code[4j+3] << 6.
- 1 bit: byte j = sum_i code[8j+i] << i.
- 3 bits: 8 codes in 3 bytes: the 24-bit little-endian integer of bytes
  (3g, 3g+1, 3g+2) holds code[8g+i] in bits 3i..3i+2 (llama.cpp TBQ3 style).

`lut_decode` turns packed bytes straight into float values through a table
indexed by whole bytes (12-bit groups for 3 bits), so a decode is one gather and
no per-code shifts.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

SUPPORTED = (1, 2, 3, 4, 8)


def packed_size(n: int, bits: int) -> int:
    """Bytes for n codes of `bits` bits (n a multiple of 8)."""
    if n * bits % 8 or (bits == 3 and n % 8):
        raise ValueError(f"cannot pack {n} codes of {bits} bits")
    return n * bits // 8


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(..., n) integer codes < 2**bits -> (..., n * bits / 8) uint8."""
    *lead, n = codes.shape
    packed_size(n, bits)
    if bits == 8:
        return codes.to(torch.uint8)
    if bits == 3:
        c = codes.to(torch.int32).reshape(*lead, n // 8, 8)
        v = (c << torch.arange(0, 24, 3, dtype=torch.int32)).sum(-1, dtype=torch.int32)  # (..., n/8) 24-bit
        out = torch.stack([v & 255, (v >> 8) & 255, (v >> 16) & 255], -1)
        return out.to(torch.uint8).reshape(*lead, n * 3 // 8)
    per = 8 // bits
    c = codes.to(torch.int32).reshape(*lead, n // per, per)
    shifts = torch.arange(0, 8, bits, dtype=torch.int32)
    return (c << shifts).sum(-1, dtype=torch.int32).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """(..., m) uint8 -> (..., m * 8 / bits) uint8 codes."""
    *lead, m = packed.shape
    if bits == 8:
        return packed
    if bits == 3:
        b = packed.reshape(*lead, m // 3, 3).to(torch.int32)
        v = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        codes = (v[..., None] >> torch.arange(0, 24, 3, dtype=torch.int32)) & 7
        return codes.to(torch.uint8).reshape(*lead, m * 8 // 3)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return ((packed[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*lead, m * 8 // bits)


@lru_cache(maxsize=64)
def _byte_table(values: tuple[float, ...], bits: int) -> torch.Tensor:
    """Table from a packed group (a byte, or 12 bits for 3-bit codes) to its decoded values."""
    v = torch.tensor(values, dtype=torch.float32)
    width = 12 if bits == 3 else 8
    groups = torch.arange(1 << width, dtype=torch.int32)
    per = width // bits
    codes = (groups[:, None] >> torch.arange(0, width, bits, dtype=torch.int32)) & ((1 << bits) - 1)
    return v[codes.long()].reshape(1 << width, per).contiguous()


def lut_decode(packed: torch.Tensor, values: tuple[float, ...], bits: int) -> torch.Tensor:
    """(..., m) uint8 packed codes -> (..., n) float32 `values[code]`."""
    table = _byte_table(tuple(float(x) for x in values), bits)
    *lead, m = packed.shape
    if bits == 3:
        b = packed.reshape(-1, 3).to(torch.int32)
        g = torch.stack([b[:, 0] | ((b[:, 1] & 15) << 8), (b[:, 1] >> 4) | (b[:, 2] << 4)], -1)
        return F.embedding(g, table).reshape(*lead, m * 8 // 3)
    return F.embedding(packed.reshape(-1).to(torch.int32), table).reshape(*lead, m * 8 // bits)


def identity_values(bits: int) -> tuple[float, ...]:
    """0, 1, ..., 2**bits - 1: `lut_decode` with these unpacks integer codes as floats."""
    return tuple(float(i) for i in range(1 << bits))
