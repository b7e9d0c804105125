"""Tiny random-weight GGUF models for tests, written with gguf-py's `GGUFWriter`.

`write_gguf` is generic (architecture name, metadata, tensors, vocabulary);
`write_gemma3` builds on it. Weights are random but seeded, in llama.cpp's
tensor names and layouts, so the same file can be loaded by tightkv and, as an
independent reference, by transformers' GGUF loader.

    path = write_gemma3(tmp_path / "g3.gguf", qtype="Q8_0")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gq

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


@dataclass
class Vocab:
    """A SentencePiece-style ('llama') vocabulary as GGUF stores it."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    special_ids: dict[str, int] = field(default_factory=dict)  # "bos" -> id, "eos", "unk", "padding"
    model: str = "llama"
    add_bos: bool = True
    add_eos: bool = False
    add_space_prefix: bool = False
    chat_template: str | None = None
    merges: list[str] | None = None  # GPT-2 BPE ('gpt2' model): "left right", by rank
    pre: str = "default"  # tokenizer.ggml.pre

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, text: str) -> int:
        return self.tokens.index(text)


def spm_vocab(
    size: int = 300,
    specials: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>"),
    control: tuple[str, ...] = ("<start_of_turn>", "<end_of_turn>"),
    **kwargs: Any,
) -> Vocab:
    """A minimal valid SPM vocab of `size` entries, Gemma's layout by default.

    specials are (pad, eos, bos, unk) in that order and are control tokens (unk is
    UNKNOWN); then the extra control tokens, the 256 byte-fallback tokens
    <0x00>..<0xFF>, then normal pieces ('▁', letters, '▁'+letter, letter pairs)
    with decreasing scores until the vocab has `size` entries.
    """
    pad, eos, bos, unk = specials
    tokens = list(specials) + list(control) + [f"<0x{b:02X}>" for b in range(256)]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [CONTROL] * len(control) + [BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [SPACE] + list(letters) + [SPACE + c for c in letters] + [a + b for a in letters for b in letters]
    n_normal = size - len(tokens)
    if n_normal < 0 or n_normal > len(pieces):
        raise ValueError(f"vocab size {size} must be between {len(tokens)} and {len(tokens) + len(pieces)}")
    tokens += pieces[:n_normal]
    types += [NORMAL] * n_normal
    scores = [0.0] * (size - n_normal) + [-float(i) for i in range(n_normal)]
    ids = {"padding": tokens.index(pad), "eos": tokens.index(eos), "bos": tokens.index(bos), "unk": tokens.index(unk)}
    return Vocab(tokens, scores, types, ids, **kwargs)


def _add_value(w: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, (int, np.integer)):
        w.add_uint32(key, int(value)) if value >= 0 else w.add_int32(key, int(value))
    elif isinstance(value, (float, np.floating)):
        w.add_float32(key, float(value))
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"metadata {key}: unsupported value {value!r}")


