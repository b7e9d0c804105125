"""The 1- to 4-bit block types of issue 19 beyond gguf-py's random-block check in test_quants.py:
Q1_0 and Q2_0 against llama.cpp's reference layout (ggml-quants.c, written out here as
loops), quantized data round trips, the grids and sign table taken from gguf-py."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gq
from test_quants import assert_bit_exact, random_blocks

from tightkv.gguf import quants


def q1_0_reference(raw: np.ndarray) -> np.ndarray:
    """dequantize_row_q1_0, element by element: bit j of byte j/8 set -> d, else -d."""
    out = np.empty((raw.shape[0], 128), dtype=np.float32)
    for i, block in enumerate(raw):
        d = block[:2].view(np.float16).astype(np.float32)[0]
        for j in range(128):
            out[i, j] = d if (block[2 + j // 8] >> (j % 8)) & 1 else -d
    return out


def q2_0_reference(raw: np.ndarray) -> np.ndarray:
    """dequantize_row_q2_0: 2 bits of byte j/4 at 2*(j%4); codes 0..3 are -1, 0, 1, 2 times d."""
    out = np.empty((raw.shape[0], 64), dtype=np.float32)
    for i, block in enumerate(raw):
        d = block[:2].view(np.float16).astype(np.float32)[0]
        for j in range(64):
            q = (block[2 + j // 4] >> (2 * (j % 4))) & 3
            out[i, j] = np.float32(int(q) - 1) * d
    return out


def q1_0_quantize(x: np.ndarray) -> np.ndarray:
    """quantize_row_q1_0_ref: d = mean |x| of the block, bit j = x[j] >= 0."""
    blocks = x.reshape(-1, 128)
    d = (np.abs(blocks).sum(-1, dtype=np.float32) / np.float32(128)).astype(np.float16)
    bits = np.packbits(blocks >= 0, axis=-1, bitorder="little")
    return np.concatenate([d.reshape(-1, 1).view(np.uint8), bits], axis=-1)


def q2_0_quantize(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_0_ref: d = max |x|, code = clamp(round(x / d) + 1, 0, 3)."""
    blocks = x.reshape(-1, 64)
    d = np.abs(blocks).max(-1)
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.trunc(blocks * inv[:, None] + np.copysign(0.5, blocks)) + 1, 0, 3).astype(np.uint8)
    q = q.reshape(-1, 16, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)
    return np.concatenate([d.astype(np.float16).reshape(-1, 1).view(np.uint8), np.bitwise_or.reduce(q, -1)], -1)


@pytest.mark.parametrize("qtype, reference", [("Q1_0", q1_0_reference), ("Q2_0", q2_0_reference)])
def test_llamacpp_types_match_the_reference_layout(qtype, reference):
    raw = random_blocks(qtype, 4, 512, seed=3)
    blocks = raw.reshape(-1, quants.BLOCK_SIZES[qtype][1])
    ours = quants.dequantize(torch.from_numpy(raw), qtype, (4, 512))
    assert_bit_exact(ours, reference(blocks).reshape(4, 512))


def test_q1_0_round_trip():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 256)) * 0.1).astype(np.float32)
    x[0, :128] = 0.0  # an all-zero block: d = 0, every bit set
    w = quants.dequantize(torch.from_numpy(q1_0_quantize(x)), "Q1_0", x.shape).numpy()
    mean = np.abs(x.reshape(-1, 128)).mean(-1).astype(np.float16).astype(np.float32)
    want = np.where(x.reshape(-1, 128) >= 0, 1, -1) * mean[:, None]
    np.testing.assert_array_equal(w.reshape(-1, 128), want)


def test_q2_0_round_trip():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    w = quants.dequantize(torch.from_numpy(q2_0_quantize(x)), "Q2_0", x.shape).numpy()
    d = np.abs(x.reshape(-1, 64)).max(-1, keepdims=True)
    assert np.all(np.abs(w.reshape(-1, 64) - x.reshape(-1, 64)) <= 0.5 * d * 1.01)


@pytest.mark.parametrize("qtype", ["TQ1_0", "TQ2_0", "MXFP4"])
def test_round_trip_through_gguf_quantize(qtype):
    """Real data quantized by gguf-py: every code and scale as a quantizer writes them."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 3, size=(6, 1))).astype(np.float32)
    w[0, :256] = 0.0
    raw = gq.quantize(w, GGMLQuantizationType[qtype])
    assert_bit_exact(
        quants.dequantize(torch.from_numpy(raw), qtype, w.shape), gq.dequantize(raw, GGMLQuantizationType[qtype])
    )


def test_grids_and_signs_come_from_gguf():
    shapes = {
        "IQ2_XXS": (256, 8),
        "IQ2_XS": (512, 8),
        "IQ2_S": (1024, 8),
        "IQ3_XXS": (256, 4),
        "IQ3_S": (512, 4),
        "IQ1_S": (2048, 8),
        "IQ1_M": (2048, 8),
    }
    for qtype, shape in shapes.items():
        grid = quants.iq_grid(qtype)
        assert tuple(grid.shape) == shape and grid.dtype == torch.float32
        assert np.array_equal(quants.grid_bytes(qtype).astype(np.float32), grid.numpy())  # small integers
    assert set(quants.iq_grid("IQ1_S").unique().tolist()) == {-1.0, 0.0, 1.0}
    assert quants.iq_grid("IQ3_S").min() >= 1  # nonzero magnitudes: a sign flip is a negation
    ksigns = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
    np.testing.assert_array_equal(quants.KSIGNS.numpy(), ksigns)


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ3_S", "IQ1_M", "IQ4_XS", "NVFP4", "Q1_0"])
def test_odd_shapes_and_views(qtype):
    """A column slice of row bytes (non-contiguous) decodes as its contiguous copy."""
    block, size = quants.BLOCK_SIZES[qtype]
    raw = torch.from_numpy(random_blocks(qtype, 3, 4 * block, seed=7))
    part = raw[:, size : 3 * size]  # blocks 1 and 2 of each row
    want = quants.dequantize(part.contiguous(), qtype, (3, 2 * block))
    assert torch.equal(quants.dequantize(part, qtype, (3, 2 * block)), want)


def test_reader_takes_q2_0_tensors(tmp_path):
    """A GGUF with a Q2_0 tensor (type 42, which gguf-py 0.19 does not name) reads as row bytes.
    Written as I8 bytes, then its tensor info patched to Q2_0 and 128 columns."""
    import gguf

    from tightkv.gguf.reader import read_gguf

    raw = random_blocks("Q2_0", 3, 128, seed=8)  # (3 rows, 36 bytes)
    path = tmp_path / "q2.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw.view(np.int8), raw_dtype=GGMLQuantizationType.I8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    info = data.index(b"w", 24) + 1  # then n_dims u32, dims u64 x 2, type u32
    assert np.frombuffer(data, np.uint64, 2, info + 4).tolist() == [36, 3]
    data[info + 4 : info + 12] = np.uint64(128).tobytes()
    data[info + 20 : info + 24] = np.uint32(42).tobytes()
    path.write_bytes(bytes(data))
    t = read_gguf(path).tensors["w"]
    assert t.qtype == "Q2_0" and t.shape == (3, 128)
    assert_bit_exact(
        quants.dequantize(torch.from_numpy(np.array(t.data)), "Q2_0", t.shape),
        q2_0_reference(raw.reshape(-1, 18)).reshape(3, 128),
    )
