"""A tiny model that speaks harmony (gpt-oss's chat format) by script: a bigram Qwen3 (as
`tiny_gguf.write_scripted_qwen3`: attention and MLP write nothing, so each step's logits
depend on the last token alone) with gpt-oss's special tokens and chat template.

`chains` are token sequences by vocabulary string; chain[0] of each is the token it follows
(``"assistant"``, the end of the generation prompt ``<|start|>assistant``, for a reply).
A harmony reply repeats its markup (``<|channel|>`` opens each message), which a bigram
cannot do with one token, so an item ``"TEXT#k"`` (k >= 2) is copy k of TEXT: another token
with the same text (a copy of a special token is user-defined, and renders as its text, as
the harmony markup does once the loader retypes it). The first chain is the greedy reply;
the others branch off it with lower scores, and a request picks one with a `logit_bias` of
`BRANCH_BIAS` on the token where it leaves the first (that token's score everywhere else
stays below the chain's next token).
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
from tiny_gguf import (
    CONTROL,
    FAMILY_DEFAULTS,
    NORMAL,
    USER_DEFINED,
    _family_metadata,
    bpe_vocab,
    hf_layout_tensors,
    write_gguf,
)

SPECIALS = (
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
BRANCH_BIAS = 40
FIRST, OTHER = 10.0, 8.0  # how strongly a chain's token calls its next (the first chain wins where they part)

GPT_OSS_TEMPLATE = Path(__file__).parent / "reference" / "templates" / "openai-gpt-oss-120b.jinja"


def gpt_oss_template() -> str | None:
    """gpt-oss's chat template (llama.cpp's copy of the Hugging Face one), or None where
    that source tree is absent."""
    return GPT_OSS_TEMPLATE.read_text() if GPT_OSS_TEMPLATE.exists() else None


def write_scripted_harmony(path, chains: list[list[str]], template: str, seed: int = 0) -> Path:
    """The model (see the module docstring); returns its path."""
    c = {**FAMILY_DEFAULTS["qwen3"], "hidden": 128, "vocab": 256 + 26 + 26 * 26 + len(SPECIALS), "tied": False}
    vocab = bpe_vocab(c["vocab"], pre="qwen2", specials=SPECIALS, eos="<|return|>", chat_template=template)
    extra = ["assistant"] + sorted({t for chain in chains for t in chain if t not in vocab.tokens} - {"assistant"})
    for text in extra:
        base = text.split("#")[0] if "#" in text[1:] else text
        vocab.tokens.append(text)
        special = base in SPECIALS or base == "assistant"
        vocab.types.append(USER_DEFINED if special else NORMAL)
    # copies are written with the text they stand for
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    vocab.tokens = [t.split("#")[0] if "#" in t[1:] else t for t in vocab.tokens]
    assert all(vocab.types[ids[s]] == CONTROL for s in SPECIALS)
    c["vocab"] = len(vocab.tokens)
    t = hf_layout_tensors(seed, c, qk_norm=True)
    for i in range(c["layers"]):
        t[f"blk.{i}.attn_output.weight"][:] = 0.0
        t[f"blk.{i}.ffn_down.weight"][:] = 0.0
    t["output_norm.weight"][:] = 1.0
    emb = t["token_embd.weight"]
    out = np.random.default_rng(seed + 1).normal(0.0, 0.01, size=emb.shape).astype(np.float32)
    for k, chain in enumerate(chains):
        for a, b in pairwise(chain):
            row = emb[ids[a]]
            out[ids[b]] += (FIRST if k == 0 else OTHER) * row / np.linalg.norm(row)
    t["output.weight"] = out
    return write_gguf(path, "qwen3", _family_metadata(c), t, vocab)


def token_id(path, text: str) -> int:
    """The id of vocabulary item `text` ("TEXT#k" for a copy) in a model written here."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    tokens = [
        bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in r.fields["tokenizer.ggml.tokens"].data
    ]
    base, _, copy = text.partition("#") if "#" in text[1:] else (text, "", "")
    hits = [i for i, t in enumerate(tokens) if t == base]
    return hits[int(copy) - 1 if copy else 0]
