"""The kernel's per-token ops (RMS norm, NeoX RoPE) equal torch's."""
import pytest
import torch
import torch.nn.functional as F

from tightkv.kernels import qmatmul as qm
from tightkv.kernels import library
from tightkv.models.base import apply_rope_neox, rms_norm, rope_cos_sin


@pytest.fixture(autouse=True)
def kernel():
    if library.library() is None:
        pytest.skip(library.status())


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
