"""The kernel's per-token ops (RMS norm, residual add and norm, NeoX RoPE, q/k/v heads, greedy argmax) equal torch's."""

import pytest
import torch
import torch.nn.functional as F

from tightkv.engine.sampling import argmax
from tightkv.kernels import qmatmul as qm
from tightkv.kernels import build
from tightkv.models.base import add_rms_norm, apply_rope_neox, qkv_heads, rms_norm, rope_cos_sin


@pytest.fixture(autouse=True)
def kernel():
    if build.library() is None:
        pytest.skip(build.status())


@pytest.mark.parametrize("shape", [(1, 640), (4, 1, 256), (3, 7, 96)])
def test_rms_norm_matches_torch(shape):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    assert qm.small_ops(x) is not None
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (shape[-1],), w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("H,T,D,rot", [(4, 1, 256, 256), (2, 5, 96, 64), (1, 3, 128, 128)])
def test_rope_matches_torch(H, T, D, rot):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(H, T, D, generator=g)
    cos, sin = rope_cos_sin(torch.arange(100, 100 + T), rot, 10000.0)
    fast = apply_rope_neox(x, cos, sin)
    qm.set_backend("reference")
    try:
        ref = apply_rope_neox(x, cos, sin)
    finally:
        qm.set_backend("fast")
    torch.testing.assert_close(fast, ref, rtol=1e-6, atol=1e-6)
    assert not torch.equal(fast, x)


@pytest.mark.parametrize(
    "H,Hkv,T,D,rot,norms", [(4, 1, 1, 256, 256, True), (14, 2, 5, 64, 64, False), (2, 2, 3, 96, 64, True)]
)
def test_qkv_heads_equals_the_ops_one_by_one(H, Hkv, T, D, rot, norms):
    """The fused split, per-head norms and RoPE give exactly what the separate kernel ops give
    (a row must compute the same in any path), and torch's ops within rounding."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g) * 2
    qw, kw = (torch.randn(D, generator=g), torch.randn(D, generator=g)) if norms else (None, None)
    cos, sin = rope_cos_sin(torch.arange(7, 7 + T), rot, 10000.0)
    q, k, v = qkv_heads(qkv, H, Hkv, D, cos, sin, qw, kw, 1e-6)
    q0, k0, v0 = (t.view(T, -1, D).transpose(0, 1) for t in qkv.split([H * D, Hkv * D, Hkv * D], dim=-1))
    if norms:
        q0, k0 = rms_norm(q0, qw, 1e-6), rms_norm(k0, kw, 1e-6)
    assert q.shape == (H, T, D) and k.shape == v.shape == (Hkv, T, D)
    assert torch.equal(q, apply_rope_neox(q0, cos, sin)) and torch.equal(k, apply_rope_neox(k0, cos, sin))
    assert torch.equal(v, v0)
    qm.set_backend("reference")
    try:
        ref = qkv_heads(qkv, H, Hkv, D, cos, sin, qw, kw, 1e-6)
    finally:
        qm.set_backend("fast")
    for a, b in zip((q, k, v), ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,d,post", [(1, 640, True), (5, 896, False), (3, 64, True)])
def test_add_rms_norm_equals_the_ops_one_by_one(rows, d, post):
    """The fused residual add and next norm give exactly the separate kernel ops (a row
    computes the same in any path), and torch's ops within rounding."""
    g = torch.Generator().manual_seed(3)
    x, h = torch.randn(rows, d, generator=g) * 4, torch.randn(rows, d, generator=g) * 2
    hw = torch.randn(d, generator=g) if post else None
    nw = torch.randn(d, generator=g)
    xo, y = add_rms_norm(x, h, hw, nw, 1e-6)
    x0 = x + (rms_norm(h, hw, 1e-6) if post else h)
    assert torch.equal(xo, x0) and torch.equal(y, rms_norm(x0, nw, 1e-6))
    qm.set_backend("reference")
    try:
        ref = add_rms_norm(x, h, hw, nw, 1e-6)
    finally:
        qm.set_backend("fast")
    for a, b in zip((xo, y), ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 15, 64, 1000, 262144])
def test_argmax_is_torchs(n):
    """The first largest logit, as torch.argmax picks it: random rows, ties (the first
    wins), a maximum in the tail past the last whole block, all -inf."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    cases = [x, x.round(), torch.full((n,), float("-inf"))]
    if n > 1:
        tail = x.clone()
        tail[-1] = 100.0
        tie = x.clone()
        tie[n // 3] = tie[n - 1] = 50.0
        cases += [tail, tie]
    for v in cases:
        assert argmax(v) == int(torch.argmax(v))
