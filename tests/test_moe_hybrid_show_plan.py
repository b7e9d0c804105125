"""`show` and `plan` on a mixture of experts and a hybrid model, as a user runs them: the
weight bytes a token reads (`gguf.describe.read_per_token`: dense tensors whole, the routed
experts' share of each 3-D expert tensor, the shared expert), the KV of the full-attention
layers only, and the recurrent state of the linear-attention layers, fixed whatever the
context and counted once in what must fit. On the tiny GGUFs of tests/data/families."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from cli_helpers import cli
from tightkv import Model
from tightkv.engine.generate import prefill
from tightkv.eval.engines import equivalents
from tightkv.eval.plan import format_plan, make_plan, weight_options, working_bytes
from tightkv.gguf.describe import read_per_token
from tightkv.gguf.reader import read_gguf
from tightkv.kv.recurrent import MAX_CHECKPOINTS, RecurrentLayout, RecurrentState
from tightkv.kv.spec import kv_bytes_per_token
from tightkv.models.base import header_layout
from tiny_gguf import write_gemma3

DATA = Path(__file__).parent / "data" / "families"


def gguf(arch: str, kind: str = "q8_0") -> Path:
    return DATA / arch / f"{arch}-{kind}.gguf"


def hybrid_layout(arch: str):
    args, layout = header_layout(read_gguf(gguf(arch)))
    return args, layout, [L for L in layout if isinstance(L, RecurrentLayout)]


# --- bytes a token reads ---------------------------------------------------------------
@pytest.mark.parametrize("arch,shared", [("qwen3moe", False), ("qwen35moe", True)])
def test_a_token_reads_its_routed_experts_share(arch, shared):
    g = read_gguf(gguf(arch))
    used, total = g.metadata[f"{arch}.expert_used_count"], g.metadata[f"{arch}.expert_count"]
    exps = [t for n, t in g.tensors.items() if n.endswith("_exps.weight")]
    shexp = [t for n, t in g.tensors.items() if "_shexp." in n]
    assert exps and all(t.shape[0] == total for t in exps) and bool(shexp) == shared
    r = read_per_token(g)
    every = sum(int(t.data.nbytes) for t in g.tensors.values())
    routed = sum(int(t.data.nbytes) for t in exps)
    assert r.weights == every and r.experts == routed
    assert r.experts_read == routed * used // total and (r.experts_used, r.expert_count) == (used, total)
    assert r.shared == sum(int(t.data.nbytes) for t in shexp)
    assert r.per_token == every - routed + routed * used // total < every


def test_a_dense_model_reads_all_its_weights():
    """Every tensor once per token, as `bench`'s GB/s counts the weights; the untied token
    embedding whole too, with what a lookup leaves unread said apart."""
    g = read_gguf(gguf("qwen35"))
    r = read_per_token(g)
    assert not r.moe and r.per_token == r.weights == sum(int(t.data.nbytes) for t in g.tensors.values())
    embd = g.tensors["token_embd.weight"]
    assert r.embedding_unread == int(embd.data.nbytes) - int(embd.data.nbytes) // embd.shape[0]


# --- show ------------------------------------------------------------------------------
def test_show_a_hybrid_mixture_of_experts():
    r = cli("show", str(gguf("qwen35moe")))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"^    experts +2 of 8 per token, and a shared expert$", out, re.M), out
    read = read_per_token(read_gguf(gguf("qwen35moe")))
    line = re.search(
        r"^    read per token +([\d.]+) KiB \(dense .* \+ 2 of 8 routed experts .* \+ shared expert .*\)$", out, re.M
    )
    assert line and float(line.group(1)) == round(read.per_token / 1024, 1), out
    assert out.index("    size ") < out.index("    read per token ")  # beside the file's size
    assert "only the 2 full-attention layers of 6 hold KV; the 4 linear-attention layers keep a recurrent state" in out
    # f16 KV per token: 2 layers x 2 kv heads x (32 + 32) dims x 2 bytes, not 6 layers
    assert re.search(r"^    f16 +512 +2\.0 MiB +1\.00x$", out, re.M), out
    _, _, rec = hybrid_layout("qwen35moe")
    state = sum(L.nbytes for L in rec)
    assert len(rec) == 4 and state == 4 * 4 * (3 * 128 + 4 * 16 * 16)
    held = state * (1 + MAX_CHECKPOINTS)
    assert (
        f"    recurrent state  {state / 1024:.1f} KiB (4 linear-attention layers, float32, fixed whatever the "
        f"context; with up to {MAX_CHECKPOINTS} prefill checkpoints: {held / 1024:.1f} KiB)"
    ) in out
    assert cli("show", str(gguf("qwen35moe")), "-c", "64").stdout.count(f"{state / 1024:.1f} KiB (4 linear") == 1


def test_show_a_mixture_of_experts_without_recurrent_layers():
    out = cli("show", str(gguf("qwen3moe"))).stdout
    assert re.search(r"^    experts +2 of 8 per token$", out, re.M), out
    assert re.search(
        r"^    read per token +[\d.]+ KiB \(dense [\d.]+ KiB \+ 2 of 8 routed experts [\d.]+ KiB\)$", out, re.M
    )
    assert "recurrent" not in out and "full-attention layers" not in out


def test_show_a_dense_hybrid_and_a_dense_model(tmp_path):
    out = cli("show", str(gguf("qwen35"))).stdout
    assert "experts" not in out and "read per token" not in out and "recurrent state" in out
    out = cli("show", str(write_gemma3(tmp_path / "tiny.gguf"))).stdout
    assert "experts" not in out and "read per token" not in out and "recurrent" not in out


# --- plan ------------------------------------------------------------------------------
@pytest.mark.parametrize("kv", ["f16", "q8_0", "progressive"])
def test_plan_kv_and_recurrent_bytes_equal_the_caches(kv):
    """The KV row equals the attention caches' nbytes after a prompt; the recurrent caches
    hold no more than the plan takes for them."""
    path = gguf("qwen35moe")
    m = Model(path)
    tokens = 300
    cache = m.new_cache(kv)
    prefill(m.net, [1] + [10 + i % 200 for i in range(tokens - 1)], cache)
    plan = make_plan(path, tokens, 2**34, [kv])
    states = [c for c in cache if isinstance(c, RecurrentState)]
    assert len(states) == 4 and len(cache) == 6
    assert plan.rows[0]["kv_bytes"] == sum(c.nbytes for c in cache if not isinstance(c, RecurrentState))
    assert plan.recurrent_state == sum(s.layout.nbytes for s in states)
    assert sum(c.nbytes for c in states) <= plan.recurrent == plan.recurrent_state * (1 + MAX_CHECKPOINTS)


def test_largest_context_takes_the_recurrent_state_once():
    path = gguf("qwen35moe")
    base = make_plan(path, 1024, 2**34, ["f16"])
    per_token = kv_bytes_per_token("f16", base.layout, 1)["total_bytes"]
    assert base.recurrent > 0 and base.fixed == base.weights + base.working + base.recurrent
    memory = base.fixed + 1000 * per_token  # room for 1000 tokens of KV beside everything fixed
    plan = make_plan(path, 1024, memory, ["f16"])
    assert plan.fixed == base.fixed  # same context, same working buffers
    assert plan.rows[0]["max_context"] == 1000 and not plan.rows[0]["fits"]
    assert make_plan(path, 1000, memory, ["f16"]).rows[0]["fits"]
    assert make_plan(path, 1024, memory - 1, ["f16"]).rows[0]["max_context"] == 999
    short = make_plan(path, 1024, base.weights + base.working + base.recurrent - 1, ["f16"])
    assert not short.weights_fit and "recurrent state do not fit" in format_plan(short)


def test_working_buffers_of_a_mixture_of_experts_follow_its_expert_widths():
    args, _ = header_layout(read_gguf(gguf("qwen35moe")))
    assert args.intermediate_size == 0 and args.expert_ff and args.shared_ff
    wider = working_bytes(dataclasses.replace(args, expert_ff=2 * args.expert_ff), 4096)
    assert wider > working_bytes(args, 4096) > working_bytes(dataclasses.replace(args, shared_ff=0), 4096)
    dense, _ = header_layout(read_gguf(gguf("qwen3moe")))
    # Qwen3-MoE's feed_forward_length is not the width its experts run at
    assert working_bytes(dense, 4096) == working_bytes(dataclasses.replace(dense, intermediate_size=10**6), 4096)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_the_weight_lever_counts_the_experts(arch):
    """Requantized to Q8_0, the f32 file's experts come to what the q8_0 file holds."""
    q8 = read_per_token(read_gguf(gguf(arch))).weights
    f32 = {o["type"]: o["bytes"] for o in weight_options(read_gguf(gguf(arch, "f32")))}
    assert f32["Q8_0"] == q8 and f32["Q4_K_M"] < q8


