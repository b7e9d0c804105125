"""Reference fixtures for the Qwen3-MoE, Qwen3.5, gpt-oss and Mistral 3 families: tests/data/families/.

For each GGUF architecture (`qwen3moe`, `qwen35`, `qwen35moe`, `gpt-oss`, `mistral3`) this builds a
tiny random model in transformers, converts it with llama.cpp's own converter to GGUF (f32 and
q8_0; gpt-oss: f32 and llama.cpp's MXFP4_MOE quantization of it), and records the
logits of both implementations on the same token ids, so that tightkv can be tested against two
independent references that are first shown to agree (tests/test_reference_families.py).

    python tests/reference/mkfamilies.py [--arch qwen35 ...] [--essays essays.txt] [--llama-cpp DIR]

What it writes, into tests/data/families/<arch>/:

- `hf/`: config.json, model.safetensors (float32), generation_config.json and the tokenizer
  (tokenizer.json, tokenizer_config.json with a ChatML chat template), loadable with
  `from_pretrained`;
- `<arch>-f32.gguf`, `<arch>-q8_0.gguf`: `convert_hf_to_gguf.py hf --outtype f32|q8_0 --no-mtp`;
  gpt-oss's `gpt-oss-mxfp4.gguf` instead of q8_0: `llama_cpp.llama_model_quantize` of the f32 file
  with LLAMA_FTYPE_MOSTLY_MXFP4_MOE (the real files' expert type; the converter writes MXFP4 only
  from MXFP4 checkpoints): experts MXFP4, the other matrices Q8_0 (the router stays F32);
- `reference.npz`: the prompt ids, llama.cpp's logits of every prompt position (one batched
  prefill) and of 8 greedy decode steps for each GGUF, its greedy continuation and top-2 margins,
  and transformers' logits on the same ids (float32, eager attention, one forward over the prompt
  and the continuation that llama.cpp chose for that GGUF);
  for gpt-oss also transformers' logits on the MXFP4 file's own weights (dequantized and mapped
  back: `hf_mxfp4_weights_*`), which leave only llama.cpp's activation rounding;
- `reference.json`: the GGUF sha256s, the configuration, the versions used and the measured
  llama.cpp-vs-transformers differences; for gpt-oss and mistral3 also the special token ids,
  each GGUF's metadata and tensors (ne, type), and how much each feature the fixture is meant to
  exercise moves transformers' logits (`sensitivity_hf_prompt_logits`).

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
- gpt-oss (GptOssForCausalLM): 4 layers [sliding, full, sliding, full] (llama.cpp hard-codes that
  pattern: the GGUF has no per-layer key), sliding window 16, 4 query / 2 KV heads of dim 64 (the
  real head_dim), q/k/v/o biases, one attention sink per query head drawn N(0, 1), 8 experts of
  width 64 top-2 with router bias and gate_up/down biases, clamped SwiGLU (alpha 1.702, limit 7,
  both also hard-coded in llama.cpp); the experts' pre-activations reach beyond +-7 for 1-3% of
  units. YaRN as the real config (theta 150000, factor 32, beta_fast 32, beta_slow 1) but with
  original context 256 instead of 4096 (context_length 32 x 256): the ramp then spans pair
  dimensions 0-10 and everything above is interpolated, frequencies that turn by radians within
  100 tokens, where with 4096 YaRN only touches dimensions 8-18 and up. `truncate` is true, not
  the real config's false: llama.cpp always rounds the correction range to whole dimensions
  (floor / ceil, ggml_rope_yarn_corr_dims; the GGUF has no key for it), so transformers agrees
  with llama.cpp only with truncate true; with false its logits move by 0.18 on average, 3.6 at
  most (reference.json's sensitivity). Tokenizer: o200k's split regex, llama.cpp's `gpt-4o`
  pre-tokenizer, 247 merges and the 9 harmony specials (<|startoftext|> ... <|call|>, ids
  503-511 in the real ids' order), llama.cpp's models/templates/openai-gpt-oss-120b.jinja as the
  chat template.
- mistral3 (Ministral3ForCausalLM, GGUF arch `mistral3`): 4 layers, 4 / 2 heads of dim 32, FFN 96;
  YaRN theta 1e6, factor 16, original context 32 (context 512), beta 32 / 1, mscale and
  mscale_all_dim 1 (as the real ones: the YaRN attention factor is 1; llama.cpp reads
  mscale_all_dim as rope.scaling.yarn_log_multiplier and assumes mscale 1), and the Llama-4
  attention temperature: q times 1 + 0.1 log(1 + floor(pos / 32)) (llama_4_scaling_beta 0.1 ->
  mistral3.attention.temperature_scale; llama.cpp's floor scale is the YaRN original context), so
  the prompt crosses 3 steps. Tokenizer: Tekken's split regex, llama.cpp's `tekken`
  pre-tokenizer (ignore_merges, add BOS), 239 merges and Ministral 3's 17 control tokens
  (ids 495-511), the prompt starting with <s>; models/templates/
  mistralai-Ministral-3-14B-Reasoning-2512.jinja as the chat template.
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
ARCHS = ("qwen3moe", "qwen35", "qwen35moe", "gpt-oss", "mistral3")
SEED = 20260
ESSAYS_SHA256 = "b3a70ebc054f2eab5057baf3c4b7e857711472be8086240a516fd29b648ad857"
LLAMA_CPP = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
VOCAB = 512
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

# gpt-oss: o200k_harmony's split regex (its tokenizer.json's), llama.cpp's `gpt-4o` pre-tokenizer;
# the harmony specials in the real ids' order (199998, 199999, 200002, 200003, 200005-200008, 200012)
GPT4O_REGEX = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
HARMONY = (
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
)
# mistral3: Tekken's split regex, llama.cpp's `tekken` pre-tokenizer (which ignores merges for
# whole-word vocabulary hits, so the tokenizer here sets ignore_merges too); the control tokens
# that Ministral 3's chat template uses
TEKKEN_REGEX = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
MISTRAL_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[THINK]",
    "[/THINK]",
)
PRE_TOKENIZER["gpt-oss"] = ("gpt-4o", GPT4O_REGEX, "PreTrainedTokenizerFast")
PRE_TOKENIZER["mistral3"] = ("tekken", TEKKEN_REGEX, "PreTrainedTokenizerFast")
# per family: special tokens (the last ids of the 512), chat template (a string, or the name of
# one of llama.cpp's models/templates/), bos / eos / pad, add_bos_token, BPE ignore_merges
TOKENIZER = {
    arch: {"specials": SPECIALS, "template": CHATML, "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}
    for arch in ("qwen3moe", "qwen35", "qwen35moe")
}
TOKENIZER["gpt-oss"] = {
    "specials": HARMONY,
    "template": "openai-gpt-oss-120b.jinja",
    "bos": "<|startoftext|>",
    "eos": "<|return|>",
    "pad": "<|endoftext|>",
}
TOKENIZER["mistral3"] = {
    "specials": MISTRAL_SPECIALS,
    "template": "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "bos": "<s>",
    "eos": "</s>",
    "pad": "<pad>",
    "unk": "<unk>",
    "add_bos": True,
    "ignore_merges": True,
}


def special_ids(arch: str) -> dict[str, int]:
    specials = TOKENIZER[arch]["specials"]
    return {s: VOCAB - len(specials) + i for i, s in enumerate(specials)}


# gpt-oss, see the docstring: YaRN's original context 256 (not 4096) so that its ramp and its
# interpolated band cover frequencies that turn by radians within the prompt
GPT_OSS_ORIG_CTX = 256
CONFIGS["gpt-oss"] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 64,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "sliding_window": 16,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 32 * GPT_OSS_ORIG_CTX,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "dtype": "float32",
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": GPT_OSS_ORIG_CTX,
        # the real config says false; llama.cpp always rounds the correction range (see the docstring)
        "truncate": True,
    },
}
MISTRAL3_ORIG_CTX = 32
CONFIGS["mistral3"] = {
    "architectures": ["Ministral3ForCausalLM"],
    "model_type": "ministral3",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 96,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 16 * MISTRAL3_ORIG_CTX,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "sliding_window": None,
    "dtype": "float32",
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 16.0,
        "original_max_position_embeddings": MISTRAL3_ORIG_CTX,
        "max_position_embeddings": 16 * MISTRAL3_ORIG_CTX,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
}
# the GGUFs: the converter's --outtype, or (mxfp4) llama.cpp's quantizer on the f32 file with
# LLAMA_FTYPE_MOSTLY_MXFP4_MOE: experts MXFP4, every other matrix Q8_0
GGUF_TYPES = {arch: ("f32", "q8_0") for arch in ARCHS}
GGUF_TYPES["gpt-oss"] = ("f32", "mxfp4")

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
# gpt-oss's experts: gate_up's weights at GATE_UP_GAIN / sqrt(64) and its biases N(0, 1) put the
# gate and up pre-activations at std ~3.2, so that the clamp at +-7 (swiglu_limit) cuts 1-3%
# of them (reference.json's "clamp" records how many); down's at DOWN_GAIN / sqrt(64),
# smaller than OUT_GAIN, as the clamped SwiGLU's outputs reach tens
GATE_UP_GAIN = 3.0
DOWN_GAIN = 0.06


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


def _tokenizer(vocab: dict, merges: list, regex: str, ignore_merges: bool = False):
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
            ignore_merges=ignore_merges,
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


def chat_template(arch: str, llama_cpp: Path) -> str:
    template = TOKENIZER[arch]["template"]
    return (llama_cpp / "models" / "templates" / template).read_text() if template.endswith(".jinja") else template


def write_tokenizer(hf: Path, arch: str, vocab: dict, merges: list, llama_cpp: Path = LLAMA_CPP):
    """The byte-level BPE: the first 512 - len(specials) - 256 learned merges (merge k made token
    256 + k, so a prefix of them is a valid BPE), then the family's special tokens."""
    from tokenizers import AddedToken

    spec = TOKENIZER[arch]
    specials = spec["specials"]
    n_merges = VOCAB - 256 - len(specials)
    vocab = {t: i for t, i in vocab.items() if i < 256 + n_merges}
    _, regex, cls = PRE_TOKENIZER[arch]
    tok = _tokenizer(vocab, merges[:n_merges], regex, spec.get("ignore_merges", False))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    ids = special_ids(arch)
    assert tok.get_vocab_size() == VOCAB and all(tok.token_to_id(s) == i for s, i in ids.items())
    if spec.get("add_bos"):  # the BOS that llama.cpp adds (tokenizer.ggml.add_bos_token), added here too
        from tokenizers import processors

        bos = (spec["bos"], ids[spec["bos"]])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos]
        )
    tok.save(str(hf / "tokenizer.json"))
    config = {
        "add_bos_token": spec.get("add_bos", False),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[s]): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for s in specials
        },
        "bos_token": spec["bos"],
        "chat_template": chat_template(arch, llama_cpp),
        "clean_up_tokenization_spaces": False,
        "eos_token": spec["eos"],
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": spec["pad"],
        "split_special_tokens": False,
        "tokenizer_class": cls,
        "unk_token": spec.get("unk"),
    }
    (hf / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


def prompt_ids(tok, text: str) -> list[int]:
    """The first PROMPT_LEN ids of the essays paragraph that starts with 'No one doubts' (after
    the BOS where the family's tokenizer adds one: mistral3)."""
    start = text.index("No one doubts this process is accelerating")
    ids = tok.encode(text[start : start + 2000]).ids
    assert len(ids) >= PROMPT_LEN
    return ids[:PROMPT_LEN]


# ---------------------------------------------------------------------------------------------
# weights


def tensor_values(arch: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The value of one parameter, from its own seeded stream (independent of the others' order)."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    if arch == "gpt-oss":
        return gpt_oss_values(rng, name, shape)
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


def gpt_oss_values(rng, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """gpt-oss: biases on q/k/v/o, the router and the experts; nonzero sinks; experts stored
    [expert, in, out] (transformers' GptOssExperts), so their fan-in is shape[-2]."""
    normal = rng.standard_normal(shape)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * normal
    if name.endswith("self_attn.sinks"):  # one logit per query head, N(0, 1)
        return normal
    if name.endswith("embed_tokens.weight"):
        return normal
    if name.endswith("lm_head.weight"):
        return LOGIT_GAIN / np.sqrt(shape[-1]) * normal
    if name.endswith("router.weight"):
        return ROUTER_GAIN / np.sqrt(shape[-1]) * normal
    if name.endswith("router.bias"):
        return 0.5 * normal
    if name.endswith("experts.gate_up_proj"):
        return GATE_UP_GAIN / np.sqrt(shape[-2]) * normal
    if name.endswith("experts.gate_up_proj_bias"):
        return normal
    if name.endswith("experts.down_proj"):
        return DOWN_GAIN / np.sqrt(shape[-2]) * normal
    if name.endswith(("experts.down_proj_bias", "o_proj.bias")):
        return 0.1 * normal
    if name.endswith("o_proj.weight"):
        return OUT_GAIN / np.sqrt(shape[-1]) * normal
    if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
        return 0.3 * normal
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return normal / np.sqrt(shape[-1])
    raise ValueError(f"no rule for {name} {shape}")


def model_class(arch: str):
    import transformers

    return getattr(transformers, CONFIGS[arch]["architectures"][0])


def build_hf(arch: str, hf: Path):
    import torch
    import transformers

    kwargs = {k: v for k, v in CONFIGS[arch].items() if k != "model_type"}
    ids, spec = special_ids(arch), TOKENIZER[arch]
    if arch in ("gpt-oss", "mistral3"):
        tokens = {"bos_token_id": ids[spec["bos"]], "eos_token_id": ids[spec["eos"]], "pad_token_id": ids[spec["pad"]]}
    else:  # as these fixtures were first made
        tokens = {"bos_token_id": 509, "eos_token_id": 511, "pad_token_id": 509}
    config = transformers.AutoConfig.for_model(CONFIGS[arch]["model_type"], vocab_size=VOCAB, **tokens, **kwargs)
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


QUANTIZE = """
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, sys.argv[3])
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""


def quantize(src: Path, dst: Path, ftype: str = "LLAMA_FTYPE_MOSTLY_MXFP4_MOE"):
    """llama.cpp's own quantizer (llama-cpp-python), as tests/requantized.py runs it."""
    cmd = [sys.executable, "-c", QUANTIZE, str(src), str(dst), ftype]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_gguf(llama_cpp: Path, arch: str, hf: Path, folder: Path, t: str) -> Path:
    path = folder / f"{arch}-{t}.gguf"
    if t == "mxfp4":
        quantize(folder / f"{arch}-f32.gguf", path)
    else:
        convert(llama_cpp, arch, hf, path, t)
    return path


def gguf_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF dequantized to float32, numpy shape = reversed ggml ne."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    out = {}
    for t in GGUFReader(path).tensors:
        shape = [int(n) for n in reversed(t.shape.tolist())]
        out[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return out


def gpt_oss_state_from_gguf(path: Path) -> dict[str, np.ndarray]:
    """A gpt-oss GGUF's weights (dequantized) under transformers' names and layouts: undoes the
    converter's split of gate_up_proj (gate = its even output columns, up = the odd ones) and its
    transposes of the experts ([expert, in, out] in transformers, ggml ne {in, out, expert})."""
    g = gguf_tensors(path)
    out = {
        "model.embed_tokens.weight": g["token_embd.weight"],
        "model.norm.weight": g["output_norm.weight"],
        "lm_head.weight": g["output.weight"],
    }
    n_layer = 1 + max(int(k.split(".")[1]) for k in g if k.startswith("blk."))
    for i in range(n_layer):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = g[b + "attn_norm.weight"]
        out[h + "post_attention_layernorm.weight"] = g[b + "post_attention_norm.weight"]
        for x, y in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
            out[h + f"self_attn.{x}_proj.weight"] = g[b + y + ".weight"]
            out[h + f"self_attn.{x}_proj.bias"] = g[b + y + ".bias"]
        out[h + "self_attn.sinks"] = g[b + "attn_sinks.weight"]
        out[h + "mlp.router.weight"] = g[b + "ffn_gate_inp.weight"]
        out[h + "mlp.router.bias"] = g[b + "ffn_gate_inp.bias"]
        gate, up = g[b + "ffn_gate_exps.weight"], g[b + "ffn_up_exps.weight"]  # [expert, out, in]
        gate_up = np.empty((gate.shape[0], gate.shape[2], 2 * gate.shape[1]), np.float32)
        gate_up[..., 0::2], gate_up[..., 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        gate_up_bias = np.empty((gate.shape[0], 2 * gate.shape[1]), np.float32)
        gate_up_bias[:, 0::2], gate_up_bias[:, 1::2] = g[b + "ffn_gate_exps.bias"], g[b + "ffn_up_exps.bias"]
        out[h + "mlp.experts.gate_up_proj"], out[h + "mlp.experts.gate_up_proj_bias"] = gate_up, gate_up_bias
        out[h + "mlp.experts.down_proj"] = g[b + "ffn_down_exps.weight"].transpose(0, 2, 1)
        out[h + "mlp.experts.down_proj_bias"] = g[b + "ffn_down_exps.bias"]
    return out


def with_state(model, state: dict[str, np.ndarray]):
    import torch

    model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}, strict=True)
    return model


def variant_logits(hf: Path, ids: list[int], config_changes: dict | None = None, state_changes: dict | None = None):
    """transformers' prompt logits with the config or some weights changed: how much a feature
    (sinks, the clamp, YaRN, the temperature) moves the logits."""
    import torch
    import transformers

    base = load_hf(hf)
    config = transformers.AutoConfig.from_pretrained(hf)
    for k, v in (config_changes or {}).items():
        setattr(config, k, v)
    config._attn_implementation = "eager"
    model = type(base)(config).to(torch.float32).eval()
    state = {k: v.numpy() for k, v in base.state_dict().items()}
    for k, fn in (state_changes or {}).items():
        for name, value in list(state.items()):
            if name.endswith(k):
                state[name] = fn(value)
    return hf_logits(with_state(model, state), ids)


def sensitivity(arch: str, hf: Path, ids: list[int], ref: np.ndarray) -> dict[str, dict[str, float]]:
    rope = CONFIGS[arch]["rope_parameters"]
    plain = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    if arch == "mistral3":  # its attention reads the temperature's two keys from rope_parameters
        plain |= {k: rope[k] for k in ("llama_4_scaling_beta", "original_max_position_embeddings")}
    cases = {"yarn_replaced_by_plain_rope": ({"rope_parameters": plain}, None)}
    if arch == "gpt-oss":
        cases["no_sinks"] = (None, {"self_attn.sinks": lambda s: np.full_like(s, -np.inf)})
        cases["no_swiglu_clamp"] = ({"swiglu_limit": 1e9}, None)
        cases["no_sliding_window"] = ({"layer_types": ["full_attention"] * 4}, None)
        cases["yarn_truncate_false_as_real_config"] = ({"rope_parameters": {**rope, "truncate": False}}, None)
    if arch == "mistral3":
        cases["no_attention_temperature"] = ({"rope_parameters": {**rope, "llama_4_scaling_beta": 0.0}}, None)
    out = {}
    for name, (cfg, st) in cases.items():
        d = np.abs(variant_logits(hf, ids, cfg, st) - ref)
        out[name] = {"max_abs": float(d.max()), "mean_abs": float(d.mean())}
    return out


def gguf_description(path: Path) -> dict:
    """The GGUF's metadata (arrays of more than 16 values summarised) and tensors (ne, type)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        if len(f.types) and f.types[0].name == "ARRAY":
            meta[f.name] = f"[{len(f.data)} x {f.types[-1].name}]"
            if len(f.data) <= 16:
                meta[f.name] = [f.contents(i) for i in range(len(f.data))]
        else:
            v = f.contents()
            meta[f.name] = v if not isinstance(v, str) or len(v) < 200 else f"<{len(v)} chars>"
    tensors = {t.name: [[int(n) for n in t.shape.tolist()], t.tensor_type.name] for t in r.tensors}
    return {"metadata": meta, "tensors": tensors}


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
    tok = write_tokenizer(hf, arch, vocab, merges, llama_cpp)
    build_hf(arch, hf)
    ids = prompt_ids(tok, text)

    types = GGUF_TYPES[arch]
    ggufs = {t: make_gguf(llama_cpp, arch, hf, folder, t) for t in types}

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
        if t == "mxfp4":
            # transformers on the very weights of the MXFP4 file (experts MXFP4, the other
            # matrices Q8_0, dequantized): what is left is llama.cpp's rounding of activations
            dq = with_state(load_hf(hf), gpt_oss_state_from_gguf(path))
            full = hf_logits(dq, ids + run["greedy"][:DECODE_STEPS].tolist())
            arrays["hf_mxfp4_weights_prompt_logits"] = full[: len(ids)]
            arrays["hf_mxfp4_weights_decode_logits"] = full[len(ids) :]
            diffs["mxfp4_vs_hf_on_its_weights"] = {
                "prompt": rel_diff(run["prompt_logits"], full[: len(ids)]),
                "decode": rel_diff(run["decode_logits"], full[len(ids) :]),
            }
    if arch == "gpt-oss":  # the GGUF -> transformers mapping, checked on the f32 file: exact
        state = gpt_oss_state_from_gguf(ggufs["f32"])
        assert all(np.array_equal(state[k], v.numpy()) for k, v in model.state_dict().items())
    np.savez_compressed(folder / "reference.npz", **arrays)
    p = torch.softmax(torch.from_numpy(arrays["hf_prompt_logits"]), -1)
    ref = {
        "arch": arch,
        "made_by": "tests/reference/mkfamilies.py",
        "hf_architecture": CONFIGS[arch]["architectures"][0],
        "config": {**CONFIGS[arch], "vocab_size": VOCAB},
        "weights": {"seed": SEED, "logit_gain": LOGIT_GAIN, "router_gain": ROUTER_GAIN, "out_gain": OUT_GAIN},
        "gguf_types": list(types),
        "gguf_sha256": {path.name: sha256(path) for path in ggufs.values()},
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "llama-cpp-python": lcp.__version__,
            "converter": "vendor/llama.cpp/convert_hf_to_gguf.py of the llama-cpp-python 0.3.36 sdist",
        },
        "llama_cpp_settings": {"n_ctx": N_CTX, "n_batch": N_CTX, "n_threads": 2, "flash_attn": False, "kv": "f16"},
        "pre_tokenizer": PRE_TOKENIZER[arch][0],
        "special_token_ids": special_ids(arch),
        "prompt_len": PROMPT_LEN,
        "decode_steps": DECODE_STEPS,
        "hf_top1_prob": {"mean": float(p.max(-1).values.mean()), "min": float(p.max(-1).values.min())},
        "llama_vs_hf": diffs,
        "greedy": {t: arrays[f"llama_{t}_greedy"].tolist() for t in ggufs},
    }
    if arch in ("gpt-oss", "mistral3"):
        if arch == "gpt-oss":
            ref["weights"] |= {"gate_up_gain": GATE_UP_GAIN, "down_gain": DOWN_GAIN}
            ref["clamp"] = clamp_fractions(model, ids)
        ref["sensitivity_hf_prompt_logits"] = sensitivity(arch, hf, ids, arrays["hf_prompt_logits"])
        ref["gguf"] = {path.name: gguf_description(path) for path in ggufs.values()}
    (folder / "reference.json").write_text(json.dumps(ref, indent=2) + "\n")
    return ref


def clamp_fractions(model, ids: list[int]) -> dict[str, float]:
    """The share of routed experts' gate (> limit) and up (|.| > limit) pre-activations that
    gpt-oss's clamp cuts on the prompt."""
    experts = [layer.mlp.experts for layer in model.model.layers]
    seen = {"gate": [], "up": []}

    originals = {}
    for e in experts:
        originals[e] = e._apply_gate

        def apply(gate_up, e=e):
            seen["gate"].append((gate_up[..., ::2] > e.limit).float().mean().item())
            seen["up"].append((gate_up[..., 1::2].abs() > e.limit).float().mean().item())
            return originals[e](gate_up)

        e._apply_gate = apply
    try:
        hf_logits(model, ids)
    finally:
        for e in experts:
            del e._apply_gate
    return {"gate_above_limit": float(np.mean(seen["gate"])), "up_beyond_limit": float(np.mean(seen["up"]))}


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
