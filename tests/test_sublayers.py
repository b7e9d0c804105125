"""A block's sublayers in one kernel call (`kernels/sublayers.py`) against the same steps
run one by one, and the gated unit's kernel (`tk_glu`) against float64."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_gguf import write_gemma3, write_llama, write_phi3, write_qwen

from tightkv import Model
from tightkv.engine.generate import decode_batch, prefill
from tightkv.kernels import build, sublayers
from tightkv.models.base import glu

pytestmark = pytest.mark.skipif(build.library() is None, reason="no compiled kernels")

WRITERS = {
    "qwen2": lambda p, q: write_qwen(p, arch="qwen2", seed=2, qtype=q),  # q/k/v biases
    "qwen3": lambda p, q: write_qwen(p, arch="qwen3", seed=3, qtype=q),  # per-head q/k norms
    "phi3": lambda p, q: write_phi3(p, seed=4, qtype=q, head_dim=24, rope_dim=12),  # one qkv matrix, partial RoPE
    "llama": lambda p, q: write_llama(p, seed=5, qtype=q),  # its own RoPE: the feed-forward call only
    "gemma3": lambda p, q: write_gemma3(p, seed=6, qtype=q),  # norms after each sublayer, GELU
}


def decode_rows(m: Model, prompts: list[list[int]], steps: int = 3) -> torch.Tensor:
    """Logits of `steps` batched decode steps after each prompt: (steps, len(prompts), vocab)."""
    caches = [m.new_cache("f32") for _ in prompts]
    for ids, cache in zip(prompts, caches):
        prefill(m.net, ids, cache)
    return torch.stack([decode_batch(m.net, [7 + i + s for i in range(len(prompts))], caches) for s in range(steps)])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("family", list(WRITERS))
def test_sublayers_in_one_call_equal_the_steps_one_by_one(tmp_path, monkeypatch, family, qtype):
    path = WRITERS[family](tmp_path / f"{family}.gguf", qtype)
    m = Model(str(path), kv="f32", threads=2)
    prompts = [[1, 5, 9, 13], [2, 4, 6, 8, 10, 12]]
    taken = {"ffn": 0, "qkv": 0}

    def counting(name, fn):
        def wrapped(*args):
            out = fn(*args)
            taken[name] += out is not None
            return out

        return wrapped

    monkeypatch.setattr(sublayers, "ffn_block", counting("ffn", sublayers.ffn_block))
    monkeypatch.setattr(sublayers, "qkv_block", counting("qkv", sublayers.qkv_block))
    for rows in (prompts[:1], prompts):  # one sequence, and two decoded together
        fused = decode_rows(m, rows)
        assert taken["ffn"] > 0 and (taken["qkv"] > 0) == (family != "llama")
        monkeypatch.setattr(sublayers, "ffn_block", lambda *a: None)
        monkeypatch.setattr(sublayers, "qkv_block", lambda *a: None)
        assert torch.equal(fused, decode_rows(m, rows)), family
        monkeypatch.undo()
        monkeypatch.setattr(sublayers, "ffn_block", counting("ffn", sublayers.ffn_block))
        monkeypatch.setattr(sublayers, "qkv_block", counting("qkv", sublayers.qkv_block))


def test_routed_experts_in_one_call_equal_the_steps_one_by_one(monkeypatch):
    """Qwen3-MoE (llama.cpp's converter, Q8_0 experts): wo, the norms and the routed experts
    of each decode row in one call (`tk_moe_block`) give the logits of the steps one by one,
    alone and in a batch of two."""
    path = Path(__file__).parent / "data" / "families" / "qwen3moe" / "qwen3moe-q8_0.gguf"
    m = Model(str(path), kv="f32", threads=2)
    calls = []
    monkeypatch.setattr(build.library(), "tk_moe_block", counted(build.library().tk_moe_block, calls))
    for rows in ([[1, 5, 9, 13]], [[1, 5, 9, 13], [2, 4, 6, 8, 10, 12]]):
        fused = decode_rows(m, rows)
        assert calls and all(layer._ffn_plan.experts is not None for layer in m.net.layers)
        with monkeypatch.context() as off:
            off.setattr(sublayers, "ffn_block", lambda *a: None)
            assert torch.equal(fused, decode_rows(m, rows))


def counted(fn, calls: list):
    def wrapped(*args):
        calls.append(1)
        return fn(*args)

    return wrapped


def test_float_weights_take_the_steps(tmp_path):
    """Weights not in blocks (F32 here) have no block-dot product: no plan, the steps run."""
    m = Model(str(write_qwen(tmp_path / "f32.gguf", arch="qwen2", seed=2)), kv="f32", threads=1)
    block = m.net.layers[0]
    assert sublayers.FfnPlan(block.attn.wo, block.mlp, None, block.ffn_norm, None, "silu").plan is None
    assert decode_rows(m, [[1, 2, 3]]).isfinite().all()


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_gated_unit_kernel_against_float64(act):
    """tk_glu's act(gate) * up = gate * up * sigmoid(z) within a few float32 roundings of
    float64, plus what rounding z itself costs (e^z moves by |z| times z's relative error)."""
    gate = torch.cat([torch.linspace(-30, 30, 60001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 200.0, -200.0])])
    up = torch.linspace(-2, 2, gate.numel())
    ours = glu(torch.cat([gate, up])[None], act)[0].double()
    g, u = gate.double(), up.double()
    z = g if act == "silu" else 2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)
    ref = g * torch.sigmoid(z) * u
    if act == "gelu":  # the tanh form, as torch and llama.cpp write it
        assert torch.allclose(ref, 0.5 * g * (1 + torch.tanh(z / 2)) * u, rtol=1e-12, atol=1e-12)
    err = (ours - ref).abs()
    assert (err <= (4 + 2 * z.abs()) * 2.0**-24 * ref.abs() + 1e-12).all(), float(err.max())
    assert np.isfinite(ours.numpy()).all()
