"""The reference fixtures of tests/data/families/ checked against themselves, before tightkv is
compared with them: each GGUF is the one the references were made from, transformers still
computes its stored logits, and llama.cpp's logits (f32 and q8_0 GGUFs) agree with transformers'
on the same ids, every prompt position and every greedy decode step. Two independent
implementations agreeing is what makes them a reference. gpt-oss's second GGUF is llama.cpp's
MXFP4_MOE file (experts MXFP4, other matrices Q8_0), checked against transformers running on that
file's own (dequantized) weights as well as loosely against the float model. The fixtures come
from tests/reference/mkfamilies.py (see its docstring); no tightkv code is involved here."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

FAMILIES = Path(__file__).resolve().parent / "data" / "families"
ARCHS = ("qwen3moe", "qwen35", "qwen35moe", "gpt-oss", "mistral3")
PROMPT_LEN, DECODE_STEPS, VOCAB = 100, 8, 512

# transformers recomputing its own stored logits (same library versions: bit-identical; across
# versions, float32 reduction order)
HF_ATOL = 1e-4
# llama.cpp f32 GGUF vs transformers, largest |difference| over all 108 rows x 512 logits,
# measured 1.8e-3 (qwen3moe), 0.89e-3 (qwen35), 0.55e-3 (qwen35moe), 3.3e-3 (gpt-oss), 1.8e-3
# (mistral3) for logits of std 3.07-3.09 (so <= 1.1e-3 of the logit scale; llama.cpp keeps K/V in
# f16): bound 5e-3, ~1.6e-3 of the scale
F32_ATOL = 5e-3
# llama.cpp q8_0 GGUF (weights and, in its matmuls, activations rounded to 8 bits) vs
# transformers' float32: mean |difference| measured 0.026 / 0.040 / 0.055, the median row's
# largest 0.11 / 0.16 / 0.17, the largest 0.15 / 0.65 / 1.23 (qwen3moe / qwen35 / qwen35moe;
# the MoE's largest are positions where q8_0 rounding flips an expert choice)
Q8_MEAN, Q8_MEDIAN_ROW, Q8_MAX = 0.08, 0.3, 2.0
# (mistral3: 0.027, 0.11, 0.18)
# llama.cpp's MXFP4_MOE gpt-oss file vs transformers on that file's own dequantized weights (what
# is left: llama.cpp rounds the activations to Q8_0 in its MXFP4 and Q8_0 products): mean 0.029,
# median row's largest 0.094, largest 0.75 (an expert choice flipped); the same bounds as q8_0
MX_MEAN, MX_MEDIAN_ROW, MX_MAX = Q8_MEAN, Q8_MEDIAN_ROW, Q8_MAX
# ... and vs the float model (MXFP4's 4-bit experts on random weights): mean 0.36, median row's
# largest 1.34, largest 4.7
MX_FLOAT_MEAN, MX_FLOAT_MEDIAN_ROW, MX_FLOAT_MAX = 0.6, 2.5, 8.0


def _generator():
    """tests/reference/mkfamilies.py as a module, for its GGUF -> transformers weight mapping."""
    path = Path(__file__).resolve().parent / "reference" / "mkfamilies.py"
    spec = importlib.util.spec_from_file_location("mkfamilies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _types(ref):
    return ref.get("gguf_types", ["f32", "q8_0"])


@pytest.fixture(scope="module", params=ARCHS)
def family(request):
    folder = FAMILIES / request.param
    ref = json.loads((folder / "reference.json").read_text())
    with np.load(folder / "reference.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return request.param, folder, ref, arrays


@pytest.fixture(scope="module")
def hf_logits(family):
    """transformers' logits over the prompt and each GGUF's greedy continuation, recomputed."""
    import torch
    import transformers

    arch, folder, ref, z = family
    config = json.loads((folder / "hf" / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])

    def load():
        return cls.from_pretrained(folder / "hf", dtype=torch.float32, attn_implementation="eager").eval()

    def run(model, t):
        ids = np.concatenate([z["prompt_ids"], z[f"llama_{t}_greedy"][:DECODE_STEPS]])
        with torch.no_grad():
            return model(torch.from_numpy(ids)[None], use_cache=False).logits[0].float().numpy()

    model = load()
    out = {t: run(model, t) for t in _types(ref)}
    if "mxfp4" in out:  # on the MXFP4 file's own weights
        out["mxfp4_weights"] = run(_generator().with_state(load(), gpt_oss_weights(folder, arch)), "mxfp4")
    return out


def gpt_oss_weights(folder, arch):
    return _generator().gpt_oss_state_from_gguf(folder / f"{arch}-mxfp4.gguf")


def test_fixture_shapes(family):
    arch, folder, ref, z = family
    assert ref["arch"] == arch and z["prompt_ids"].shape == (PROMPT_LEN,) and PROMPT_LEN > 64
    assert z["prompt_ids"].max() < VOCAB and z["hf_prompt_logits"].shape == (PROMPT_LEN, VOCAB)
    for t in _types(ref):
        assert z[f"llama_{t}_prompt_logits"].shape == (PROMPT_LEN, VOCAB)
        assert z[f"llama_{t}_decode_logits"].shape == z[f"hf_{t}_decode_logits"].shape == (DECODE_STEPS, VOCAB)
        assert z[f"llama_{t}_greedy"].shape == z[f"llama_{t}_margins"].shape == (DECODE_STEPS + 1,)
    if "mxfp4" in _types(ref):
        assert z["hf_mxfp4_weights_prompt_logits"].shape == (PROMPT_LEN, VOCAB)
        assert z["hf_mxfp4_weights_decode_logits"].shape == (DECODE_STEPS, VOCAB)
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < 8_000_000


def test_gguf_sha256(family):
    _, folder, ref, _ = family
    assert sorted(ref["gguf_sha256"]) == sorted(p.name for p in folder.glob("*.gguf"))
    for name, digest in ref["gguf_sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def test_greedy_and_margins_are_llamacpps_argmax(family):
    _, _, ref, z = family
    for t in _types(ref):
        rows = np.concatenate([z[f"llama_{t}_prompt_logits"][-1:], z[f"llama_{t}_decode_logits"]])
        assert (rows.argmax(-1) == z[f"llama_{t}_greedy"]).all()
        top2 = np.sort(rows, -1)[:, -2:]
        np.testing.assert_allclose(top2[:, 1] - top2[:, 0], z[f"llama_{t}_margins"], atol=1e-6)


def test_transformers_recomputes_its_logits(family, hf_logits):
    _, _, ref, z = family
    for t in _types(ref):
        np.testing.assert_allclose(hf_logits[t][:PROMPT_LEN], z["hf_prompt_logits"], rtol=0, atol=HF_ATOL)
        np.testing.assert_allclose(hf_logits[t][PROMPT_LEN:], z[f"hf_{t}_decode_logits"], rtol=0, atol=HF_ATOL)
    if "mxfp4" in _types(ref):
        got = hf_logits["mxfp4_weights"]
        np.testing.assert_allclose(got[:PROMPT_LEN], z["hf_mxfp4_weights_prompt_logits"], rtol=0, atol=HF_ATOL)
        np.testing.assert_allclose(got[PROMPT_LEN:], z["hf_mxfp4_weights_decode_logits"], rtol=0, atol=HF_ATOL)


def _pairs(z, t):
    llama = np.concatenate([z[f"llama_{t}_prompt_logits"], z[f"llama_{t}_decode_logits"]])
    hf = np.concatenate([z["hf_prompt_logits"], z[f"hf_{t}_decode_logits"]])
    return llama, hf


def test_llamacpp_f32_agrees_with_transformers(family):
    arch, _, ref, z = family
    llama, hf = _pairs(z, "f32")
    diff = np.abs(llama - hf).max()
    assert diff <= F32_ATOL, (arch, diff)
    assert diff <= 2e-3 * hf.std()
    # so the greedy continuation is transformers' too (no step is a near tie at this precision)
    assert (hf[PROMPT_LEN - 1 :].argmax(-1) == z["llama_f32_greedy"]).all()
    recorded = ref["llama_vs_hf"]["f32"]
    assert max(recorded["prompt"]["max_abs"], recorded["decode"]["max_abs"]) == pytest.approx(diff, rel=1e-6)


def test_llamacpp_q8_0_agrees_loosely_with_transformers(family):
    arch, _, ref, z = family
    if "q8_0" not in _types(ref):
        pytest.skip(f"{arch} has no q8_0 GGUF")
    llama, hf = _pairs(z, "q8_0")
    diff = np.abs(llama - hf)
    assert diff.mean() <= Q8_MEAN, (arch, diff.mean())
    assert np.median(diff.max(-1)) <= Q8_MEDIAN_ROW, (arch, np.median(diff.max(-1)))
    assert diff.max() <= Q8_MAX, (arch, diff.max())
    # and q8_0 is farther from transformers than f32 is: the two GGUFs really differ
    f32, _ = _pairs(z, "f32")
    assert np.abs(f32 - hf).mean() * 20 < diff.mean()


# ---------------------------------------------------------------------------------------------
# gpt-oss and mistral3: what their fixtures are meant to exercise


def _gguf(path):
    from gguf import GGUFReader

    return GGUFReader(path)


def _field(reader, key):
    return reader.fields[key].contents()


def _gpt_oss():
    folder = FAMILIES / "gpt-oss"
    return folder, json.loads((folder / "reference.json").read_text())


def test_llamacpp_mxfp4_agrees_with_transformers_on_its_weights():
    folder, ref = _gpt_oss()
    with np.load(folder / "reference.npz") as z:
        llama = np.concatenate([z["llama_mxfp4_prompt_logits"], z["llama_mxfp4_decode_logits"]])
        own = np.concatenate([z["hf_mxfp4_weights_prompt_logits"], z["hf_mxfp4_weights_decode_logits"]])
        flt = np.concatenate([z["hf_prompt_logits"], z["hf_mxfp4_decode_logits"]])
    diff = np.abs(llama - own)
    assert diff.mean() <= MX_MEAN and np.median(diff.max(-1)) <= MX_MEDIAN_ROW and diff.max() <= MX_MAX
    far = np.abs(llama - flt)
    assert far.mean() <= MX_FLOAT_MEAN and np.median(far.max(-1)) <= MX_FLOAT_MEDIAN_ROW and far.max() <= MX_FLOAT_MAX
    # MXFP4 rounding is what separates the file from the float model, not llama.cpp's arithmetic
    assert diff.mean() * 5 < far.mean()
    recorded = ref["llama_vs_hf"]["mxfp4_vs_hf_on_its_weights"]
    assert max(recorded["prompt"]["max_abs"], recorded["decode"]["max_abs"]) == pytest.approx(diff.max(), rel=1e-6)


def test_gpt_oss_mxfp4_file_holds_mxfp4_experts():
    folder, _ = _gpt_oss()
    types = {t.name: t.tensor_type.name for t in _gguf(folder / "gpt-oss-mxfp4.gguf").tensors}
    experts = [n for n in types if n.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))]
    assert len(experts) == 3 * 4 and all(types[n] == "MXFP4" for n in experts)
    assert [n for n, t in types.items() if t == "MXFP4"] == [n for n in types if n in experts]
    assert {types[n] for n in types if n.endswith(("attn_q.weight", "attn_output.weight", "output.weight"))} == {"Q8_0"}
    assert {t.tensor_type.name for t in _gguf(folder / "gpt-oss-f32.gguf").tensors} == {"F32"}


def test_gpt_oss_features_are_exercised():
    """Sinks, the SwiGLU clamp, the sliding window and YaRN each move transformers' logits far
    more than llama.cpp and transformers differ; the clamp cuts some pre-activations."""
    folder, ref = _gpt_oss()
    from safetensors.numpy import load_file

    weights = load_file(folder / "hf" / "model.safetensors")
    sinks = np.concatenate([v for k, v in weights.items() if k.endswith("self_attn.sinks")])
    assert sinks.shape == (16,) and sinks.std() > 0.5
    assert ref["clamp"]["gate_above_limit"] > 0.005 and ref["clamp"]["up_beyond_limit"] > 0.005
    f32 = ref["llama_vs_hf"]["f32"]["prompt"]["max_abs"]
    for name in ("no_sinks", "no_swiglu_clamp", "no_sliding_window", "yarn_replaced_by_plain_rope"):
        assert ref["sensitivity_hf_prompt_logits"][name]["max_abs"] > 100 * f32, name
    cfg = ref["config"]
    assert cfg["layer_types"][0] == "sliding_attention" and cfg["sliding_window"] < PROMPT_LEN
    r = _gguf(folder / "gpt-oss-f32.gguf")
    assert _field(r, "gpt-oss.attention.sliding_window") == cfg["sliding_window"]
    assert _field(r, "gpt-oss.rope.scaling.type") == "yarn" and _field(r, "gpt-oss.rope.scaling.factor") == 32.0
    assert (
        _field(r, "gpt-oss.rope.scaling.original_context_length")
        == cfg["rope_parameters"]["original_max_position_embeddings"]
    )


def test_gpt_oss_harmony_tokenizer_and_template():
    import transformers

    folder, ref = _gpt_oss()
    ids = ref["special_token_ids"]
    assert set(ids) >= {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"}
    tok = transformers.AutoTokenizer.from_pretrained(folder / "hf")
    assert all(tok.convert_tokens_to_ids(s) == i for s, i in ids.items())
    for name in ("gpt-oss-f32.gguf", "gpt-oss-mxfp4.gguf"):
        r = _gguf(folder / name)
        tokens = r.fields["tokenizer.ggml.tokens"]
        assert all(tokens.contents(i) == s for s, i in ids.items())
        assert _field(r, "tokenizer.ggml.pre") == "gpt-4o"
        assert _field(r, "tokenizer.chat_template") == tok.chat_template
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "thinking": "greet back", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|start|>assistant<|channel|>final<|message|>Hello<|end|>" in text and text.endswith("<|start|>assistant")
    encoded = tok(text, add_special_tokens=False).input_ids
    assert encoded.count(ids["<|start|>"]) == text.count("<|start|>") and ids["<|channel|>"] in encoded


def test_mistral3_yarn_and_temperature_are_exercised():
    folder = FAMILIES / "mistral3"
    ref = json.loads((folder / "reference.json").read_text())
    rope = ref["config"]["rope_parameters"]
    # the temperature steps at positions 32, 64, 96 within the prompt and its decode steps
    assert rope["original_max_position_embeddings"] * 3 < PROMPT_LEN
    for name in ("mistral3-f32.gguf", "mistral3-q8_0.gguf"):
        r = _gguf(folder / name)
        assert _field(r, "mistral3.attention.temperature_scale") == pytest.approx(rope["llama_4_scaling_beta"])
        assert _field(r, "mistral3.rope.scaling.original_context_length") == rope["original_max_position_embeddings"]
        assert _field(r, "mistral3.rope.scaling.yarn_log_multiplier") == rope["mscale_all_dim"]
        assert _field(r, "mistral3.rope.scaling.factor") == rope["factor"]
    f32 = ref["llama_vs_hf"]["f32"]["prompt"]["max_abs"]
    sens = ref["sensitivity_hf_prompt_logits"]
    assert sens["no_attention_temperature"]["max_abs"] > 50 * f32
    assert sens["yarn_replaced_by_plain_rope"]["max_abs"] > 100 * f32
    with np.load(folder / "reference.npz") as z:
        assert z["prompt_ids"][0] == ref["special_token_ids"]["<s>"]
