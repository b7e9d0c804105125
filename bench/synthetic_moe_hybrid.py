"""Speed of the new families on synthetic models of real shapes, ours against llama.cpp on
the same file, threads and depth (flash attention on), and what an MoE decode step reads.

The models, random Q4_K weights (valid blocks, seeded; speed only), written into a
temporary directory:

- ``hybrid``: Qwen3.5-2B-shaped (``qwen35``): hidden 2048, 24 layers of which every 4th is
  gated full attention (8 query heads, 2 KV heads of 256, 64 rotated dims) and the others
  Gated DeltaNet (16 key and 16 value heads of 128, convolution 4), FFN 6144, vocab 248320,
  output tied to the embedding.
- ``moe``: Qwen3-30B-A3B-shaped (``qwen3moe``) with 8 of its 48 layers: hidden 2048, 32
  query heads and 4 KV heads of 128, 128 experts of width 768, 8 used, vocab 151936.
- ``gptoss``: gpt-oss-20b-shaped (``gpt-oss``) with 4 of its 24 layers: hidden 2880, 64
  query heads and 8 KV heads of 64 with sinks and biases, sliding windows of 128 tokens on
  every other layer, YaRN (factor 32 over 4096), 32 experts of width 2880, 4 used, with
  biases, vocab 201088; as the published files, the experts in MXFP4 and the other matrices
  in Q8_0 (random valid blocks).
- ``gemma4``: Gemma-4-E2B-shaped (``gemma4``), whole: hidden 1536, 35 layers, every 5th
  global (head dim 512, proportional RoPE over 1e6 via rope_freqs) and the others sliding
  (head dim 256, window 512, RoPE 1e4), 8 query heads and 1 KV head, the last 20 layers
  reading the KV of the last earlier layer of their kind (no K/V of their own) with a
  double-wide FFN (12288 against 6144), per-layer token embeddings of 256 a layer (a
  262144 x 8960 table), logits soft-capped at 30, output tied to the embedding, vocab
  262144; tensor types as llama.cpp's Q4_K_M (Q6_K embeddings, Q6_K attn_v/ffn_down on its
  more-bits layers, F16 per_layer_model_proj): 4.6B parameters, 3.4 GB, 1.47 GB of it read
  per decoded token (one row of the per-layer table); sources in `write_gemma4`.

    python bench/synthetic_moe_hybrid.py --depths 16,16384 --json docs/bench/synthetic_moe_hybrid.json

Rows: each engine fills its cache to `depth` tokens with a prefill (pp, tokens/s; at depth
512 that is pp512), then decodes `n-gen` tokens (tg; the first step not timed). Ours with
the default cache, llama.cpp with f16 and q8_0 caches. `--rounds R` runs the engines R times
in turn, each run in a fresh process, and keeps each engine's round of median decode speed
(every round's in `tg_rounds`): a shared machine's speed drifts by 10-30% over minutes, alike
for both engines. With rounds, it also prints each round's ratio of ours to llama.cpp's run
of the same round, and their median. For the MoE models (and gemma4),
`--bytes` also measures the weight bytes one decode step reads: the file's pages are dropped
from memory (madvise and posix_fadvise DONTNEED, read-around off), one token decoded, and
the pages then resident counted (mincore), against the routed experts' rows plus the dense
weights (gemma4: one row of the per-layer embedding table).
`--memory TOKENS` also records the RSS at load against the file's size and a decode step's
peak RSS at that depth against the load plus the cache (bench/decode_memory.py). Prints a
table and writes JSON. Not a timed test.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import synthetic_llama as base  # noqa: E402  (the measurement of one engine, in its own process)

MODELS = {
    "hybrid": dict(
        arch="qwen35",
        hidden=2048,
        layers=24,
        heads=8,
        kv_heads=2,
        head_dim=256,
        rope_dim=64,
        intermediate=6144,
        vocab=248320,
        k_heads=16,
        v_heads=16,
        head_k=128,
        head_v=128,
        conv=4,
        interval=4,
    ),
    "gptoss": dict(
        arch="gpt-oss",
        hidden=2880,
        layers=4,
        heads=64,
        kv_heads=8,
        head_dim=64,
        intermediate=2880,
        vocab=201088,
        experts=32,
        used=4,
        expert_ff=2880,
        window=128,
    ),
    "gemma4": dict(
        arch="gemma4",
        hidden=1536,
        layers=35,
        heads=8,
        kv_heads=1,
        head_dim=512,  # global layers
        head_dim_swa=256,  # sliding layers
        intermediate=6144,
        intermediate_shared=12288,  # the double-wide MLP of the shared-KV layers
        vocab=262144,
        window=512,
        global_every=5,  # layers 4, 9, ..., 34 global
        shared_kv_layers=20,
        per_layer=256,
        softcap=30.0,
        rope_partial=0.25,  # global layers: the first quarter of the head rotated
    ),
    "moe": dict(
        arch="qwen3moe",
        hidden=2048,
        layers=8,
        heads=32,
        kv_heads=4,
        head_dim=128,
        intermediate=6144,
        vocab=151936,
        experts=128,
        used=8,
        expert_ff=768,
    ),
}


def _f16(x: float) -> np.ndarray:
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


# Random valid blocks of each type the files use: (weights per block, bytes per block, the
# fixed fields {offset: bytes}): small fixed scales, random codes (and Q6_K's int8 sub-scales)
BLOCKS = {
    "Q4_K": (256, 144, {0: _f16(2e-3), 2: _f16(1e-3)}),  # d, dmin
    "Q6_K": (256, 210, {208: _f16(1e-4)}),  # d
    "Q8_0": (32, 34, {0: _f16(2e-4)}),
    "MXFP4": (32, 17, {0: np.uint8([120])}),  # exponent 2^-8
}


def blocks(qtype: str, rng, rows: int, cols: int) -> np.ndarray:
    """Random valid `qtype` blocks of a (rows, cols) matrix, as bytes (rows, row bytes)."""
    qk, size, fixed = BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // qk, size), dtype=np.uint8)
    for at, value in fixed.items():
        raw[:, :, at : at + len(value)] = value
    return raw.reshape(rows, cols // qk * size)


def vocab(size: int):
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_gguf import BYTE, CONTROL, NORMAL, SPACE, UNKNOWN, Vocab

    tokens = ["<pad>", "</s>", "<s>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [BYTE] * 256
    tokens += [f"{SPACE}t{i}" for i in range(size - len(tokens))]
    types += [NORMAL] * (size - len(types))
    scores = [0.0] * 260 + [-float(i) for i in range(size - 260)]
    return Vocab(tokens, scores, types, {"padding": 0, "eos": 1, "bos": 2, "unk": 3})


def write_model(kind: str, path: Path, seed: int = 0) -> Path:
    """The synthetic GGUF of `kind` (see MODELS), Q4_K matrices and float32 vectors."""
    from gguf import GGMLQuantizationType, GGUFWriter

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_gguf import _add_vocab

    c, rng = MODELS[kind], np.random.default_rng(seed)
    if kind == "gemma4":
        return write_gemma4(c, rng, path)
    arch, h = c["arch"], c["hidden"]
    w = GGUFWriter(str(path), arch)
    w.add_name(f"synthetic-{kind}")
    meta = {
        "context_length": 32768,
        "embedding_length": h,
        "block_count": c["layers"],
        "feed_forward_length": c["intermediate"],
        "attention.head_count": c["heads"],
        "attention.head_count_kv": c["kv_heads"],
        "attention.key_length": c["head_dim"],
        "attention.value_length": c["head_dim"],
        "rope.dimension_count": c.get("rope_dim", c["head_dim"]),
        "rope.freq_base": 1e7,
    }
    for key, value in meta.items():
        w.add_uint32(f"{arch}.{key}", value) if isinstance(value, int) else w.add_float32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    if kind == "moe":
        for key in ("expert_count", "expert_used_count", "expert_feed_forward_length"):
            w.add_uint32(
                f"{arch}.{key}", c[{"expert_count": "experts", "expert_used_count": "used"}.get(key, "expert_ff")]
            )
    elif kind == "hybrid":
        ssm = {"conv_kernel": c["conv"], "state_size": c["head_k"], "group_count": c["k_heads"]}
        ssm.update(time_step_rank=c["v_heads"], inner_size=c["v_heads"] * c["head_v"])
        for key, value in ssm.items():
            w.add_uint32(f"{arch}.ssm.{key}", value)
        w.add_uint32(f"{arch}.full_attention_interval", c["interval"])
        w.add_array(
            f"{arch}.rope.dimension_sections", [c["rope_dim"] // 2 - c["rope_dim"] // 4, c["rope_dim"] // 4, 0, 0]
        )
    _add_vocab(w, vocab(c["vocab"]))
    if kind == "gptoss":
        return write_gptoss(w, c, rng, path)

    def mat(name, rows, cols):
        w.add_tensor(name, blocks("Q4_K", rng, rows, cols), raw_dtype=GGMLQuantizationType.Q4_K)

    def vec(name, values):
        w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    mat("token_embd.weight", c["vocab"], h)
    for i in range(c["layers"]):
        p, hd = f"blk.{i}.", c["head_dim"]
        vec(p + "attn_norm.weight", np.ones(h))
        if kind == "hybrid" and (i + 1) % c["interval"]:
            kw, vw = c["k_heads"] * c["head_k"], c["v_heads"] * c["head_v"]
            mat(p + "attn_qkv.weight", 2 * kw + vw, h)
            mat(p + "attn_gate.weight", vw, h)
            mat(p + "ssm_beta.weight", c["v_heads"], h)
            mat(p + "ssm_alpha.weight", c["v_heads"], h)
            vec(p + "ssm_conv1d.weight", rng.uniform(-0.5, 0.5, (2 * kw + vw, c["conv"])))
            vec(p + "ssm_dt.bias", rng.uniform(-4, -2, c["v_heads"]))
            vec(p + "ssm_a", -np.exp(rng.uniform(0, 2, c["v_heads"])))
            vec(p + "ssm_norm.weight", np.ones(c["head_v"]))
            mat(p + "ssm_out.weight", h, vw)
        else:
            q_rows = c["heads"] * hd * (2 if kind == "hybrid" else 1)
            mat(p + "attn_q.weight", q_rows, h)
            mat(p + "attn_k.weight", c["kv_heads"] * hd, h)
            mat(p + "attn_v.weight", c["kv_heads"] * hd, h)
            mat(p + "attn_output.weight", h, c["heads"] * hd)
            vec(p + "attn_q_norm.weight", np.ones(hd))
            vec(p + "attn_k_norm.weight", np.ones(hd))
        if kind == "hybrid":
            vec(p + "post_attention_norm.weight", np.ones(h))
            mat(p + "ffn_gate.weight", c["intermediate"], h)
            mat(p + "ffn_up.weight", c["intermediate"], h)
            mat(p + "ffn_down.weight", h, c["intermediate"])
        else:
            vec(p + "ffn_norm.weight", np.ones(h))
            vec(p + "ffn_gate_inp.weight", rng.standard_normal((c["experts"], h)) / np.sqrt(h))
            E, ff = c["experts"], c["expert_ff"]
            for name, rows, cols in (("gate", ff, h), ("up", ff, h), ("down", h, ff)):
                experts = np.stack([blocks("Q4_K", rng, rows, cols) for _ in range(E)])
                w.add_tensor(p + f"ffn_{name}_exps.weight", experts, raw_dtype=GGMLQuantizationType.Q4_K)
    vec("output_norm.weight", np.ones(h))
    if kind == "moe":
        mat("output.weight", c["vocab"], h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_gptoss(w, c: dict, rng, path: Path) -> Path:
    """The rest of the gpt-oss-shaped file (see MODELS) after the common metadata and vocabulary."""
    from gguf import GGMLQuantizationType

    arch, h, E, ff = c["arch"], c["hidden"], c["experts"], c["expert_ff"]
    for key, value in (("expert_count", E), ("expert_used_count", c["used"]), ("expert_feed_forward_length", ff)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.attention.sliding_window", c["window"])
    w.add_string(f"{arch}.rope.scaling.type", "yarn")
    w.add_float32(f"{arch}.rope.scaling.factor", 32.0)
    w.add_uint32(f"{arch}.rope.scaling.original_context_length", 4096)

    def mat(name, rows, cols, kind=GGMLQuantizationType.Q8_0):
        w.add_tensor(name, blocks(kind.name, rng, rows, cols), raw_dtype=kind)

    def vec(name, values):
        w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    mat("token_embd.weight", c["vocab"], h)
    for i in range(c["layers"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", np.ones(h))
        vec(p + "post_attention_norm.weight", np.ones(h))
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            mat(p + f"attn_{name}.weight", rows, h)
            vec(p + f"attn_{name}.bias", rng.standard_normal(rows) * 0.01)
        mat(p + "attn_output.weight", h, q)
        vec(p + "attn_output.bias", rng.standard_normal(h) * 0.01)
        vec(p + "attn_sinks.weight", rng.standard_normal(c["heads"]))
        vec(p + "ffn_gate_inp.weight", rng.standard_normal((E, h)) / np.sqrt(h))
        vec(p + "ffn_gate_inp.bias", rng.standard_normal(E) * 0.1)
        for name, rows, cols in (("gate", ff, h), ("up", ff, h), ("down", h, ff)):
            experts = np.stack([blocks("MXFP4", rng, rows, cols) for _ in range(E)])
            w.add_tensor(p + f"ffn_{name}_exps.weight", experts, raw_dtype=GGMLQuantizationType.MXFP4)
            vec(p + f"ffn_{name}_exps.bias", rng.standard_normal((E, rows)) * 0.01)
    vec("output_norm.weight", np.ones(h))
    mat("output.weight", c["vocab"], h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_gemma4(c: dict, rng, path: Path) -> Path:
    """The Gemma-4-E2B-shaped file (see MODELS), metadata keys, tensor names and shapes as
    llama.cpp's converter writes them (tests/reference/mkgemma4.py's fixtures).

    Where the numbers come from (the checkpoint's own config.json could not be read offline):
    - 35 layers: llama.cpp's gemma4.cpp (35 layers is LLM_TYPE_E2B).
    - hidden 1536, FFN 6144, 8 heads, 1 KV head, head_dim 256, global_head_dim 512,
      sliding_window 512, layer_types global at index % 5 == 4, num_kv_shared_layers 20,
      use_double_wide_mlp, hidden_size_per_layer_input 256, vocab_size(_per_layer_input)
      262144, final_logit_softcapping 30, tied embeddings, max_position_embeddings 131072,
      RoPE 1e4 sliding / 1e6 global with partial_rotary_factor 0.25: google/gemma-4-E2B's
      text_config as several public repositories quote it (all agreeing), and gemma.cpp's
      E2B config (google/gemma.cpp PR 919: 35 layers, 1536, TTTTF, FFN 6144/12288, 256/512
      head dims, window 512, cap 30, vocab 262144).
    - The double width (2 x 6144) on exactly the KV-sharing layers, the global layers' KV
      heads equal to num_key_value_heads (attention_k_eq_v false): transformers 5.25's
      gemma4 (Gemma4TextMLP, Gemma4TextConfig).
    - Types: llama.cpp's quantizer (llama-quant.cpp of llama-cpp-python 0.3.36) at Q4_K_M:
      with a tied output, token_embd and per_layer_token_embd (both its TOKEN_EMBD) take the
      output's type, Q6_K; attn_v and ffn_down Q6_K on its use_more_bits layers (of the 15
      attn_v and the 35 ffn_down), per_layer_model_proj never quantized (F16 here; a bf16
      conversion keeps BF16), norms, scales and rope_freqs float32, all else Q4_K (every
      width a multiple of 256). Not verified: the types in the published Q4_K_M files.
    """
    from gguf import GGMLQuantizationType, GGUFWriter

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_gguf import _add_vocab

    arch, h, n, H, P = c["arch"], c["hidden"], c["layers"], c["heads"], c["per_layer"]
    first_shared = n - c["shared_kv_layers"]
    sliding = [bool((i + 1) % c["global_every"]) for i in range(n)]
    ff = [c["intermediate_shared"] if i >= first_shared else c["intermediate"] for i in range(n)]
    w = GGUFWriter(str(path), arch)
    w.add_name("synthetic-gemma4")
    w.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M
    for key, value in {
        "context_length": 131072,
        "embedding_length": h,
        "block_count": n,
        "attention.head_count": H,
        "attention.head_count_kv": c["kv_heads"],
        "attention.key_length": c["head_dim"],
        "attention.value_length": c["head_dim"],
        "attention.key_length_swa": c["head_dim_swa"],
        "attention.value_length_swa": c["head_dim_swa"],
        "attention.sliding_window": c["window"],
        "attention.shared_kv_layers": c["shared_kv_layers"],
        "embedding_length_per_layer_input": P,
        "rope.dimension_count": c["head_dim"],
        "rope.dimension_count_swa": c["head_dim_swa"],
    }.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_array(f"{arch}.feed_forward_length", ff)  # per layer (int32)
    w.add_array(f"{arch}.attention.sliding_window_pattern", sliding)  # per layer (bool)
    w.add_float32(f"{arch}.rope.freq_base", 1e6)
    w.add_float32(f"{arch}.rope.freq_base_swa", 1e4)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.final_logit_softcapping", c["softcap"])
    _add_vocab(w, vocab(c["vocab"]))

    Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K

    def mat(name, rows, cols, kind=Q4_K):
        w.add_tensor(name, blocks(kind.name, rng, rows, cols), raw_dtype=kind)

    def vec(name, values):
        w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    def more_bits(i: int, count: int) -> bool:  # llama-quant.cpp's use_more_bits
        return i < count // 8 or i >= 7 * count // 8 or (i - count // 8) % 3 == 2

    rotated = int(c["rope_partial"] * c["head_dim"]) // 2  # pairs; the others divided by 1e30
    vec("rope_freqs.weight", [1.0] * rotated + [1e30] * (c["head_dim"] // 2 - rotated))
    mat("token_embd.weight", c["vocab"], h, Q6_K)
    mat("per_layer_token_embd.weight", c["vocab"], n * P, Q6_K)
    proj = rng.standard_normal((n * P, h), dtype=np.float32) / np.sqrt(h)
    w.add_tensor("per_layer_model_proj.weight", proj.astype(np.float16))
    vec("per_layer_proj_norm.weight", np.ones(P))
    for i in range(n):
        p, D = f"blk.{i}.", c["head_dim_swa"] if sliding[i] else c["head_dim"]
        kv = c["kv_heads"] * D
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            vec(p + norm + ".weight", np.ones(h))
        vec(p + "layer_output_scale.weight", [1.0])
        mat(p + "attn_q.weight", H * D, h)
        vec(p + "attn_q_norm.weight", np.ones(D))
        if i < first_shared:  # a shared layer has queries only
            mat(p + "attn_k.weight", kv, h)
            mat(p + "attn_v.weight", kv, h, Q6_K if more_bits(i, first_shared) else Q4_K)
            vec(p + "attn_k_norm.weight", np.ones(D))
        mat(p + "attn_output.weight", h, H * D)
        mat(p + "ffn_gate.weight", ff[i], h)
        mat(p + "ffn_up.weight", ff[i], h)
        mat(p + "ffn_down.weight", h, ff[i], Q6_K if more_bits(i, n) else Q4_K)
        mat(p + "inp_gate.weight", P, h)
        mat(p + "proj.weight", h, P)
    vec("output_norm.weight", np.ones(h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def expected_bytes(path: Path) -> dict:
    """What one decode step must read (`gguf.describe.read_per_token`): the routed experts'
    share of the expert tensors, the rest whole, but one row of an embedding that is not
    also the output layer and of a per-layer embedding table (counted so in `dense`)."""
    from tightkv.gguf.describe import read_per_token
    from tightkv.gguf.reader import read_gguf

    r = read_per_token(read_gguf(path))
    dense = r.dense + r.shared - r.embedding_unread
    return {"dense_bytes": dense, "routed_expert_bytes": r.experts_read, "expected_bytes": dense + r.experts_read}


def measured_bytes(path: Path, threads: int) -> dict:
    """The file bytes one decode step brings into memory (see the module docstring)."""
    import torch

    from tightkv.api import Model
    from tightkv.engine.generate import decode_step, prefill

    torch.set_num_threads(threads)
    model = Model(str(path), threads=threads, context_length=256)
    cache = model.new_cache()
    prefill(model.net, [2, 300, 301, 302], cache)
    whole = model.gguf.tensors["token_embd.weight"].data
    while not isinstance(whole, np.memmap) or isinstance(whole.base, np.ndarray):
        whole = whole.base  # up to the map of the whole file (gguf's reader maps it at offset 0)
    libc = ctypes.CDLL(None, use_errno=True)
    size, base_addr = whole.nbytes, whole.ctypes.data
    page = os.sysconf("SC_PAGE_SIZE")
    MADV_RANDOM, MADV_DONTNEED = 1, 4
    libc.madvise(ctypes.c_void_p(base_addr), ctypes.c_size_t(size), MADV_RANDOM)
    libc.madvise(ctypes.c_void_p(base_addr), ctypes.c_size_t(size), MADV_DONTNEED)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    before = _resident(libc, base_addr, size, page)
    decode_step(model.net, 400, cache)
    after = _resident(libc, base_addr, size, page)
    os.close(fd)
    return {"resident_before": before, "read_bytes": after - before}


def memory(path: Path, tokens: int, threads: int) -> dict:
    """RSS at load (every weight touched) against the file, and a decode step's peak at `tokens`
    tokens against the load plus the cache (bench/decode_memory.py, the default cache)."""
    import decode_memory

    row = decode_memory.run(str(path), "kvarn4", tokens, 32, threads)
    size = path.stat().st_size
    row.update(file_bytes=size, load_bound=int(1.3 * size + 100 * 2**20))
    row["load_ok"] = row["load_rss"] <= row["load_bound"]
    return row


def _resident(libc, addr: int, size: int, page: int) -> int:
    pages = (size + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec):
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int(np.frombuffer(vec, np.uint8).astype(bool).sum()) * page


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="hybrid,moe")
    ap.add_argument("--depths", default="16,512,16384", help="context depths, comma-separated")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument(
        "--warmup",
        type=int,
        default=16,
        help="decode steps before the timed ones (an MoE step touches experts not yet mapped)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every engine this many times in turn, each in a fresh process (the round of median decode speed)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ours", default="kvarn4", help="our KV types (default: the default cache), comma-separated")
    ap.add_argument("--llamacpp", default="f16,q8_0")
    ap.add_argument("--bytes", action="store_true", help="measure the bytes an MoE (or gemma4) decode step reads")
    ap.add_argument(
        "--memory", type=int, default=0, help="TOKENS: RSS at load and of decode steps at this depth (decode_memory.py)"
    )
    ap.add_argument("--dir", default=None, help="keep the written models here (default: a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--merge", action="store_true", help="keep the JSON's other rows (a partial rerun replaces its own)"
    )
    ns = ap.parse_args()
    if ns.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {ns.rounds}")
    doc = {"models": {k: MODELS[k] for k in ns.models.split(",")}, "threads": ns.threads, "n_gen": ns.n_gen}
    doc["warmup"], doc["rounds"] = ns.warmup, ns.rounds
    doc["machine"] = base_machine()
    rows = doc["rows"] = []
    kept = json.loads(Path(ns.json).read_text()) if ns.merge and ns.json and Path(ns.json).exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(ns.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for kind in ns.models.split(","):
            path = folder / f"synthetic-{kind}-q4_k.gguf"
            if not path.exists():
                t = time.perf_counter()
                write_model(kind, path)
                print(
                    f"wrote {path.name} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s",
                    file=sys.stderr,
                )
            if ns.memory:
                doc.setdefault("memory", {})[kind] = memory(path, ns.memory, ns.threads)
                print(doc["memory"][kind], file=sys.stderr)
            if ns.bytes and kind in ("moe", "gptoss", "gemma4"):
                doc[f"{kind}_bytes"] = {**expected_bytes(path), **base.isolated(measured_bytes, path, ns.threads)}
                print(doc[f"{kind}_bytes"], file=sys.stderr)
            for depth in (int(d) for d in ns.depths.split(",")):
                runs = [(base.ours, "tightkv", kv) for kv in filter(None, ns.ours.split(","))]
                runs += [(base.llamacpp, "llama.cpp", kv) for kv in filter(None, ns.llamacpp.split(","))]
                got: dict[tuple[str, str], list[dict]] = {}
                for r in range(ns.rounds):  # the engines in turn, each in a process of its own
                    for fn, engine, kv in runs:
                        print(
                            f"{kind} depth {depth}: {engine} {kv} (round {r + 1}/{ns.rounds}) ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        args = (path, kv, depth, ns.n_gen, ns.threads, ns.reps, MODELS[kind]["vocab"], ns.warmup)
                        got.setdefault((engine, kv), []).append(base.isolated(fn, *args))
                rows.extend({"model": kind, **median_round(measured)} for measured in got.values())
                if ns.json:
                    Path(ns.json).write_text(json.dumps(merged(kept, doc), indent=1))
    print_table(rows)


def median_round(runs: list[dict]) -> dict:
    """Of one engine's rounds, the one with the median decode speed, with every round's speed
    (`tg_rounds`): on a shared machine the engines' speeds drift together over minutes, so
    rounds taken in turn and compared at their medians cancel most of it."""
    row = dict(sorted(runs, key=lambda r: r["tg_tok_s"])[(len(runs) - 1) // 2])
    if len(runs) > 1:
        row["tg_rounds"] = [r["tg_tok_s"] for r in runs]
    return row


def merged(kept: dict, doc: dict) -> dict:
    """`doc`, with the rows, byte and memory figures of `kept` it does not measure itself."""
    if not kept:
        return doc
    key = lambda r: (r["model"], r["depth"], r["engine"], r["kv"])  # noqa: E731
    new = {key(r) for r in doc["rows"]}
    out = {**kept, **{k: v for k, v in doc.items() if k != "rows"}}
    out["models"] = {**kept.get("models", {}), **doc["models"]}
    out["rows"] = [r for r in kept.get("rows", []) if key(r) not in new] + doc["rows"]
    for part in ("moe_bytes", "gptoss_bytes", "gemma4_bytes", "memory"):
        if part in kept and part not in doc:
            out[part] = kept[part]
    return out


def base_machine() -> str:
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    name = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return f"{os.cpu_count()} cores, {name}, {isa}"


def print_table(rows: list[dict]) -> None:
    print(
        "| model  | depth | engine    | kv          | tg t/s | vs llama.cpp f16 | vs q8_0 | pp t/s | vs f16 | peak RSS MiB |"
    )
    print("|--------|------:|-----------|-------------|-------:|-----:|-----:|-------:|------:|------:|")
    for r in rows:
        ref = llama_rows(rows, r)
        f16, q8 = ref.get("f16"), ref.get("q8_0")
        ratio = lambda key, x: f"{r[key] / x[key]:.2f}x" if x else ""  # noqa: E731
        print(
            f"| {r['model']:<6} | {r['depth']:>5} | {r['engine']:<9} | {r['kv']:<11} | {r['tg_tok_s']:6.2f} "
            f"| {ratio('tg_tok_s', f16):>5} | {ratio('tg_tok_s', q8):>5} | {r['pp_tok_s']:6.1f} "
            f"| {ratio('pp_tok_s', f16):>5} | {r['peak_rss'] / 2**20:6.0f} |"
        )
    for r in (r for r in rows if r["engine"] == "tightkv"):  # each round against llama.cpp's same round
        for kv, ref in llama_rows(rows, r).items():
            if len(r.get("tg_rounds", [])) == len(ref.get("tg_rounds", [])) > 1:
                each = [a / b for a, b in zip(r["tg_rounds"], ref["tg_rounds"])]
                print(
                    f"{r['model']} d{r['depth']} {r['kv']} / llama.cpp {kv}, round by round: "
                    f"{' '.join(f'{x:.2f}' for x in each)}, median {statistics.median(each):.2f}x"
                )


def llama_rows(rows: list[dict], r: dict) -> dict[str, dict]:
    """llama.cpp's rows of r's model and depth, by cache type."""
    return {
        x["kv"]: x for x in rows if x["model"] == r["model"] and x["depth"] == r["depth"] and x["engine"] == "llama.cpp"
    }


if __name__ == "__main__":
    main()