def test_equivalents_count_the_attention_layers():
    _, layout, _ = hybrid_layout("qwen35moe")
    llama, vllm = equivalents("f16", layout, 4096)
    assert llama.bytes_per_sequence == vllm.bytes_per_sequence == 2 * 2 * 64 * 2 * 4096


def test_plan_cli_on_a_hybrid_mixture_of_experts(tmp_path):
    out_json = tmp_path / "plan.json"
    r = cli("plan", str(gguf("qwen35moe")), "--mem", "16GB", "--json", str(out_json))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(
        r"^          [\d.]+ KiB read per token \(dense .* \+ 2 of 8 routed experts .* \+ shared expert", out, re.M
    )
    assert re.search(r"^recurrent [\d.]+ KiB \(the float32 state of 4 linear-attention layers", out, re.M), out
    assert "kv        in the 2 full-attention layers of 6" in out and "everything fits" in out
    assert "(in all: weights, working buffers, recurrent state and KV)" in out
    assert "-ctk f16 -ctv f16 (2.0 MiB KV per sequence at 4096 tokens)" in out
    doc = json.loads(out_json.read_text())
    plan = make_plan(gguf("qwen35moe"), None, 16 * 10**9, ["f16"])
    assert doc["recurrent"] == plan.recurrent > 0 and doc["recurrent_state"] == plan.recurrent_state
    assert doc["read_per_token"] == plan.read.per_token < doc["weights"]


def test_plan_of_a_dense_model_has_no_recurrent_or_expert_lines(tmp_path):
    out = cli("plan", str(write_gemma3(tmp_path / "tiny.gguf", context=512)), "--mem", "16GB").stdout
    assert "recurrent" not in out and "read per token" not in out and "(in all: weights, working buffers and KV)" in out
