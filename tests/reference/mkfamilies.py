"""Reference fixtures for the Qwen3-MoE and Qwen3.5 (dense and MoE) families: tests/data/families/.

For each GGUF architecture (`qwen3moe`, `qwen35`, `qwen35moe`) this builds a tiny random model in
transformers, converts it with llama.cpp's own converter to GGUF (f32 and q8_0), and records the
logits of both implementations on the same token ids, so that tightkv can be tested against two
independent references that are first shown to agree (tests/test_reference_families.py).

    python tests/reference/mkfamilies.py [--arch qwen35 ...] [--essays essays.txt] [--llama-cpp DIR]

What it writes, into tests/data/families/<arch>/:

- `hf/`: config.json, model.safetensors (float32), generation_config.json and the tokenizer
  (tokenizer.json, tokenizer_config.json with a ChatML chat template), loadable with
  `from_pretrained`;
- `<arch>-f32.gguf`, `<arch>-q8_0.gguf`: `convert_hf_to_gguf.py hf --outtype f32|q8_0 --no-mtp`;
- `reference.npz`: the prompt ids, llama.cpp's logits of every prompt position (one batched
  prefill) and of 8 greedy decode steps for each GGUF, its greedy continuation and top-2 margins,
  and transformers' logits on the same ids (float32, eager attention, one forward over the prompt
  and the continuation that llama.cpp chose for that GGUF);
- `reference.json`: the GGUF sha256s, the configuration, the versions used and the measured
  llama.cpp-vs-transformers differences.

Determinism: the weights are drawn from numpy (`default_rng([SEED, crc32(name)])`, one stream per
tensor name, whatever transformers' own init does), the tokenizer is trained by `tokenizers` on
the essays corpus (sha256 checked), the converter writes no dates; rerunning gives the same files
given the same library versions (llama.cpp's converter and runtime from the llama-cpp-python
0.3.36 sdist, whose `vendor/llama.cpp` is the `--llama-cpp` directory).

The tokenizer: a byte-level BPE of 512 tokens (the 256 GPT-2 byte symbols, 253 merges learned on
the essays, `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), with Qwen2's pre-tokenizer regex for
qwen3moe (`Qwen2Tokenizer`) and Qwen3.5's (which adds \\p{M}) for qwen35/qwen35moe
(`Qwen3_5Tokenizer`). llama.cpp's converter identifies the pre-tokenizer by hashing the token ids
of a fixed text and refuses hashes it does not know (which any new vocabulary has), so the
converter runs through a small wrapper that replaces `TextModel.get_vocab_base_pre` by one
returning the family's name (`qwen2` or `qwen35`, as the real checkpoints get): the network is
what these fixtures test, and any valid tokenizer of the family does.

Shapes (every matrix's input width a multiple of 32, so that all of them are Q8_0 in the q8_0
file): hidden 64, 4 query heads, 2 KV heads, head_dim 32, vocab 512, untied output.
- qwen3moe: 4 layers, 8 experts of width 32, top-2, norm_topk_prob, RoPE on all 32 dims.
- qwen35: 6 layers [linear, linear, full, linear, linear, full], FFN 96; full attention with the
  output gate (q_proj 2x) and RoPE on 8 of 32 dims (partial_rotary_factor 0.25, interleaved MRoPE
  sections [2, 1, 1] = 4 frequencies, as Qwen3.5's [11, 11, 10] for 64 rotated dims); Gated
  DeltaNet with 2 key heads and 4 value heads (so the converter's V-head reordering is used) of
  dim 16, conv kernel 4.
- qwen35moe: the same hybrid layout, 8 experts of width 32, top-2, and a shared expert of width
  64 with its sigmoid gate (64, not 48: its down projection's input width must be a multiple of
  32 to be Q8_0).
The prompt is 100 ids (the Gated DeltaNet chunk is 64) from tokenizing an essays paragraph.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "families"
ARCHS = ("qwen3moe", "qwen35", "qwen35moe")
SEED = 20260
ESSAYS_SHA256 = "b3a70ebc054f2eab5057baf3c4b7e857711472be8086240a516fd29b648ad857"
LLAMA_CPP = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
PROMPT_LEN = 100
DECODE_STEPS = 8
N_CTX = 512

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_MERGES = 253  # 256 byte symbols + 253 merges + 3 special tokens = 512
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN35_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

HYBRID = ["linear_attention", "linear_attention", "full_attention"] * 2
COMMON = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "dtype": "float32",
}
QWEN35_COMMON = {
    **COMMON,
    "num_hidden_layers": 6,
    "layer_types": HYBRID,
    "full_attention_interval": 3,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
CONFIGS = {
    "qwen3moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **COMMON,
        "num_hidden_layers": 4,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": False,
        "sliding_window": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "qwen35": {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **QWEN35_COMMON,
        "intermediate_size": 96,
    },
    "qwen35moe": {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        **QWEN35_COMMON,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
    },
}
PRE_TOKENIZER = {"qwen3moe": ("qwen2", QWEN2_REGEX, "Qwen2Tokenizer")}
PRE_TOKENIZER["qwen35"] = PRE_TOKENIZER["qwen35moe"] = ("qwen35", QWEN35_REGEX, "Qwen3_5Tokenizer")

# the logit scale: final norm output (rms ~1) times lm_head rows of norm ~LOGIT_GAIN
LOGIT_GAIN = 3.0
ROUTER_GAIN = 1.5
# the projections back into the residual stream (o_proj, out_proj, down_proj, experts' down) are
# scaled down: at gain 1 the random net amplifies perturbations so much that rounding the weights
# to Q8_0 alone (in transformers) moved the median position's largest logit error to 0.21 / 0.34
# / 1.21 (qwen3moe / qwen35 / qwen35moe; the logits' std is 3) and flipped many expert choices;
# at 0.3 it is 0.09 / 0.11 / 0.15, while removing one sublayer still moves the logits by
# 0.1-0.6 on average
OUT_GAIN = 0.3
OUT_PROJ = ("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")


# ---------------------------------------------------------------------------------------------
# tokenizer


def essays_text(path: Path) -> str:
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != ESSAYS_SHA256:
        raise SystemExit(f"{path} is not the essays corpus (sha256 {ESSAYS_SHA256})")
    return data.decode("utf-8")


def bpe_merges(text: str) -> tuple[dict[str, int], list]:
    """253 merges learned with Qwen2's pre-tokenizer: the vocabulary and merges both families use."""
    from tokenizers import pre_tokenizers, trainers

    tok = _tokenizer({}, [], QWEN2_REGEX)
    trainer = trainers.BpeTrainer(
        vocab_size=256 + N_MERGES,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([text], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    assert len(model["vocab"]) == 256 + N_MERGES and len(model["merges"]) == N_MERGES
    return model["vocab"], model["merges"]


def _tokenizer(vocab: dict, merges: list, regex: str):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab or None,
            merges=merges or None,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def write_tokenizer(hf: Path, arch: str, vocab: dict, merges: list):
    from tokenizers import AddedToken

    _, regex, cls = PRE_TOKENIZER[arch]
    tok = _tokenizer(vocab, merges, regex)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == 512 and [tok.token_to_id(s) for s in SPECIALS] == [509, 510, 511]
    tok.save(str(hf / "tokenizer.json"))
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for s in SPECIALS
        },
        "bos_token": None,
        "chat_template": CHATML,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": cls,
        "unk_token": None,
    }
    (hf / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


def prompt_ids(tok, text: str) -> list[int]:
    """The first PROMPT_LEN ids of the essays paragraph that starts with 'No one doubts'."""
    start = text.index("No one doubts this process is accelerating")
    ids = tok.encode(text[start : start + 2000]).ids
    assert len(ids) >= PROMPT_LEN
    return ids[:PROMPT_LEN]


# ---------------------------------------------------------------------------------------------
# weights


def tensor_values(arch: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The value of one parameter, from its own seeded stream (independent of the others' order)."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    qwen35 = arch.startswith("qwen35")
    if name.endswith("norm.weight"):
        # Qwen3.5's RMSNorm scales by (1 + w) (the converter adds 1), except the gated norm of
        # the linear attention; Qwen3-MoE's scale by w: the effective scale is 1 +- 0.1 either way
        if qwen35 and not name.endswith("linear_attn.norm.weight"):
            return 0.1 * rng.standard_normal(shape)
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if name.endswith("A_log"):  # decay rate A in [1, 16] per value head, as Qwen3-Next's init
        return np.log(rng.uniform(1.0, 16.0, shape))
    if name.endswith("dt_bias"):  # softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1] (Mamba's)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        return np.log(np.expm1(dt))
    if name.endswith("conv1d.weight"):  # PyTorch's depthwise conv init: U(+-1/sqrt(kernel))
        bound = 1.0 / np.sqrt(shape[-1])
        return rng.uniform(-bound, bound, shape)
    if name.endswith("embed_tokens.weight"):
        return rng.standard_normal(shape)
    if name.endswith("lm_head.weight"):
        return LOGIT_GAIN / np.sqrt(shape[-1]) * rng.standard_normal(shape)
    if name.endswith("mlp.gate.weight"):  # router
        return ROUTER_GAIN / np.sqrt(shape[-1]) * rng.standard_normal(shape)
    if name.endswith(OUT_PROJ):
        return OUT_GAIN * rng.standard_normal(shape) / np.sqrt(shape[-1])
    if len(shape) >= 2:  # every other projection, experts included: [..., out, in]
        return rng.standard_normal(shape) / np.sqrt(shape[-1])
    raise ValueError(f"no rule for {name} {shape}")


def model_class(arch: str):
    import transformers

    return getattr(transformers, CONFIGS[arch]["architectures"][0])


def build_hf(arch: str, hf: Path):
    import torch
    import transformers

    kwargs = {k: v for k, v in CONFIGS[arch].items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(
        CONFIGS[arch]["model_type"], vocab_size=512, bos_token_id=509, eos_token_id=511, pad_token_id=509, **kwargs
    )
    torch.manual_seed(0)
    model = model_class(arch)(config).to(torch.float32)
    state = {
        name: torch.from_numpy(tensor_values(arch, name, tuple(t.shape)).astype(np.float32))
        for name, t in model.state_dict().items()
    }
    model.load_state_dict(state, strict=True)
    model.save_pretrained(hf, safe_serialization=True)
    return model


def load_hf(hf: Path):
    import torch
    import transformers

    arch = json.loads((hf / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, arch).from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


# ---------------------------------------------------------------------------------------------
# llama.cpp

CONVERT = """
import runpy, sys
root, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre  # see mkfamilies.py's docstring
sys.argv = [root + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(llama_cpp: Path, arch: str, hf: Path, out: Path, outtype: str):
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
    cmd = [sys.executable, "-c", CONVERT, str(llama_cpp), PRE_TOKENIZER[arch][0], str(hf)]
    cmd += ["--outtype", outtype, "--outfile", str(out), "--model-name", f"tiny-{arch}"]
    if arch.startswith("qwen35"):  # no multi-token-prediction block in the tiny model
        cmd.append("--no-mtp")
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)


def llama_run(gguf: Path, ids: list[int]) -> dict[str, np.ndarray]:
    """Logits of a batched prefill of `ids`, then DECODE_STEPS greedy decode steps."""
    from llama_cpp import Llama

    m = Llama(
        model_path=str(gguf),
        n_ctx=N_CTX,
        n_threads=2,
        n_threads_batch=2,
        n_batch=N_CTX,  # the whole prompt in one batch (and one ubatch)
        n_ubatch=N_CTX,
        logits_all=True,
        seed=0,
        verbose=False,
    )  # flash attention and the f16 K/V cache: the wrapper's defaults
    m.reset()
    m.eval(ids)
    prompt = np.array(m.scores[: len(ids)], dtype=np.float32)
    rows = [prompt[-1]]
    greedy = [int(np.argmax(rows[-1]))]
    for _ in range(DECODE_STEPS):
        m.eval([greedy[-1]])
        rows.append(np.array(m.scores[m.n_tokens - 1], dtype=np.float32))
        greedy.append(int(np.argmax(rows[-1])))
    top2 = np.sort(np.stack(rows), axis=-1)[:, -2:]
    m.close()
    return {
        "prompt_logits": prompt,
        "decode_logits": np.stack(rows[1:]),
        "greedy": np.array(greedy, dtype=np.int64),
        "margins": (top2[:, 1] - top2[:, 0]).astype(np.float32),
    }


# ---------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rel_diff(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Max and mean abs difference, the max over the reference's logit std (the scale)."""
    d = np.abs(a - b)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "max_abs_over_std": float(d.max() / b.std()),
        "logit_std": float(b.std()),
    }


def make(arch: str, text: str, vocab: dict, merges: list, llama_cpp: Path):
    import llama_cpp as lcp
    import torch
    import transformers

    torch.set_num_threads(2)
    folder = OUT / arch
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    for stale in hf.iterdir():
        stale.unlink()
    tok = write_tokenizer(hf, arch, vocab, merges)
    build_hf(arch, hf)
    ids = prompt_ids(tok, text)

    ggufs = {t: folder / f"{arch}-{t}.gguf" for t in ("f32", "q8_0")}
    for outtype, path in ggufs.items():
        convert(llama_cpp, arch, hf, path, outtype)

    model = load_hf(hf)
    arrays: dict[str, np.ndarray] = {"prompt_ids": np.array(ids, dtype=np.int64)}
    diffs = {}
    for t, path in ggufs.items():
        run = llama_run(path, ids)
        for k, v in run.items():
            arrays[f"llama_{t}_{k}"] = v
        full = hf_logits(model, ids + run["greedy"][:DECODE_STEPS].tolist())
        if t == "f32":
            arrays["hf_prompt_logits"] = full[: len(ids)]
        else:
            assert np.allclose(full[: len(ids)], arrays["hf_prompt_logits"], atol=1e-5)
        arrays[f"hf_{t}_decode_logits"] = full[len(ids) :]
        diffs[t] = {
            "prompt": rel_diff(run["prompt_logits"], arrays["hf_prompt_logits"]),
            "decode": rel_diff(run["decode_logits"], arrays[f"hf_{t}_decode_logits"]),
        }
    np.savez_compressed(folder / "reference.npz", **arrays)
    p = torch.softmax(torch.from_numpy(arrays["hf_prompt_logits"]), -1)
    ref = {
        "arch": arch,
        "made_by": "tests/reference/mkfamilies.py",
        "hf_architecture": CONFIGS[arch]["architectures"][0],
        "config": {**CONFIGS[arch], "vocab_size": 512},
        "weights": {"seed": SEED, "logit_gain": LOGIT_GAIN, "router_gain": ROUTER_GAIN, "out_gain": OUT_GAIN},
        "gguf_sha256": {path.name: sha256(path) for path in ggufs.values()},
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "llama-cpp-python": lcp.__version__,
            "converter": "vendor/llama.cpp/convert_hf_to_gguf.py of the llama-cpp-python 0.3.36 sdist",
        },
        "llama_cpp_settings": {"n_ctx": N_CTX, "n_batch": N_CTX, "n_threads": 2, "flash_attn": False, "kv": "f16"},
        "pre_tokenizer": PRE_TOKENIZER[arch][0],
        "prompt_len": PROMPT_LEN,
        "decode_steps": DECODE_STEPS,
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
    ap.add_argument("--llama-cpp", type=Path, default=LLAMA_CPP, help="the sdist's vendor/llama.cpp")
    args = ap.parse_args()
    if args.essays is None:
        from tightkv.eval.corpus import essays_path

        args.essays = essays_path()
    text = essays_text(args.essays)
    vocab, merges = bpe_merges(text)
    for arch in args.arch or ARCHS:
        ref = make(arch, text, vocab, merges, args.llama_cpp)
        print(arch, json.dumps(ref["llama_vs_hf"]), ref["hf_top1_prob"], flush=True)


if __name__ == "__main__":
    main()
