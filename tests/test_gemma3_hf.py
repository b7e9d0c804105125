"""Gemma 3 against an independent float reference: transformers' Gemma3ForCausalLM
loading the same tiny random GGUF through its own GGUF loader (its own dequantizer,
its own `norm - 1` undoing of Gemma's stored +1, its own attention and RoPE).

The tiny model (tests/tiny_gguf.py) has GQA (4 query / 2 KV heads), head_dim 32
!= hidden/heads, 5 sliding layers with window 8 and one global layer, so 32
positions exercise both the window and the global RoPE base.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tolerances import steps_rtol
from tiny_gguf import write_gemma3

transformers = pytest.importorskip("transformers")
pytest.importorskip("tightkv.kernels.qmatmul")
pytest.importorskip("tightkv.gguf.tokenizer")

from tightkv import Model  # noqa: E402
from tightkv.kernels import build  # noqa: E402

HEAD_DIM = 32
ATOL = 1e-3


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_gemma3")
    for qtype in ("F32", "Q8_0", "Q4_0"):
        write_gemma3(d / f"gemma3-{qtype}.gguf", seed=0, qtype=qtype)
    write_gemma3(d / "gemma3-rope8.gguf", seed=3, rope_scaling_factor=8.0)
    return d


def hf_model(gguf_dir, name: str, **config):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        str(gguf_dir),
        gguf_file=f"gemma3-{name}.gguf",
        dtype=torch.float32,
        attn_implementation="eager",
        # the GGUF has no key for this; the HF default (256) belongs to the real checkpoints
        query_pre_attn_scalar=HEAD_DIM,
        **config,
    )
    assert type(m).__name__ == "Gemma3ForCausalLM"
    assert m.config.sliding_window == 8
    assert m.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert m.config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert m.config.rope_parameters["full_attention"]["rope_theta"] == 1e6
    return m.eval()


def hf_logits(gguf_dir, name: str, ids: list[int], **config) -> np.ndarray:
    m = hf_model(gguf_dir, name, **config)
    with torch.inference_mode():
        return m(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def random_ids(n: int, seed: int = 1, vocab: int = 300) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def step_logits(m: Model, ids: list[int], kv: str = "f32") -> np.ndarray:
    """Token-by-token decode through a cache of type kv, logits (T, vocab)."""
    cache = m.new_cache(kv)
    rows = []
    with torch.inference_mode():
        for tok in ids:
            rows.append(m.net(torch.tensor([tok]), cache)[0].numpy())
    assert cache[0].offset == len(ids)
    return np.stack(rows)


def chunked_logits(m: Model, ids: list[int], sizes: list[int]) -> np.ndarray:
    """Prefill in uneven chunks through an f32 cache, logits (T, vocab)."""
    cache = m.new_cache("f32")
    rows, s = [], 0
    with torch.inference_mode():
        for n in sizes:
            part = torch.tensor(ids[s : s + n])
            rows.append(m.net(part, cache, logits_at=torch.arange(n)).numpy())
            s += n
    assert s == len(ids)
    return np.concatenate(rows)


def assert_close(ours: np.ndarray, ref: np.ndarray, atol: float = ATOL) -> None:
    assert ours.shape == ref.shape
    err = np.abs(ours - ref).max()
    assert err <= atol, f"max |ours - reference| = {err:.3g} > {atol} (reference scale {np.abs(ref).max():.3g})"


def assert_rel_close(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-2) -> None:
    """max |ours - ref| within rtol of the reference's largest logit."""
    assert ours.shape == ref.shape
    err, scale = np.abs(ours - ref).max(), np.abs(ref).max()
    assert err <= rtol * scale, f"max |ours - reference| = {err:.3g} > {rtol} * {scale:.3g}"


@pytest.fixture(scope="module")
def f32_pair(gguf_dir):
    ids = random_ids(32)
    return Model(str(gguf_dir / "gemma3-F32.gguf"), kv="f32", threads=1), ids, hf_logits(gguf_dir, "F32", ids)


