"""The reference fixtures of tests/data/families/ checked against themselves, before tightkv is
compared with them: each GGUF is the one the references were made from, transformers still
computes its stored logits, and llama.cpp's logits (f32 and q8_0 GGUFs) agree with transformers'
on the same ids, every prompt position and every greedy decode step. Two independent
implementations agreeing is what makes them a reference. The fixtures come from
tests/reference/mkfamilies.py (see its docstring); no tightkv code is involved here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

FAMILIES = Path(__file__).resolve().parent / "data" / "families"
ARCHS = ("qwen3moe", "qwen35", "qwen35moe")
PROMPT_LEN, DECODE_STEPS, VOCAB = 100, 8, 512

# transformers recomputing its own stored logits (same library versions: bit-identical; across
# versions, float32 reduction order)
HF_ATOL = 1e-4
# llama.cpp f32 GGUF vs transformers, largest |difference| over all 108 rows x 512 logits,
# measured 1.8e-3 (qwen3moe), 0.89e-3 (qwen35), 0.55e-3 (qwen35moe) for logits of std 3.07 (so
# <= 6e-4 of the logit scale; llama.cpp keeps K/V in f16): bound 5e-3, ~1.6e-3 of the scale
F32_ATOL = 5e-3
# llama.cpp q8_0 GGUF (weights and, in its matmuls, activations rounded to 8 bits) vs
# transformers' float32: mean |difference| measured 0.026 / 0.040 / 0.055, the median row's
# largest 0.11 / 0.16 / 0.17, the largest 0.15 / 0.65 / 1.23 (qwen3moe / qwen35 / qwen35moe;
# the MoE's largest are positions where q8_0 rounding flips an expert choice)
Q8_MEAN, Q8_MEDIAN_ROW, Q8_MAX = 0.08, 0.3, 2.0


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

    _, folder, _, z = family
    config = json.loads((folder / "hf" / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    model = cls.from_pretrained(folder / "hf", dtype=torch.float32, attn_implementation="eager").eval()
    out = {}
    with torch.no_grad():
        for t in ("f32", "q8_0"):
            ids = np.concatenate([z["prompt_ids"], z[f"llama_{t}_greedy"][:DECODE_STEPS]])
            out[t] = model(torch.from_numpy(ids)[None], use_cache=False).logits[0].float().numpy()
    return out


def test_fixture_shapes(family):
    arch, folder, ref, z = family
    assert ref["arch"] == arch and z["prompt_ids"].shape == (PROMPT_LEN,) and PROMPT_LEN > 64
    assert z["prompt_ids"].max() < VOCAB and z["hf_prompt_logits"].shape == (PROMPT_LEN, VOCAB)
    for t in ("f32", "q8_0"):
        assert z[f"llama_{t}_prompt_logits"].shape == (PROMPT_LEN, VOCAB)
        assert z[f"llama_{t}_decode_logits"].shape == z[f"hf_{t}_decode_logits"].shape == (DECODE_STEPS, VOCAB)
        assert z[f"llama_{t}_greedy"].shape == z[f"llama_{t}_margins"].shape == (DECODE_STEPS + 1,)
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < 8_000_000


def test_gguf_sha256(family):
    _, folder, ref, _ = family
    assert sorted(ref["gguf_sha256"]) == sorted(p.name for p in folder.glob("*.gguf"))
    for name, digest in ref["gguf_sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def test_greedy_and_margins_are_llamacpps_argmax(family):
    _, _, _, z = family
    for t in ("f32", "q8_0"):
        rows = np.concatenate([z[f"llama_{t}_prompt_logits"][-1:], z[f"llama_{t}_decode_logits"]])
        assert (rows.argmax(-1) == z[f"llama_{t}_greedy"]).all()
        top2 = np.sort(rows, -1)[:, -2:]
        np.testing.assert_allclose(top2[:, 1] - top2[:, 0], z[f"llama_{t}_margins"], atol=1e-6)


def test_transformers_recomputes_its_logits(family, hf_logits):
    _, _, _, z = family
    for t in ("f32", "q8_0"):
        np.testing.assert_allclose(hf_logits[t][:PROMPT_LEN], z["hf_prompt_logits"], rtol=0, atol=HF_ATOL)
        np.testing.assert_allclose(hf_logits[t][PROMPT_LEN:], z[f"hf_{t}_decode_logits"], rtol=0, atol=HF_ATOL)


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
    arch, _, _, z = family
    llama, hf = _pairs(z, "q8_0")
    diff = np.abs(llama - hf)
    assert diff.mean() <= Q8_MEAN, (arch, diff.mean())
    assert np.median(diff.max(-1)) <= Q8_MEDIAN_ROW, (arch, np.median(diff.max(-1)))
    assert diff.max() <= Q8_MAX, (arch, diff.max())
    # and q8_0 is farther from transformers than f32 is: the two GGUFs really differ
    f32, _ = _pairs(z, "f32")
    assert np.abs(f32 - hf).mean() * 20 < diff.mean()
