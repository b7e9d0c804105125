"""Seeded randomized Walsh-Hadamard rotations for the KV codecs.

A rotation is ``y = x @ R.T`` with ``R = H @ diag(s) / sqrt(b)``: random signs s
(seeded), then a normalized Hadamard transform over blocks of b channels. For a
power-of-two head dim b = head dim; otherwise (Phi-3's 96) b is the largest
power of two dividing it and the transform is block-diagonal. R is orthogonal,
so ``x = y @ R``.

The matrix is materialized once per (dim, seed) and applied as a matmul: for
the few vectors a decode step rotates (one query, one new key) a BLAS call beats
log2(d) reshaped butterflies in Python.
"""

from __future__ import annotations

from functools import lru_cache

import torch

DEFAULT_SEED = 0x7C3A


def hadamard(n: int) -> torch.Tensor:
    """Sylvester Hadamard matrix (n, n) of +-1, n a power of two."""
    if n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotation_block(dim: int) -> int:
    """Largest power of two dividing dim."""
    return dim & -dim


@lru_cache(maxsize=32)
def rotation_signs(dim: int, seed: int = DEFAULT_SEED) -> torch.Tensor:
    """The random signs s (dim,) float32 of `rotation_matrix` (for fast transforms)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + dim)
    return torch.randint(0, 2, (dim,), generator=gen).float() * 2 - 1


@lru_cache(maxsize=32)
def rotation_matrix(dim: int, seed: int = DEFAULT_SEED) -> torch.Tensor:
    """Orthogonal (dim, dim) float32: block-diagonal normalized Hadamard times random signs."""
    b = rotation_block(dim)
    signs = rotation_signs(dim, seed)
    hb = hadamard(b) / b**0.5
    r = torch.block_diag(*([hb] * (dim // b))) if dim != b else hb
    return (r * signs[None, :]).contiguous()


@lru_cache(maxsize=32)
def gaussian_matrix(dim: int, seed: int = DEFAULT_SEED) -> torch.Tensor:
    """(dim, dim) float32 of i.i.d. N(0, 1), the QJL projection S."""
    gen = torch.Generator().manual_seed(seed * 7_919 + dim + 1)
    return torch.randn(dim, dim, generator=gen)
