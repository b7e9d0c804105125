"""Qwen2 / Qwen2.5: Llama's graph with biases on the q/k/v projections and
NeoX-style RoPE (halves, not adjacent pairs: the converter does not permute Qwen's
Q/K rows). Small models tie the output to the embedding.
"""

from __future__ import annotations

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


class ModelArgs(BaseModelArgs):
    qkv_bias = True  # q, k and v projections add attn_{q,k,v}.bias
