"""Gated DeltaNet's two forms (`models.deltanet`): the chunked one a prompt takes equals the
token-by-token delta rule, over several chunks and a ragged end, from a non-zero state, and
a prompt cut anywhere gives the state of one run straight through."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tightkv.models.deltanet import chunked, reference


def inputs(T: int, H: int = 4, Dk: int = 16, Dv: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(T, H, Dk, generator=g), dim=-1) * Dk**-0.5
    k = F.normalize(torch.randn(T, H, Dk, generator=g), dim=-1)
    v = torch.randn(T, H, Dv, generator=g)
    decay = -F.softplus(torch.randn(T, H, generator=g)) * torch.rand(H, generator=g)  # log decay <= 0
    beta = torch.sigmoid(torch.randn(T, H, generator=g))
    S = torch.randn(H, Dk, Dv, generator=g) * 0.1
    return q, k, v, decay, beta, S


def test_chunked_equals_token_by_token():
    for T in (1, 63, 64, 150):
        q, k, v, g, beta, S = inputs(T, seed=T)
        o_ref, S_ref = reference(q, k, v, g, beta, S.clone())
        o, S_out = chunked(q, k, v, g, beta, S)
        assert o.shape == o_ref.shape and S_out.shape == S_ref.shape
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(S_out, S_ref, atol=1e-5, rtol=1e-4)


def test_cut_state_equals_straight_through():
    q, k, v, g, beta, S = inputs(200, seed=3)
    o_all, S_all = chunked(q, k, v, g, beta, S)
    o1, S1 = chunked(q[:77], k[:77], v[:77], g[:77], beta[:77], S)
    o2, S2 = reference(q[77:80], k[77:80], v[77:80], g[77:80], beta[77:80], S1.clone())
    o3, S3 = chunked(q[80:], k[80:], v[80:], g[80:], beta[80:], S2)
    torch.testing.assert_close(torch.cat([o1, o2, o3]), o_all, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(S3, S_all, atol=1e-5, rtol=1e-4)
    assert not torch.equal(S1, S)  # (a new state: the chunked form never writes the one given)


def test_step_kernel_equals_the_torch_step():
    """A decode row in one kernel call (`tk_gdn_step`) gives the torch path's output and state,
    from a non-zero state, on a layer whose key heads are fewer than its value heads."""
    from pathlib import Path

    from tightkv import Model
    from tightkv.kernels import qmatmul
    from tightkv.kv.recurrent import RecurrentState

    m = Model(str(Path(__file__).parent / "data" / "families" / "qwen35" / "qwen35-f32.gguf"), kv="f32")
    layer = m.net.layers[0].attn
    assert layer.hk < layer.hv
    g = torch.Generator().manual_seed(5)
    results = []
    for backend in ("fast", "reference"):
        qmatmul.set_backend(backend)
        try:
            state = RecurrentState(m.args.recurrent_layout())
            state.conv = torch.randn(state.conv.shape, generator=g.manual_seed(1))
            state.ssm = torch.randn(state.ssm.shape, generator=g.manual_seed(2)) * 0.1
            x = torch.randn(1, m.args.hidden_size, generator=g.manual_seed(3))
            out = layer(x, None, None, state)
            results.append((out, state.conv, state.ssm, state.offset))
        finally:
            qmatmul.set_backend("fast")
    (o1, c1, s1, n1), (o2, c2, s2, n2) = results
    assert n1 == n2 == 1
    torch.testing.assert_close(c1, c2, atol=0, rtol=0)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-4)
