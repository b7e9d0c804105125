"""Reference fixtures for the Gemma 4 family (GGUF `gemma4`): tests/data/families/gemma4*/.

As `mkfamilies.py` does for the Qwen families (whose helpers it imports): a tiny random model
in transformers, converted by llama.cpp's own converter to GGUF (f32 and q8_0), and the logits
of both implementations on the same ids.

    python tests/reference/mkgemma4.py [--arch gemma4 ...] [--essays essays.txt] [--llama-cpp DIR]

Two variants:
- `gemma4` (E2B/E4B-like): 7 layers [s, f, s, s, f, s, f] (s: sliding window 32, head dim 32,
  2 KV heads, RoPE base 1e4 on all dims; f: global, head dim 64, RoPE base 1e6 on a quarter of
  the dims, "proportional"), the last 2 layers sharing the KV of layers 3 (s) and 4 (f), the
  per-layer token embeddings (32 per layer), the double-wide MLP of the shared layers, a final
  logit soft-cap of 10 and a random per-layer output scale.
- `gemma4moe` (26B-A4B-like): 5 layers [s, f, s, s, f], every layer a mixture of 8 experts of
  width 32, top-2, beside the dense MLP (width 64); the global layers' V is their K
  (`attention_k_eq_v`) with 1 KV head, the sliding ones 2.

The tokenizer is Gemma's kind (llama.cpp's `gemma4` tokenizer model: a BPE over '▁'-joined
text with byte fallback), 512 tokens learned on the essays; the converter's pre-tokenizer hash
check is bypassed as in mkfamilies.py. The prompt is 100 ids (past the 32-token window).
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mkfamilies as mk

ARCHS = ("gemma4", "gemma4moe")
SEED = 20261
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
LAYERS = {"gemma4": ["s", "f", "s", "s", "f", "s", "f"], "gemma4moe": ["s", "f", "s", "s", "f"]}
TYPES = {"s": "sliding_attention", "f": "full_attention"}
COMMON = {
    "architectures": ["Gemma4ForCausalLM"],
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "global_head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 32,
    "final_logit_softcapping": 10.0,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "dtype": "float32",
}
CONFIGS = {
    "gemma4": {
        **COMMON,
        "num_hidden_layers": 7,
        "layer_types": [TYPES[t] for t in LAYERS["gemma4"]],
        "intermediate_size": 96,
        "use_double_wide_mlp": True,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 32,
        "vocab_size_per_layer_input": 512,
        "attention_k_eq_v": False,
    },
    "gemma4moe": {
        **COMMON,
        "num_hidden_layers": 5,
        "layer_types": [TYPES[t] for t in LAYERS["gemma4moe"]],
        "intermediate_size": 64,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "enable_moe_block": True,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
}
EMBED_STD = 0.375  # x = embedding * sqrt(64): rms 3; tied output: logits of std ~3
# the norms after each sublayer (the size of what it adds to the stream): at 1 the input token's
# own embedding dominates the final hidden state, and with the output tied to the embedding every
# greedy continuation repeated one token
POST_GAIN = 2.5
# the q and k norms' weights: attention's scale is 1, so at 1 a score's std is sqrt(head dim) and
# every softmax nearly one-hot; a rounding then flips which token a head reads (the q8_0 file's
# logits moved by 0.3 on average against the f32 file's)
QK_GAIN = 0.45
# the router reads the stream RMS-normed and divided by sqrt(hidden): mkfamilies' gain times
# sqrt(hidden) gives the same spread of router logits (std 1.5); at 1.5 the routing was nearly flat
# and flipped on a rounding
ROUTER_GAIN = mk.ROUTER_GAIN * 8
OUT_PROJ = (*mk.OUT_PROJ, "per_layer_projection.weight")


def tensor_values(name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return QK_GAIN + 0.05 * rng.standard_normal(shape)
    if ".post_" in name and name.endswith(("norm.weight", "layernorm_1.weight", "layernorm_2.weight")):
        return POST_GAIN + 0.1 * rng.standard_normal(shape)
    if name.endswith(("norm.weight", "layernorm_2.weight", "router.scale")):
        return 1.0 + 0.1 * rng.standard_normal(shape)  # Gemma 4 scales by w (no +1)
    if name.endswith("layer_scalar"):
        return rng.uniform(0.6, 1.2, shape)
    if name.endswith("per_expert_scale"):
        return rng.uniform(0.5, 1.5, shape)
    if name.endswith("embed_tokens.weight"):
        return EMBED_STD * rng.standard_normal(shape)
    if name.endswith("embed_tokens_per_layer.weight"):
        return 0.3 * rng.standard_normal(shape)
    if name.endswith("router.proj.weight"):
        return ROUTER_GAIN / np.sqrt(shape[-1]) * rng.standard_normal(shape)
    if name.endswith(OUT_PROJ):
        return mk.OUT_GAIN * rng.standard_normal(shape) / np.sqrt(shape[-1])
    if len(shape) >= 2:
        return rng.standard_normal(shape) / np.sqrt(shape[-1])
    raise ValueError(f"no rule for {name} {shape}")


def write_tokenizer(hf: Path, text: str):
    """Gemma's kind of tokenizer.json: '▁' for spaces, BPE with byte fallback, 512 tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    norm = normalizers.Replace(" ", "\u2581")
    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    learner.normalizer = norm
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=[], max_token_length=8)
    learner.train_from_iterator([line for line in text.splitlines() if line.strip()], trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({f"<0x{b:02X}>": 4 + b for b in range(256)})
    for tok, _ in sorted(learned["vocab"].items(), key=lambda x: x[1]):
        if len(vocab) < 512 and tok not in vocab:
            vocab[tok] = len(vocab)
    merges = [m if isinstance(m, list) else m.split(" ") for m in learned["merges"]]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges], byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = norm
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == 512
    tok.save(str(hf / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    }
    (hf / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


def build_hf(arch: str, hf: Path):
    import torch
    import transformers

    kwargs = {k: v for k, v in CONFIGS[arch].items() if k != "architectures"}
    config = transformers.Gemma4TextConfig(vocab_size=512, bos_token_id=2, eos_token_id=1, pad_token_id=0, **kwargs)
    config.architectures = CONFIGS[arch]["architectures"]
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(config).to(torch.float32)
    state = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embedding
            continue
        state[name] = torch.from_numpy(tensor_values(name, tuple(t.shape)).astype(np.float32))
    model.load_state_dict(state, strict=False)
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    model.save_pretrained(hf, safe_serialization=True)
    return model


CONVERT = mk.CONVERT


def convert(llama_cpp: Path, arch: str, hf: Path, out: Path, outtype: str):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
    cmd = [sys.executable, "-c", CONVERT, str(llama_cpp), "gemma4", str(hf)]
    cmd += ["--outtype", outtype, "--outfile", str(out), "--model-name", f"tiny-{arch}"]
    subprocess.run(cmd, check=True, env=env, cwd=mk.ROOT, stdout=subprocess.DEVNULL)


def prompt_ids(tok, text: str) -> list[int]:
    start = text.index("No one doubts this process is accelerating")
    ids = tok.encode(text[start : start + 2000]).ids
    return [2] + ids[: mk.PROMPT_LEN - 1]  # <bos> first, as Gemma's


def make(arch: str, text: str, llama_cpp: Path):
    import llama_cpp as lcp
    import torch
    import transformers

    torch.set_num_threads(2)
    folder = mk.OUT / arch
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    for stale in hf.iterdir():
        stale.unlink()
    tok = write_tokenizer(hf, text)
    build_hf(arch, hf)
    ids = prompt_ids(tok, text)
    ggufs = {t: folder / f"{arch}-{t}.gguf" for t in ("f32", "q8_0")}
    for outtype, path in ggufs.items():
        convert(llama_cpp, arch, hf, path, outtype)
    model = mk.load_hf(hf)
    arrays: dict[str, np.ndarray] = {"prompt_ids": np.array(ids, dtype=np.int64)}
    diffs = {}
    for t, path in ggufs.items():
        run = mk.llama_run(path, ids)
        for k, v in run.items():
            arrays[f"llama_{t}_{k}"] = v
        full = mk.hf_logits(model, ids + run["greedy"][: mk.DECODE_STEPS].tolist())
        if t == "f32":
            arrays["hf_prompt_logits"] = full[: len(ids)]
        arrays[f"hf_{t}_decode_logits"] = full[len(ids) :]
        diffs[t] = {
            "prompt": mk.rel_diff(run["prompt_logits"], arrays["hf_prompt_logits"]),
            "decode": mk.rel_diff(run["decode_logits"], arrays[f"hf_{t}_decode_logits"]),
        }
    np.savez_compressed(folder / "reference.npz", **arrays)
    p = torch.softmax(torch.from_numpy(arrays["hf_prompt_logits"]), -1)
    ref = {
        "arch": "gemma4",
        "variant": arch,
        "made_by": "tests/reference/mkgemma4.py",
        "hf_architecture": "Gemma4ForCausalLM",
        "config": {**CONFIGS[arch], "vocab_size": 512},
        "weights": {
            "seed": SEED,
            "embed_std": EMBED_STD,
            "post_gain": POST_GAIN,
            "qk_gain": QK_GAIN,
            "router_gain": ROUTER_GAIN,
            "out_gain": mk.OUT_GAIN,
        },
        "gguf_sha256": {path.name: mk.sha256(path) for path in ggufs.values()},
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "llama-cpp-python": lcp.__version__,
            "converter": "vendor/llama.cpp/convert_hf_to_gguf.py of the llama-cpp-python 0.3.36 sdist",
        },
        "llama_cpp_settings": {"n_ctx": mk.N_CTX, "n_batch": mk.N_CTX, "n_threads": 2, "kv": "f16"},
        "prompt_len": mk.PROMPT_LEN,
        "decode_steps": mk.DECODE_STEPS,
        "hf_top1_prob": {"mean": float(p.max(-1).values.mean()), "min": float(p.max(-1).values.min())},
        "llama_vs_hf": diffs,
        "greedy": {t: arrays[f"llama_{t}_greedy"].tolist() for t in ggufs},
    }
    (folder / "reference.json").write_text(json.dumps(ref, indent=2) + "\n")
    return ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", choices=ARCHS)
    default = Path("/work/shared/data/essays.txt")
    ap.add_argument("--essays", type=Path, default=default if default.is_file() else None)
    ap.add_argument("--llama-cpp", type=Path, default=mk.LLAMA_CPP, help="the sdist's vendor/llama.cpp")
    args = ap.parse_args()
    if args.essays is None:
        from tightkv.eval.corpus import essays_path

        args.essays = essays_path()
    text = mk.essays_text(args.essays)
    for arch in args.arch or ARCHS:
        ref = make(arch, text, args.llama_cpp)
        print(arch, json.dumps(ref["llama_vs_hf"]), ref["hf_top1_prob"], flush=True)


if __name__ == "__main__":
    main()
