"""Llama, Mistral, Qwen2, Qwen3 and Phi-3 against an independent float reference:
transformers loading the same tiny random GGUF (its own dequantizer, its own undoing
of llama.cpp's Q/K permutation, its own attention and RoPE).

The tiny files (tests/tiny_gguf.py) are written as convert_hf_to_gguf writes the
real ones: llama Q/K rows permuted, Phi-3's q/k/v and gate/up fused, Qwen's output
tied to the embedding, Qwen3's head_dim (32) != hidden / heads, Phi-3's head_dim
24 (not a power of two). All have grouped-query attention (4 query / 2 KV heads).

transformers' GGUF loader cannot load the `mistral` architecture (gguf-py has no
such name to map tensors with), so for it the reference is MistralForCausalLM
built from the config transformers parses from the file, with the tensors mapped
and un-permuted by transformers' own llama code (`hf_mistral`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tolerances import steps_rtol
from tiny_gguf import FAMILY_DEFAULTS, write_llama, write_phi3, write_qwen

transformers = pytest.importorskip("transformers")
pytest.importorskip("tightkv.kernels.qmatmul")

from tightkv import Model  # noqa: E402
from tightkv.kernels import build  # noqa: E402

ATOL = 1e-3
T = 32

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
_rng = np.random.default_rng(7)
LONGROPE = {
    "long_factor": (1.0 + 5.0 * _rng.random(12)).round(3).tolist(),
    "short_factor": (1.0 + 0.5 * _rng.random(12)).round(3).tolist(),
    "original_max_position_embeddings": 16,
}

# name -> (writer, writer kwargs, transformers class, config given to transformers)
CASES = {
    "llama": (write_llama, {}, "LlamaForCausalLM", {}),
    "mistral": (write_llama, {"arch": "mistral", "sliding_window": 8}, "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2": (write_qwen, {"arch": "qwen2"}, "Qwen2ForCausalLM", {}),
    # transformers' GGUF loader does not read qwen3.attention.key_length
    "qwen3": (write_qwen, {"arch": "qwen3"}, "Qwen3ForCausalLM", {"head_dim": 32}),
    "phi3": (write_phi3, {}, "Phi3ForCausalLM", {}),
    # RoPE variants: transformers' GGUF loader reads none of them, so its model is told
    "llama-rope-llama3": (
        write_llama,
        {"rope_scaling": LLAMA3},
        "LlamaForCausalLM",
        {"rope_parameters": {**LLAMA3, "rope_theta": 10000.0}},
    ),
    "llama-rope-linear": (
        write_llama,
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    ),
    "phi3-longrope": (
        write_phi3,
        {"context": 64, "longrope": LONGROPE},
        "Phi3ForCausalLM",
        {
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, **LONGROPE},
            "original_max_position_embeddings": 16,
        },
    ),
    # Phi-4-mini rotates part of each head: rope.dimension_count 12 of head_dim 24
    "phi3-partial-rope": (
        write_phi3,
        {"head_dim": 24, "rope_dim": 12},
        "Phi3ForCausalLM",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    ),
}
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3"]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_families")
    for name, (writer, kwargs, _, _) in CASES.items():
        writer(d / f"{name}-F32.gguf", seed=len(name), **kwargs)
        if name in FAMILIES:
            for qtype in ("Q8_0", "Q4_0"):
                writer(d / f"{name}-{qtype}.gguf", seed=len(name), qtype=qtype, **kwargs)
    return d


def hf_mistral(path, **config):
    """MistralForCausalLM from the config transformers parses from the GGUF, with the
    tensors named and un-permuted by transformers' llama GGUF code."""
    import transformers.modeling_gguf_pytorch_utils as gu
    from gguf import GGUFReader, dequantize

    parsed = gu.load_gguf_checkpoint(str(path))["config"]
    assert parsed["model_type"] == "mistral"
    kwargs = {k: v for k, v in parsed.items() if k not in ("model_type", "_model_name_or_path")}
    m = transformers.MistralForCausalLM._from_config(
        transformers.MistralConfig(**kwargs, **config), attn_implementation="eager", dtype=torch.float32
    )
    processor = gu.LlamaTensorProcessor(config=parsed)
    names = gu.get_gguf_hf_weights_map(m, processor, model_type="llama")
    state = {}
    for t in GGUFReader(str(path)).tensors:
        w = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name).weights
        state[names[t.name]] = torch.from_numpy(np.copy(w)).float()
    m.load_state_dict(state, strict=True)
    return m


def hf_model(gguf_dir, case: str, qtype: str, **override):
    _, _, cls, config = CASES[case]
    config = {**config, **override}
    if case == "mistral":
        m = hf_mistral(gguf_dir / f"{case}-{qtype}.gguf", **config)
    else:
        m = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_dir), gguf_file=f"{case}-{qtype}.gguf", dtype=torch.float32, attn_implementation="eager", **config
        )
    assert type(m).__name__ == cls
    return m.eval()


