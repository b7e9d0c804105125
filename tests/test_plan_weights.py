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
    assert list(s) == [
        "Q8_0",
        "Q6_K",
        "Q5_K_M",
        "Q4_K_M",
        "IQ4_XS",
        "Q3_K_M",
        "IQ3_S",
        "IQ2_M",
        "Q2_K",
        "TQ1_0",
        "Q1_0",
    ]
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
    kv = ["f16", "q8_0", "kvarn4", "progressive", "tq3"]
    tight = make_plan(gemma, 32768, int(0.63 * GIB), kv)
    assert not any(r["fits"] for r in tight.rows)  # the file's own weights leave no KV type room
    line = weight_lever(tight)
    assert line.startswith("weights are the lever: IQ2_M (0.21 GiB) with tq3") and "32,768 tokens in 0.63 GiB" in line
    assert line in format_plan(tight)
    # only 1-bit weights would fit: never advised for a model trained in float (its Q1_0 file is noise)
    tighter = make_plan(gemma, 32768, int(0.6 * GIB), kv)
    assert weight_lever(tighter).startswith(
        "no weight type of this model holds 32,768 tokens in 0.60 GiB with any "
        "KV type (Q1_0 would, but it suits only models trained with 1-bit weights"
    )
    assert [o["type"] for o in tighter.smaller_weights()][-1] == "Q2_K"
    hopeless = make_plan(gemma, 32768, int(0.4 * GIB), ["f16"])
    assert weight_lever(hopeless).startswith("no weight type of this model holds 32,768 tokens")


def test_ternary_and_one_bit_types_suit_models_trained_that_way(gemma):
    plan = make_plan(gemma, 8192, 8 * GIB, ["f16"])
    assert not plan.suits("TQ1_0") and not plan.suits("Q1_0") and plan.suits("IQ2_M")
    plan.block_types = {"TQ2_0", "F32"}  # a BitNet-style model: its ternary weights repack to TQ1_0
    assert plan.suits("TQ1_0") and not plan.suits("Q1_0")


def test_aqlm_rho(gemma):
    plan = make_plan(gemma, 8192, 8 * GIB, ["f16"])
    rho = {r["config"]: r for r in aqlm_rho(plan)}
    # the largest matrices, ffn 2048 x 640: N = 163,840 groups of 8; 1x16 has K^M = 2^16, 2x12 2^24
    assert rho["1x16"]["bits_per_weight"] == 2 and rho["1x16"]["rho_largest"] == pytest.approx(2.5)
    assert rho["2x12"]["bits_per_weight"] == 3 and rho["2x12"]["rho_largest"] == pytest.approx(2.5 / 256)
    assert "AQLM-style codebooks" in format_plan(plan)
