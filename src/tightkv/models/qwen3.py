"""Qwen3 (dense): Qwen2's graph without the q/k/v biases, with an RMSNorm over
each query and key head (``attn_q_norm``/``attn_k_norm``, before RoPE), and a
head_dim (``attention.key_length``, 128) that is not hidden / heads. NeoX RoPE,
Q/K rows not permuted; small models tie the output to the embedding.
"""

from __future__ import annotations

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


class ModelArgs(BaseModelArgs):
    qk_norm = True  # each query and key head RMS-normed (attn_q_norm, attn_k_norm), before RoPE
