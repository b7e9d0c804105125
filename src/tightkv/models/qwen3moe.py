"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k
norms, NeoX RoPE, no biases) with a mixture of experts in every block (`moe.MoE`): softmax
over ``expert_count`` experts, the top ``expert_used_count`` renormalized, no shared expert.
"""

from __future__ import annotations

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


class ModelArgs(BaseModelArgs):
    qk_norm = True  # each query and key head RMS-normed (attn_q_norm, attn_k_norm), before RoPE
    required = ("expert_count", "expert_used_count", "expert_feed_forward_length")
