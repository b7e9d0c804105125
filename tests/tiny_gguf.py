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
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
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

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, text: str) -> int:
        return self.tokens.index(text)


def spm_vocab(size: int = 300, specials: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>"),
              control: tuple[str, ...] = ("<start_of_turn>", "<end_of_turn>"), **kwargs: Any) -> Vocab:
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
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab.tokens)
    w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
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


def write_gguf(path: str | Path, arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
               vocab: Vocab | None = None, qtype: str = "F32", qtypes: Mapping[str, str] | None = None,
               name: str | None = None) -> Path:
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


GEMMA3_DEFAULTS = dict(hidden=64, heads=4, kv_heads=2, head_dim=32, layers=6, intermediate=128,
                       sliding_window=8, context=512, vocab=300, rope_base=1e6, eps=1e-6,
                       rope_scaling_factor=None)

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


def write_gemma3(path: str | Path, seed: int = 0, qtype: str = "F32", qtypes: Mapping[str, str] | None = None,
                 **cfg: Any) -> Path:
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
