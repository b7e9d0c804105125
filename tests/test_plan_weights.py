"""`tightkv plan`'s weight lever (issue 19): file-type sizes from the model's shapes, the
sentence naming a weight type and KV type that fit, and AQLM's representational ratio."""
from __future__ import annotations

import pytest
from requantized import llama_cpp_version, requantized

from tightkv.eval.plan import aqlm_rho, format_plan, make_plan, weight_lever
from tightkv.gguf.reader import read_gguf
from tightkv.registry import embedded_path

GIB = 2**30


@pytest.fixture(scope="module")
def gemma():
    return embedded_path()


def sizes(plan) -> dict[str, int]:
    return {o["type"]: o["bytes"] for o in plan.weight_options}


def test_sizes_shrink_with_bits_and_include_the_files_own_type(gemma):
    plan = make_plan(gemma, 8192, 8 * GIB, ["f16", "kvarn4"])
    s = sizes(plan)
    assert list(s) == ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_S", "IQ2_M", "Q2_K", "TQ1_0",
                       "Q1_0"]
    assert s["Q8_0"] > s["Q6_K"] > s["Q4_K_M"] > s["IQ4_XS"] > s["IQ3_S"] and s["Q1_0"] == min(s.values())
    assert abs(s["Q4_K_M"] / plan.weights - 1) < 0.01  # the embedded file is Q4_K_M


@pytest.mark.skipif(llama_cpp_version() is None, reason="needs llama-cpp-python to requantize")
@pytest.mark.parametrize("ftype", ["IQ4_XS", "IQ3_S", "Q1_0", "TQ1_0"])
def test_sizes_match_llamacpps_own_files(gemma, ftype):
    s = sizes(make_plan(gemma, 8192, 8 * GIB, ["f16"]))
    real = sum(int(t.data.nbytes) for t in read_gguf(requantized(ftype)).tensors.values())
    assert abs(s[ftype] / real - 1) < 0.02, (s[ftype], real)


def test_the_weight_lever_sentence(gemma):
    roomy = make_plan(gemma, 32768, 8 * GIB, ["f16", "kvarn4", "progressive"])
    assert weight_lever(roomy) is None  # the file's own weights hold the context
    tight = make_plan(gemma, 32768, int(0.62 * GIB), ["f16", "q8_0", "kvarn4", "progressive", "tq3"])
    assert not tight.weights_fit
    line = weight_lever(tight)
    assert line.startswith("weights are the lever: Q1_0 (0.18 GiB) with ") and "32,768 tokens in 0.62 GiB" in line
    assert line in format_plan(tight)
    hopeless = make_plan(gemma, 32768, int(0.4 * GIB), ["f16"])
    assert weight_lever(hopeless).startswith("no weight type of this model holds 32,768 tokens")


def test_aqlm_rho(gemma):
    plan = make_plan(gemma, 8192, 8 * GIB, ["f16"])
    rho = {r["config"]: r for r in aqlm_rho(plan)}
    # the largest matrices, ffn 2048 x 640: N = 163,840 groups of 8; 1x16 has K^M = 2^16, 2x12 2^24
    assert rho["1x16"]["bits_per_weight"] == 2 and rho["1x16"]["rho_largest"] == pytest.approx(2.5)
    assert rho["2x12"]["bits_per_weight"] == 3 and rho["2x12"]["rho_largest"] == pytest.approx(2.5 / 256)
    assert "AQLM-style codebooks" in format_plan(plan)
