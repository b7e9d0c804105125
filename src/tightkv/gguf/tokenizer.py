"""Tokenizers built from GGUF metadata, matching llama.cpp's `llama-vocab.cpp`.

`load_tokenizer(meta)` picks the class from `tokenizer.ggml.model`:

- ``llama``: SentencePiece-style vocab (`spm.SPMTokenizer`), llama.cpp's `llm_tokenizer_spm`.
- ``gpt2``: byte-level BPE (`bpe.BPETokenizer`), llama.cpp's `llm_tokenizer_bpe`.
- ``gemma4``: the same BPE machinery in SentencePiece style (``▁`` spaces, ``<0xNN>``
  byte tokens), as llama.cpp runs Gemma 4's vocab.

The shared base and token types are in `vocab`.
"""

from __future__ import annotations

from typing import Any

from ..errors import GGUFError
from .bpe import BPETokenizer
from .spm import SPMTokenizer
from .vocab import (  # noqa: F401  (the names callers import from here)
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNDEFINED,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_UNUSED,
    TYPE_USER_DEFINED,
    Tokenizer,
)

TOKENIZER_CLASSES: dict[str, type[Tokenizer]] = {
    "llama": SPMTokenizer,
    "gpt2": BPETokenizer,
    "gemma4": BPETokenizer,
}


def load_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer that GGUF metadata `meta` describes."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
    cls = TOKENIZER_CLASSES.get(model)
    if cls is None:
        raise GGUFError(f"unsupported tokenizer model '{model}'")
    return cls.from_metadata(meta)
