"""Attention sinks (gpt-oss): a learned logit per head that joins every softmax as one more
score with no value. The fused kernel takes it in its merge, for the dense and every
compressed cache, decode steps and prefill chunks; the torch paths are the reference, and
they in turn equal the softmax written out with the extra column."""

import pytest
import torch

from tightkv.kernels import attention
from tightkv.kv.cache import DenseCache, causal_window_mask, dense_attention
from tightkv.kv.spec import parse_kv


def explicit(q, k, v, mask, scale, sinks):
    """softmax([sink, q.k * scale]) over the visible keys, the sink's column dropped after."""
    H, T, _ = q.shape
    g = H // k.shape[0]
    k, v = k.repeat_interleave(g, 0).float(), v.repeat_interleave(g, 0).float()
    s = (q.float() @ k.transpose(1, 2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    s = torch.cat([sinks.view(H, 1, 1).expand(H, T, 1), s], 2)
    return torch.softmax(s, -1)[..., 1:] @ v


def test_dense_attention_with_sinks_is_the_softmax_written_out():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(4, 20, 32, generator=g),
        torch.randn(2, 20, 32, generator=g),
        torch.randn(2, 20, 32, generator=g),
    )
    sinks = torch.randn(4, generator=g) * 3
    pos = torch.arange(20)
    mask = causal_window_mask(pos, pos, 8)
    out = dense_attention(q, k, v, mask, 0.2, sinks)
    assert (out - explicit(q, k, v, mask, 0.2, sinks)).abs().max() < 1e-5
    very_low = dense_attention(q, k, v, mask, 0.2, torch.full((4,), -1e4))
    assert (very_low - dense_attention(q, k, v, mask, 0.2)).abs().max() < 1e-6  # a sink that never wins is no sink


def run(spec, window, chunks, sinks, backend, seed=1, hkv=2, H=8, d=64):
    g = torch.Generator().manual_seed(seed)
    before = attention.get_backend()
    attention.set_backend(backend)
    try:
        cache = (
            DenseCache("f16", hkv, d, d, window)
            if spec == "f16"
            else parse_kv(spec).make_cache(0, 1, hkv, d, d, window)
        )
        outs = []
        for T in chunks:
            q = torch.randn(H, T, d, generator=g)
            k = torch.randn(hkv, T, d, generator=g) + 0.5
            v = torch.randn(hkv, T, d, generator=g)
            outs.append(cache.attend(q, k, v, 0.125, sinks))
        return torch.cat(outs, 1)
    finally:
        attention.set_backend(before)


SPECS = ["f16", "q8_0", "tq4", "tq3", "kvarn4", "kivi2", "q8_0:tq3"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("window", [None, 40])
def test_fused_kernel_takes_sinks_as_the_reference_does(spec, window):
    """Prefill chunks, then decode steps: the kernel with sinks equals the torch path with
    sinks, and the sinks change the output (they are not ignored)."""
    if attention.lib() is None:
        pytest.skip("no kernel library")
    sinks = torch.tensor([2.0, -1.0, 0.5, 3.0, -4.0, 1.0, 0.0, 6.0])
    chunks = (70, 1, 1, 130, 1, 5, 1) if spec != "f16" else (9, 1, 1, 3, 1, 16, 1)  # dense: kernel up to 16 rows
    fast = run(spec, window, chunks, sinks, "fast")
    ref = run(spec, window, chunks, sinks, "reference")
    assert (fast - ref).abs().max() < 3e-3
    plain = run(spec, window, chunks, None, "fast")
    assert (fast - plain).abs().max() > 0.05


def test_a_row_that_sees_nothing_but_the_sink_is_zero():
    """The softmax's only score is the sink's, which has no value."""
    q, k, v = torch.randn(2, 3, 16), torch.randn(1, 3, 16), torch.randn(1, 3, 16)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    out = dense_attention(q, k, v, mask, 0.25, torch.tensor([1.0, -2.0]))
    assert out.abs().max() == 0