def test_reference_is_not_trivial(f32_pair):
    _, ids, ref = f32_pair
    assert ref.shape == (32, 300)
    assert ref.std() > 0.5  # logits vary enough for 1e-3 to mean something
    assert len(set(ref.argmax(-1).tolist())) > 3


def test_prefill_matches_hf(f32_pair):
    m, ids, ref = f32_pair
    assert_close(m.logits(ids), ref)


def test_token_by_token_matches_hf(f32_pair):
    m, ids, ref = f32_pair
    assert_close(step_logits(m, ids), ref)


def test_uneven_chunks_match_hf(f32_pair):
    m, ids, ref = f32_pair
    assert_close(chunked_logits(m, ids, [5, 1, 11, 15]), ref)


@pytest.mark.parametrize("kv", ["f16", "bf16"])
def test_half_precision_kv_close_to_hf(f32_pair, kv):
    m, ids, ref = f32_pair
    assert_rel_close(step_logits(m, ids, kv), ref)


def test_long_sequence_matches_hf(f32_pair, gguf_dir):
    """Past the cache's 256-token growth step, where sliding layers drop old tokens."""
    m, _, _ = f32_pair
    ids = random_ids(300, seed=2)
    ref = hf_logits(gguf_dir, "F32", ids)
    assert_close(m.logits(ids), ref)
    assert_close(chunked_logits(m, ids, [200, 70, 1, 29]), ref)
    assert_close(step_logits(m, ids), ref)


def test_linear_rope_scaling_matches_hf(gguf_dir):
    """gemma3.rope.scaling.{type,factor} scale global-layer positions only (Gemma 3 4B+).
    transformers' GGUF loader ignores these keys, so the reference gets them as config."""
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    ids = random_ids(32, seed=4)
    ref = hf_logits(gguf_dir, "rope8", ids, rope_parameters=rope)
    m = Model(str(gguf_dir / "gemma3-rope8.gguf"), kv="f32", threads=1)
    assert_close(m.logits(ids), ref)
    assert_close(step_logits(m, ids), ref)
    unscaled = hf_logits(gguf_dir, "rope8", ids)
    assert np.abs(unscaled - ref).max() > 100 * ATOL  # the scaling is visible in 32 positions


@pytest.fixture
def backend():
    """Switch QuantLinear's backend inside a test; restored afterwards."""
    from tightkv.kernels import qmatmul

    before = qmatmul.get_backend()
    yield qmatmul.set_backend
    qmatmul.set_backend(before)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_reference_backend_matches_hf(gguf_dir, qtype, backend):
    """Same blocks, two dequantizers (ours in torch, gguf-py's in HF): float-equal results."""
    ids = random_ids(32)
    ref = hf_logits(gguf_dir, qtype, ids)
    m = Model(str(gguf_dir / f"gemma3-{qtype}.gguf"), kv="f32", threads=1)
    backend("reference")
    assert_close(m.logits(ids), ref)
    assert_close(step_logits(m, ids), ref)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_fast_backend_matches_reference(gguf_dir, qtype, backend):
    """The fast path (compiled GEMV for decode, dequantized tiles for prefill) against
    the reference path, for a whole prefill and for token-by-token decode."""

    ids = random_ids(32)
    m = Model(str(gguf_dir / f"gemma3-{qtype}.gguf"), kv="f32", threads=1)
    backend("reference")
    ref_prefill, ref_steps = m.logits(ids), step_logits(m, ids)
    backend("fast")
    fast_prefill, fast_steps = m.logits(ids), step_logits(m, ids)
    status = build.status()
    assert_rel_close(fast_prefill, ref_prefill)
    assert_rel_close(fast_steps, ref_steps, steps_rtol())
    if status.startswith("loaded") and not build.library().tk_gemv_int8():  # float32 both: far tighter
        assert_close(fast_steps, ref_steps)