def hf_logits(gguf_dir, case: str, qtype: str, ids: list[int], **override) -> np.ndarray:
    m = hf_model(gguf_dir, case, qtype, **override)
    with torch.inference_mode():
        return m(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def random_ids(n: int = T, seed: int = 1, vocab: int = 300) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def step_logits(m: Model, ids: list[int]) -> np.ndarray:
    """Token-by-token decode through an f32 cache, logits (T, vocab)."""
    cache = m.new_cache("f32")
    with torch.inference_mode():
        rows = [m.net(torch.tensor([tok]), cache)[0].numpy() for tok in ids]
    assert cache[0].offset == len(ids)
    return np.stack(rows)


def assert_close(ours: np.ndarray, ref: np.ndarray, atol: float = ATOL) -> None:
    assert ours.shape == ref.shape
    err = np.abs(ours - ref).max()
    assert err <= atol, f"max |ours - reference| = {err:.3g} > {atol} (reference scale {np.abs(ref).max():.3g})"


def assert_rel_close(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-2) -> None:
    """max |ours - ref| within rtol of the reference's largest logit."""
    assert ours.shape == ref.shape
    err, scale = np.abs(ours - ref).max(), np.abs(ref).max()
    assert err <= rtol * scale, f"max |ours - reference| = {err:.3g} > {rtol} * {scale:.3g}"


@pytest.fixture
def backend():
    """Switch QuantLinear's backend inside a test; restored afterwards."""
    from tightkv.kernels import qmatmul

    before = qmatmul.get_backend()
    yield qmatmul.set_backend
    qmatmul.set_backend(before)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_hf(gguf_dir, case, backend):
    """F32 weights: one prefill and token-by-token decode both within 1e-3 of transformers."""
    backend("reference")
    ids = random_ids()
    ref = hf_logits(gguf_dir, case, "F32", ids)
    assert ref.std() > 0.5 and len(set(ref.argmax(-1).tolist())) > 3  # 1e-3 means something
    m = Model(str(gguf_dir / f"{case}-F32.gguf"), kv="f32", threads=1)
    assert m.args.architecture == case.split("-")[0]
    assert_close(m.logits(ids), ref)
    assert_close(step_logits(m, ids), ref)


@pytest.mark.parametrize("case", ["llama-rope-llama3", "llama-rope-linear", "phi3-longrope", "phi3-partial-rope"])
def test_rope_variant_is_visible(gguf_dir, case):
    """The variant changes transformers' logits by far more than the tolerance, so
    test_matches_hf could not pass while ignoring it."""
    ids = random_ids()
    plain = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
    without = hf_logits(gguf_dir, case, "F32", ids, **plain)
    assert np.abs(without - hf_logits(gguf_dir, case, "F32", ids)).max() > 100 * ATOL


def test_phi3_short_factors(gguf_dir):
    """Within the original context LongRoPE uses the short factors (transformers:
    sequence <= original length; ours and llama.cpp's: a context <= the original one),
    whichever way the context is set: at load, or later through Model.set_context_length
    (as the server's default context and the REPL's num_ctx do)."""
    ids = random_ids(16)
    ref = hf_logits(gguf_dir, "phi3-longrope", "F32", ids)
    path = str(gguf_dir / "phi3-longrope-F32.gguf")
    m = Model(path, kv="f32", threads=1)
    assert m.args.original_context_length == 16 and m.net.rope_factors is m.net.factors["long"]
    m.set_context_length(16)
    assert m.context_length == 16 and m.net.rope_factors is m.net.factors["short"]
    assert_close(step_logits(m, ids), ref)
    m.set_context_length(None)  # back to the trained 64: long factors, and other logits
    assert m.context_length == 64 and np.abs(m.logits(ids) - ref).max() > 100 * ATOL
    assert_close(step_logits(Model(path, kv="f32", threads=1, context_length=16), ids), ref)


def test_mistral_sliding_window_is_visible(gguf_dir):
    ids = random_ids()
    windowed = hf_logits(gguf_dir, "mistral", "F32", ids)
    assert np.abs(hf_logits(gguf_dir, "mistral", "F32", ids, sliding_window=None) - windowed).max() > 100 * ATOL


def test_tied_output(gguf_dir):
    """Qwen's tiny files have no output.weight: the output is the embedding."""
    for case, tied in (("qwen2", True), ("qwen3", True), ("llama", False), ("phi3", False)):
        m = Model(str(gguf_dir / f"{case}-F32.gguf"), kv="f32", threads=1)
        assert (m.net.output is m.net.embed) == tied == FAMILY_DEFAULTS[case]["tied"]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("case", FAMILIES)
def test_quantized(gguf_dir, case, qtype, backend):
    """Quantized blocks: our reference backend equals transformers on the same blocks
    (two dequantizers, float-equal results), and the fast backend is within `steps_rtol`
    of the reference, for a whole prefill and for token-by-token decode (a prefill of T
    rows takes the block-dot kernel, int8 activations where the build has them, on
    AVX-512 builds: `qmatmul.gemv_max_rows`)."""

    ids = random_ids()
    m = Model(str(gguf_dir / f"{case}-{qtype}.gguf"), kv="f32", threads=1)
    backend("reference")
    ref_prefill, ref_steps = m.logits(ids), step_logits(m, ids)
    assert_close(ref_prefill, hf_logits(gguf_dir, case, qtype, ids))
    backend("fast")
    fast_prefill, fast_steps = m.logits(ids), step_logits(m, ids)
    assert_rel_close(fast_prefill, ref_prefill, steps_rtol())
    assert_rel_close(fast_steps, ref_steps, steps_rtol())
    if build.status().startswith("loaded") and not build.library().tk_gemv_int8():  # float32 both: far tighter
        assert_close(fast_steps, ref_steps)


@pytest.mark.parametrize("case", FAMILIES)
def test_greedy_generation_matches_hf(gguf_dir, case):
    """Model.generate (tokenizer, cache, sampling loop) picks transformers' greedy tokens."""
    ids = random_ids(8, seed=3)
    m = Model(str(gguf_dir / f"{case}-F32.gguf"), kv="f32", threads=1)
    ours = m.generate(ids, max_tokens=12, temperature=0.0).ids
    assert len(ours) >= 8
    with torch.inference_mode():
        ref = hf_model(gguf_dir, case, "F32").generate(
            torch.tensor([ids]), max_new_tokens=len(ours), min_new_tokens=len(ours), do_sample=False
        )[0, len(ids) :]
    assert ours == ref.tolist()