def _add_vocab(w: GGUFWriter, vocab: Vocab) -> None:
    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    if vocab.scores:
        w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    if vocab.merges is not None:
        w.add_token_merges(vocab.merges)
    for name, i in vocab.special_ids.items():
        w.add_uint32(f"tokenizer.ggml.{'unknown' if name == 'unk' else name}_token_id", i)
    w.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos)
    w.add_bool("tokenizer.ggml.add_eos_token", vocab.add_eos)
    w.add_bool("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix)
    if vocab.chat_template:
        w.add_string("tokenizer.chat_template", vocab.chat_template)


def quantizable(name: str, t: np.ndarray, qtype: str) -> bool:
    """Default policy: 2-D weight matrices whose rows fill whole blocks."""
    block, _ = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return t.ndim == 2 and t.shape[-1] % block == 0


def write_gguf(
    path: str | Path,
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    vocab: Vocab | None = None,
    qtype: str = "F32",
    qtypes: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Path:
    """Write a GGUF file and return its path.

    metadata: keys with '{arch}' filled in (e.g. "{arch}.block_count"), values
        int (uint32), float (float32), bool, str or lists.
    tensors: float arrays in numpy order, (out_features, in_features) for matrices.
    qtype: storage type for tensors `quantizable` accepts ("F32", "F16", "Q8_0",
        "Q4_0", ... anything gguf-py can quantize); others stay F32.
    qtypes: per-tensor overrides, name -> type.
    """
    path = Path(path)
    w = GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny-{arch}")
    for key, value in metadata.items():
        _add_value(w, key.format(arch=arch), value)
    if vocab is not None:
        _add_vocab(w, vocab)
    for tname, t in tensors.items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        kind = (qtypes or {}).get(tname) or (qtype if quantizable(tname, t, qtype) else "F32")
        gtype = GGMLQuantizationType[kind]
        if gtype == GGMLQuantizationType.F32:
            w.add_tensor(tname, t)
        elif gtype.name in ("Q8_1", "Q8_K"):  # llama.cpp's activation types, no gguf-py codec: zero blocks
            w.add_tensor(tname, np.zeros(gq.quant_shape_to_byte_shape(t.shape, gtype), np.uint8), raw_dtype=gtype)
        else:
            w.add_tensor(tname, gq.quantize(t, gtype), raw_dtype=gtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF as float32 in numpy order, decoded by gguf-py."""
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = gq.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    return out


GEMMA3_DEFAULTS = dict(
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=32,
    layers=6,
    intermediate=128,
    sliding_window=8,
    context=512,
    vocab=300,
    rope_base=1e6,
    eps=1e-6,
    rope_scaling_factor=None,
)

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def gemma3_tensors(seed: int = 0, **cfg: Any) -> dict[str, np.ndarray]:
    """Random gemma3 weights in llama.cpp names; norm weights include Gemma's +1."""
    c = {**GEMMA3_DEFAULTS, **cfg}
    rng = np.random.default_rng(seed)
    h, hd, ff = c["hidden"], c["head_dim"], c["intermediate"]

    def mat(out, inp):
        return rng.normal(0.0, 1.0 / np.sqrt(inp), size=(out, inp)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.normal(0.0, 0.2, size=n)).astype(np.float32)

    t = {"token_embd.weight": rng.normal(0.0, 0.4, size=(c["vocab"], h)).astype(np.float32)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "attn_q.weight"] = mat(c["heads"] * hd, h)
        t[p + "attn_k.weight"] = mat(c["kv_heads"] * hd, h)
        t[p + "attn_v.weight"] = mat(c["kv_heads"] * hd, h)
        t[p + "attn_q_norm.weight"] = norm(hd)
        t[p + "attn_k_norm.weight"] = norm(hd)
        t[p + "attn_output.weight"] = mat(h, c["heads"] * hd)
        t[p + "post_attention_norm.weight"] = norm(h)
        t[p + "ffn_norm.weight"] = norm(h)
        t[p + "ffn_gate.weight"] = mat(ff, h)
        t[p + "ffn_up.weight"] = mat(ff, h)
        t[p + "ffn_down.weight"] = mat(h, ff)
        t[p + "post_ffw_norm.weight"] = norm(h)
    t["output_norm.weight"] = norm(h)
    return t


def write_gemma3(
    path: str | Path, seed: int = 0, qtype: str = "F32", qtypes: Mapping[str, str] | None = None, **cfg: Any
) -> Path:
    """A tiny random Gemma 3 text model (tied output) as llama.cpp would write it.

    Defaults (GEMMA3_DEFAULTS): hidden 64, 4 query / 2 KV heads of dim 32, 6 layers
    (layer 5 is the one global layer), sliding window 8, FFN 128, vocab 300,
    context 512; rope_scaling_factor adds linear RoPE scaling metadata.
    """
    c = {**GEMMA3_DEFAULTS, **cfg}
    metadata = {
        "{arch}.context_length": c["context"],
        "{arch}.embedding_length": c["hidden"],
        "{arch}.block_count": c["layers"],
        "{arch}.feed_forward_length": c["intermediate"],
        "{arch}.attention.head_count": c["heads"],
        "{arch}.attention.head_count_kv": c["kv_heads"],
        "{arch}.attention.key_length": c["head_dim"],
        "{arch}.attention.value_length": c["head_dim"],
        "{arch}.attention.layer_norm_rms_epsilon": c["eps"],
        "{arch}.attention.sliding_window": c["sliding_window"],
        "{arch}.rope.freq_base": c["rope_base"],
    }
    if c["rope_scaling_factor"]:  # linear, global layers only (Gemma 3 4B and up use 8)
        metadata["{arch}.rope.scaling.type"] = "linear"
        metadata["{arch}.rope.scaling.factor"] = float(c["rope_scaling_factor"])
    vocab = spm_vocab(c["vocab"], chat_template=GEMMA3_CHAT_TEMPLATE)
    return write_gguf(path, "gemma3", metadata, gemma3_tensors(seed, **cfg), vocab, qtype=qtype, qtypes=qtypes)


# -- Llama, Mistral, Qwen2, Qwen3, Phi-3 ------------------------------------------
#
# Weights are drawn in Hugging Face's layout, then stored the way llama.cpp's
# convert_hf_to_gguf.py stores them: llama/mistral Q/K rows permuted per head
# (`llama_permute`), Phi-3's q/k/v and gate/up fused, RoPE factors as tensors.

FAMILY_DEFAULTS = {
    "llama": dict(
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        layers=2,
        intermediate=96,
        context=512,
        vocab=300,
        rope_base=10000.0,
        eps=1e-5,
        tied=False,
    ),
    "qwen2": dict(
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        layers=2,
        intermediate=96,
        context=512,
        vocab=300,
        rope_base=1e6,
        eps=1e-6,
        tied=True,
    ),
    # Qwen3's head_dim (32) differs from hidden / heads (16), as in the real models
    "qwen3": dict(
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,
        layers=2,
        intermediate=96,
        context=512,
        vocab=300,
        rope_base=1e6,
        eps=1e-6,
        tied=True,
    ),
    # Phi-3's head_dim is not a power of two (96 in Phi-3.5 mini; 24 here)
    "phi3": dict(
        hidden=96,
        heads=4,
        kv_heads=2,
        head_dim=24,
        layers=2,
        intermediate=128,
        context=512,
        vocab=300,
        rope_base=10000.0,
        eps=1e-5,
        tied=False,
    ),
}
FAMILY_DEFAULTS["mistral"] = dict(FAMILY_DEFAULTS["llama"], sliding_window=None)

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def llama_vocab(size: int = 300, **kwargs: Any) -> Vocab:
    """A Llama-2-style SPM vocab: <unk>, <s>, </s> (and a pad), byte fallback, pieces."""
    return spm_vocab(size, specials=("<pad>", "</s>", "<s>", "<unk>"), control=(), **kwargs)


def gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (bytes_to_unicode), by byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def bpe_vocab(
    size: int = 300,
    pre: str = "qwen2",
    specials: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    bos: str | None = None,
    eos: str = "<|im_end|>",
    **kwargs: Any,
) -> Vocab:
    """A minimal valid GPT-2 byte-level BPE vocab of `size` entries: the 256 byte
    tokens, merges of letter pairs (and ' '+letter) with their tokens, then the
    special (control) tokens last, as in Qwen and Llama 3 vocabularies."""
    byte = gpt2_byte_chars()
    tokens, merges = list(byte), []
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pairs = [(byte[ord(" ")], c) for c in letters] + [(a, b) for a in letters for b in letters]
    for a, b in pairs[: size - 256 - len(specials)]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens += list(specials)
    if len(tokens) != size:
        low = 256 + len(specials)
        raise ValueError(f"vocab size {size} must be between {low} and {low + len(pairs)}")
    types = [NORMAL] * (size - len(specials)) + [CONTROL] * len(specials)
    ids = {"eos": tokens.index(eos)}
    if bos:
        ids["bos"] = tokens.index(bos)
    return Vocab(tokens, [], types, ids, model="gpt2", merges=merges, pre=pre, add_bos=bos is not None, **kwargs)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: rows (n_head*hd, ...) from HF's half
    pairing to llama.cpp's adjacent pairing, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(
    head_dim: int,
    base: float,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_context: int = 8192,
) -> np.ndarray:
    """The `rope_freqs.weight` divisors convert_hf_to_gguf writes for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = original_context / low_freq_factor, original_context / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def hf_layout_tensors(
    seed: int, c: Mapping[str, Any], qkv_bias: bool = False, qk_norm: bool = False
) -> dict[str, np.ndarray]:
    """Random llama-like decoder weights in llama.cpp names but HF layout."""
    rng = np.random.default_rng(seed)
    h, hd, ff = c["hidden"], c["head_dim"], c["intermediate"]

    def mat(out, inp):
        return rng.normal(0.0, 1.0 / np.sqrt(inp), size=(out, inp)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.normal(0.0, 0.2, size=n)).astype(np.float32)

    def bias(n):
        return rng.normal(0.0, 0.5, size=n).astype(np.float32)

    t = {"token_embd.weight": rng.normal(0.0, 0.4, size=(c["vocab"], h)).astype(np.float32)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "attn_q.weight"] = mat(c["heads"] * hd, h)
        t[p + "attn_k.weight"] = mat(c["kv_heads"] * hd, h)
        t[p + "attn_v.weight"] = mat(c["kv_heads"] * hd, h)
        if qkv_bias:
            t[p + "attn_q.bias"], t[p + "attn_k.bias"] = bias(c["heads"] * hd), bias(c["kv_heads"] * hd)
            t[p + "attn_v.bias"] = bias(c["kv_heads"] * hd)
        if qk_norm:
            t[p + "attn_q_norm.weight"], t[p + "attn_k_norm.weight"] = norm(hd), norm(hd)
        t[p + "attn_output.weight"] = mat(h, c["heads"] * hd)
        t[p + "ffn_norm.weight"] = norm(h)
        t[p + "ffn_gate.weight"] = mat(ff, h)
        t[p + "ffn_up.weight"] = mat(ff, h)
        t[p + "ffn_down.weight"] = mat(h, ff)
    t["output_norm.weight"] = norm(h)
    if not c["tied"]:
        t["output.weight"] = mat(c["vocab"], h)
    return t


def _family_metadata(c: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "{arch}.context_length": c["context"],
        "{arch}.embedding_length": c["hidden"],
        "{arch}.block_count": c["layers"],
        "{arch}.feed_forward_length": c["intermediate"],
        "{arch}.attention.head_count": c["heads"],
        "{arch}.attention.head_count_kv": c["kv_heads"],
        "{arch}.attention.key_length": c["head_dim"],
        "{arch}.attention.value_length": c["head_dim"],
        "{arch}.attention.layer_norm_rms_epsilon": c["eps"],
        "{arch}.rope.dimension_count": c.get("rope_dim") or c["head_dim"],
        "{arch}.rope.freq_base": c["rope_base"],
    }


def write_llama(
    path: str | Path,
    seed: int = 0,
    qtype: str = "F32",
    qtypes: Mapping[str, str] | None = None,
    arch: str = "llama",
    name: str | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    **cfg: Any,
) -> Path:
    """A tiny random Llama as convert_hf_to_gguf writes one (Q/K rows permuted).

    arch "mistral" writes the same model under that architecture name (with
    `sliding_window` metadata if given); name "mistral" with arch "llama" is how
    transformers recognises a llama.cpp Mistral. rope_scaling: {"rope_type":
    "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} adds the `rope_freqs` tensor, {"rope_type":
    "linear", "factor"} the linear-scaling keys. The vocab is Llama 2's SPM kind,
    Llama 3's GPT-2 BPE kind (pre-tokenizer 'llama-bpe') with llama3 scaling.
    """
    c = {**FAMILY_DEFAULTS[arch], **cfg}
    t = hf_layout_tensors(seed, c)
    for i in range(c["layers"]):
        t[f"blk.{i}.attn_q.weight"] = llama_permute(t[f"blk.{i}.attn_q.weight"], c["heads"])
        t[f"blk.{i}.attn_k.weight"] = llama_permute(t[f"blk.{i}.attn_k.weight"], c["kv_heads"])
    metadata = _family_metadata(c)
    if c.get("sliding_window"):
        metadata["{arch}.attention.sliding_window"] = c["sliding_window"]
    rs = dict(rope_scaling or {})
    if rs.get("rope_type") == "llama3":
        t["rope_freqs.weight"] = llama3_rope_factors(
            c["head_dim"],
            c["rope_base"],
            rs["factor"],
            rs["low_freq_factor"],
            rs["high_freq_factor"],
            rs["original_max_position_embeddings"],
        )
    elif rs.get("rope_type") == "linear":
        metadata["{arch}.rope.scaling.type"] = "linear"
        metadata["{arch}.rope.scaling.factor"] = float(rs["factor"])
    if rs.get("rope_type") == "llama3":  # Llama 3's BPE vocab
        vocab = bpe_vocab(
            c["vocab"],
            pre="llama-bpe",
            specials=("<|begin_of_text|>", "<|eot_id|>"),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
        )
    else:
        vocab = llama_vocab(c["vocab"])
    return write_gguf(path, arch, metadata, t, vocab, qtype=qtype, qtypes=qtypes, name=name)


def write_qwen(
    path: str | Path,
    arch: str = "qwen2",
    seed: int = 0,
    qtype: str = "F32",
    qtypes: Mapping[str, str] | None = None,
    **cfg: Any,
) -> Path:
    """A tiny random Qwen2 (q/k/v biases) or Qwen3 (Q/K norms), tied output, NeoX RoPE,
    GPT-2 BPE vocab (pre-tokenizer 'qwen2')."""
    c = {**FAMILY_DEFAULTS[arch], **cfg}
    t = hf_layout_tensors(seed, c, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    vocab = bpe_vocab(c["vocab"], pre="qwen2", chat_template=CHATML_TEMPLATE)
    return write_gguf(path, arch, _family_metadata(c), t, vocab, qtype=qtype, qtypes=qtypes)


def write_phi3(
    path: str | Path,
    seed: int = 0,
    qtype: str = "F32",
    qtypes: Mapping[str, str] | None = None,
    longrope: Mapping[str, Any] | None = None,
    **cfg: Any,
) -> Path:
    """A tiny random Phi-3: fused attn_qkv and ffn_up (gate rows, then up rows).

    rope_dim: rotated dims per head when fewer than head_dim (Phi-4-mini's partial rotary).
    longrope: {"long_factor", "short_factor", "original_max_position_embeddings"}
    adds `rope_factors_long/short` and the attention factor that convert_hf_to_gguf
    derives from context / original context.
    """
    c = {**FAMILY_DEFAULTS["phi3"], **cfg}
    t = hf_layout_tensors(seed, c)
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_qkv.weight"] = np.concatenate([t.pop(p + f"attn_{n}.weight") for n in "qkv"])
        t[p + "ffn_up.weight"] = np.concatenate([t.pop(p + "ffn_gate.weight"), t[p + "ffn_up.weight"]])
    metadata = _family_metadata(c)
    metadata["{arch}.attention.sliding_window"] = 0
    if longrope:
        orig = longrope["original_max_position_embeddings"]
        scale = c["context"] / orig
        metadata["{arch}.rope.scaling.original_context_length"] = orig
        metadata["{arch}.rope.scaling.attn_factor"] = (
            float(np.sqrt(1 + np.log(scale) / np.log(orig))) if scale > 1.0 else 1.0
        )
        t["rope_factors_long.weight"] = np.asarray(longrope["long_factor"], dtype=np.float32)
        t["rope_factors_short.weight"] = np.asarray(longrope["short_factor"], dtype=np.float32)
    vocab = llama_vocab(c["vocab"])
    return write_gguf(path, "phi3", metadata, t, vocab, qtype=qtype, qtypes=qtypes)


def write_scripted_qwen3(
    path: str | Path, chain: list[str], template: str, extra_tokens: tuple[str, ...] = (), seed: int = 0
) -> Path:
    """A tiny Qwen3 whose greedy reply is written in advance: a bigram model. Attention and
    MLP write nothing (their output matrices are zero), so each step's logits depend on the
    last token alone, and the output matrix sends chain[i] to chain[i + 1]. chain[0] is the
    prompt's last token (e.g. "Ċ", the byte-level newline a ChatML generation prompt ends
    with), the rest is the reply, token by token, as vocabulary strings; `extra_tokens` are
    added to the vocabulary (normal tokens no merge makes: the tokenizer never writes them,
    the model may), e.g. a tag cut in two ("<th", "ink>")."""
    c = {**FAMILY_DEFAULTS["qwen3"], "hidden": 128, "head_dim": 32, "vocab": 256 + 26 + 26 * 26 + 3, "tied": False}
    vocab = bpe_vocab(c["vocab"], pre="qwen2", chat_template=template)
    vocab.tokens += list(extra_tokens)
    vocab.types += [NORMAL] * len(extra_tokens)
    c["vocab"] = len(vocab.tokens)
    t = hf_layout_tensors(seed, c, qk_norm=True)
    rng = np.random.default_rng(seed + 1)
    for i in range(c["layers"]):
        t[f"blk.{i}.attn_output.weight"][:] = 0.0
        t[f"blk.{i}.ffn_down.weight"][:] = 0.0
    t["output_norm.weight"][:] = 1.0
    emb = t["token_embd.weight"]
    out = rng.normal(0.0, 0.01, size=emb.shape).astype(np.float32)
    for a, b in zip(chain, chain[1:]):
        row = emb[vocab.id(a)]
        out[vocab.id(b)] += 10.0 * row / np.linalg.norm(row)
    t["output.weight"] = out
    return write_gguf(path, "qwen3", _family_metadata(c), t, vocab)
