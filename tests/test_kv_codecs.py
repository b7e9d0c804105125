"""KV codecs: bit-exact llama.cpp blocks, TurboQuant error at the Lloyd-Max table,
QJL unbiasedness, packing, and the documented bits per element."""

import math

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gq

from tightkv.errors import TightKVError
from tightkv.kv import bits
from tightkv.kv.codecs import (
    LLOYD_MAX,
    LLOYD_MAX_MSE,
    Q4_0,
    Q8_0,
    TurboQuant,
    TurboQuantProd,
    codec_names,
    lloyd_max_codebook,
    make_codec,
)
from tightkv.kv.rotation import hadamard, rotation_matrix


def awkward_vectors(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """(2, n, d) float32 with zero blocks, ties, sign flips and a wide dynamic range."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, d, generator=g) * torch.exp(torch.randn(2, n, 1, generator=g) * 2)
    x[0, 0] = 0
    x[0, 1, :32] = 1.5  # all equal
    x[0, 2, 5], x[0, 2, 9] = -7.0, 7.0  # |max| tie between signs
    x[1, 3] = torch.round(x[1, 3] * 4) / 4  # exact halves for round-half-away
    return x


@pytest.mark.parametrize("name,qtype,cls", [("q8_0", "Q8_0", Q8_0), ("q4_0", "Q4_0", Q4_0)])
def test_ggml_blocks_bit_exact(name, qtype, cls):
    t = GGMLQuantizationType[qtype]
    x = awkward_vectors(64, 128)
    for variant in (f"{name}-paper", name):
        c = make_codec(variant, 128)
        fields = c.encode(x)
        inner = c.encode_in(x)  # what the block quantizer sees (rotated for our variant)
        ref = gq.quantize(inner.numpy(), t)
        np.testing.assert_array_equal(cls.to_ggml(fields).numpy(), ref)
        deq = gq.dequantize(ref, t)
        np.testing.assert_array_equal(c.decode(fields).numpy().view(np.int32), deq.view(np.int32))
    assert make_codec(f"{name}-paper", 128).rotation is None


def test_ggml_bits():
    assert make_codec("q8_0", 128).bits == 8.5
    assert make_codec("q4_0", 256).bits == 4.5
    with pytest.raises(TightKVError):
        make_codec("q8_0", 80)


def test_lloyd_max_table_pinned():
    # KV_ALGORITHMS.md section 1.1 (4 decimals); a mis-scaled table doubles the error
    table = {
        2: (0.4528, 1.5104),
        3: (0.2451, 0.7560, 1.3439, 2.1519),
        4: (0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326),
    }
    for b, half in table.items():
        assert np.allclose(LLOYD_MAX[b], half, atol=6e-5)
        cb = lloyd_max_codebook(b)
        assert cb.numel() == 2**b and torch.all(cb[1:] > cb[:-1]) and torch.allclose(cb, -cb.flip(0))
    # the MSE of the table for N(0, 1), by quadrature
    for b in (2, 3, 4):
        xs = torch.linspace(-8, 8, 400_001, dtype=torch.float64)
        cb = lloyd_max_codebook(b).double()
        err = (xs[:, None] - cb[None]).abs().min(1).values ** 2
        mse = float((err * torch.exp(-(xs**2) / 2)).sum() * (xs[1] - xs[0]) / math.sqrt(2 * math.pi))
        assert abs(mse - LLOYD_MAX_MSE[b]) < 2e-5


@pytest.mark.parametrize("dim", [128, 256])
@pytest.mark.parametrize("b", [2, 3, 4])
def test_tq_round_trip_mse_matches_lloyd_max(dim, b):
    x = torch.randn(1, 4096, dim, generator=torch.Generator().manual_seed(dim + b)) * 3
    for name in (f"tq{b}-paper", f"tq{b}"):
        c = make_codec(name, dim)
        y = c.from_code(c.decode(c.encode(x)))
        rel = (((y - x) ** 2).sum(-1) / (x**2).sum(-1)).mean().item()  # per unit vector = per-coord MSE at sigma 1
        assert abs(rel / LLOYD_MAX_MSE[b] - 1) < 0.10, (name, rel)
        assert c.bits == b + 16 / dim


def test_rotation_is_orthogonal_and_seeded():
    for d in (64, 96, 128, 256):
        r = rotation_matrix(d)
        assert torch.allclose(r @ r.T, torch.eye(d), atol=1e-5)
        assert torch.equal(r, rotation_matrix(d)) and not torch.equal(r, rotation_matrix(d, seed=1))
    h = hadamard(8)
    assert torch.equal(h @ h.T, 8 * torch.eye(8))


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8])
def test_pack_round_trip(width):
    codes = torch.randint(0, 1 << width, (3, 5, 64))
    packed = bits.pack(codes, width)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == 64 * width // 8
    assert torch.equal(bits.unpack(packed, width).long(), codes)
    values = tuple(torch.randn(1 << width).tolist())
    assert torch.equal(bits.lut_decode(packed, values, width), torch.tensor(values)[codes])


def test_three_bit_layout_is_eight_codes_in_three_bytes():
    packed = bits.pack(torch.arange(8), 3)
    word = int(packed[0]) | int(packed[1]) << 8 | int(packed[2]) << 16
    assert packed.numel() == 3 and [(word >> (3 * i)) & 7 for i in range(8)] == list(range(8))


@pytest.mark.parametrize("name", [n for n in codec_names()])
@pytest.mark.parametrize("role", ["k", "v"])
def test_every_codec_round_trips_and_counts_its_bytes(name, role):
    d = 128
    c = make_codec(name, d, role)
    n = 2 * 128
    x = torch.randn(2, n, d) + torch.randn(d)
    fields = c.encode(x)
    assert all(t.shape[:2] == (2, n // c.tile) for t in fields.values())
    assert sum(t.numel() * t.element_size() for t in fields.values()) == c.unit_bytes() * 2 * n // c.tile
    assert c.bits == 8 * c.unit_bytes() / (c.tile * d)
    y = c.from_code(c.decode(fields))
    rel = ((y - x) ** 2).mean() / (x**2).mean()
    assert y.shape == x.shape and rel < 0.35, rel


def test_documented_bits():
    d = 128
    expect = {
        "tq4": 4 + 16 / d,
        "tq3": 3 + 16 / d,
        "tq2": 2 + 16 / d,
        "tqp": 4 + 32 / d,
        "tqp3": 3 + 32 / d,
        "kivi4": 5,
        "kivi2": 3,
        "f16": 16,
        "f32": 32,
    }
    for name, b in expect.items():
        assert make_codec(name, d).bits == b
    assert make_codec("kvarn4", d, "k").bits == 4 + (2 * d + 128) * 16 / (128 * d)
    assert make_codec("kvarn2", d, "v").bits == 2 + (2 * 128 + d) * 16 / (128 * d)


def test_unknown_codec_is_a_one_line_error():
    with pytest.raises(TightKVError) as e:
        make_codec("tq5", 128)
    assert "\n" not in str(e.value) and "tq4" in str(e.value)


def _batched(codec, rot, proj=None):
    codec.rotation = rot
    if proj is not None:
        codec.projection = proj
    return codec


def test_qjl_inner_products_are_unbiased_and_mse_only_is_not():
    """Fixed correlated pairs (q = k + noise); 10,000 draws of the rotation signs and the
    QJL projection. TurboQuant-prod's <q, k_hat> has mean error within 3 standard errors
    of 0; the MSE-only estimate at the same first-stage bits is visibly shrunk."""
    d, draws, batch = 128, 10_000, 1000
    g = torch.Generator().manual_seed(7)
    k = torch.randn(4, d, generator=g)
    k = k / k.norm(dim=-1, keepdim=True) * 8.0  # norms exact in fp16
    q = k + 0.5 * torch.randn(4, d, generator=g)
    true = (q * k).sum(-1)
    h = hadamard(d) / math.sqrt(d)
    prod_err, mse_err = [], []
    prod, mse = TurboQuantProd(d, paper=True, bits=3), TurboQuant(d, paper=True, bits=2)
    for _ in range(draws // batch):
        signs = torch.randint(0, 2, (batch, 1, d), generator=g).float() * 2 - 1
        rot = h[None] * signs  # (batch, d, d) randomized Hadamard
        proj = torch.randn(batch, d, d, generator=g)
        x = k.expand(batch, 4, d)
        for codec, out in ((_batched(prod, rot, proj), prod_err), (_batched(mse, rot), mse_err)):
            k_hat = codec.from_code(codec.decode(codec.encode(x)))
            out.append((q * k_hat).sum(-1) - true)
    for errs, unbiased in ((prod_err, True), (mse_err, False)):
        e = torch.cat(errs).double()  # (draws, pairs)
        z = e.mean(0) / (e.std(0) / math.sqrt(draws))
        if unbiased:
            assert torch.all(z.abs() < 3), z
        else:
            assert torch.all(z.abs() > 3), z
