"""Llama (2, 3, 3.1, 3.2) and the models that share its GGUF architecture
(SmolLM2, Mistral 7B as llama.cpp converts it, ...): RMSNorm, SwiGLU, grouped-query
attention, RoPE.

llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` within each head
so that its "normal" RoPE rotates adjacent pairs (2i, 2i+1) instead of HF's halves.
We keep the blocks as stored (no copy, no dequantization) and rotate adjacent
pairs too: queries and keys share the permutation, so their dot products, and the
attention, are those of the unpermuted model.

RoPE scaling: Llama 3.1+ files carry per-frequency divisors as the
``rope_freqs.weight`` tensor (the converter's llama3 factors), older ones may
have linear ``rope.scaling.{type,factor}``.
"""

from __future__ import annotations

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


class ModelArgs(BaseModelArgs):
    rope_style = "interleaved"  # adjacent pairs: the converter permuted the Q/K rows for them
    rope_factor_tensors = {"freqs": "rope_freqs.weight"}  # Llama 3.1+: the converter's llama3 factors
