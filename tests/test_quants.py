"""The torch block codecs are bit-exact with gguf-py's numpy ones."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES
from gguf import quants as gq

from tightkv.errors import GGUFError
from tightkv.gguf import quants

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# the types added for every GGUF file type llama.cpp writes (issue 19); Q1_0 and Q2_0 have no
# gguf-py dequantizer (tests/test_quants_lowbit.py checks them against llama.cpp's layout)
LOWBIT_TYPES = [
    "IQ4_NL",
    "IQ4_XS",
    "IQ3_XXS",
    "IQ3_S",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ1_S",
    "IQ1_M",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
    "NVFP4",
]
# byte offsets of the fp16 fields in each block, kept finite in random data
F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ2_XXS": [0],
    "IQ2_XS": [0],
    "IQ2_S": [0],
    "IQ1_S": [0],
    "IQ1_M": [],
    "TQ1_0": [52],
    "TQ2_0": [64],
    "MXFP4": [],
    "NVFP4": [],
    "Q1_0": [0],
    "Q2_0": [0],
}
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def random_blocks(qtype: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """(rows, row_bytes) uint8 of random blocks with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    block, size = quants.BLOCK_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = rng.uniform(-2, 2, size=(n, 1)).astype(np.float16).view(np.uint8)
    if qtype == "MXFP4":  # an exponent byte whose products stay finite
        raw[:, 0] = rng.integers(112, 140, size=n, dtype=np.uint8)
    if qtype == "IQ1_M":  # d is the top nibbles of the 4 u16 scales (bytes 48..55), low nibble first
        d = rng.uniform(-2, 2, size=n).astype(np.float16).view(np.uint16)
        for k in range(4):
            hi = 49 + 2 * k
            raw[:, hi] = (raw[:, hi] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4).astype(np.uint8)
    return raw.reshape(rows, cols // block * size)


def assert_bit_exact(ours: torch.Tensor, ref: np.ndarray) -> None:
    assert ours.dtype == torch.float32
    assert tuple(ours.shape) == ref.shape
    np.testing.assert_array_equal(ours.numpy().view(np.int32), ref.astype(np.float32).view(np.int32))


def test_block_sizes_match_gguf():
    for name, size in quants.BLOCK_SIZES.items():
        if name in GGMLQuantizationType.__members__:  # gguf-py 0.19 has no Q2_0 yet
            assert GGML_QUANT_SIZES[GGMLQuantizationType[name]] == size


@pytest.mark.parametrize("qtype", BLOCK_TYPES + LOWBIT_TYPES)
def test_random_blocks_bit_exact(qtype):
    rows, cols = 6, 512
    raw = random_blocks(qtype, rows, cols)
    ref = gq.dequantize(raw, GGMLQuantizationType[qtype])
    assert_bit_exact(quants.dequantize(torch.from_numpy(raw), qtype, (rows, cols)), ref)
    # (n_blocks, type_size) input works too
    size = quants.BLOCK_SIZES[qtype][1]
    flat = torch.from_numpy(raw.reshape(-1, size))
    assert_bit_exact(quants.dequantize(flat, qtype, (rows, cols)), ref)


@pytest.mark.parametrize("qtype", QUANTIZABLE)
def test_round_trip_real_data(qtype):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((8, 256)) * rng.uniform(0.01, 3, size=(8, 1))).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block (d = 0)
    raw = gq.quantize(w, GGMLQuantizationType[qtype])
    ref = gq.dequantize(raw, GGMLQuantizationType[qtype])
    ours = quants.dequantize(torch.from_numpy(raw), qtype, w.shape)
    assert_bit_exact(ours, ref)
    assert np.abs(ours.numpy() - w).max() < 0.2 * np.abs(w).max()


def test_float_types():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    assert_bit_exact(quants.dequantize(torch.from_numpy(w), "F32", w.shape), w)
    h = w.astype(np.float16)
    assert_bit_exact(quants.dequantize(torch.from_numpy(h), "F16", w.shape), gq.dequantize(h, GGMLQuantizationType.F16))
    assert_bit_exact(quants.dequantize(torch.from_numpy(h.view(np.uint8)), "F16", w.shape), h.astype(np.float32))
    b = gq.quantize(w, GGMLQuantizationType.BF16)  # uint8 bytes, as the reader gives them
    assert_bit_exact(
        quants.dequantize(torch.from_numpy(b), "BF16", w.shape), gq.dequantize(b, GGMLQuantizationType.BF16)
    )


def test_unsupported_type_is_one_line_error():
    with pytest.raises(GGUFError, match=r"^tensor blk\.0\.attn_q\.weight: unsupported tensor type Q8_1$"):
        quants.check_supported("Q8_1", "blk.0.attn_q.weight")
    quants.check_supported("Q6_K", "x")
