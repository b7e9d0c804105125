"""Qwen3.5 / Qwen3.6 mixture of experts (Qwen3.6-35B-A3B; GGUF ``qwen35moe``): the Qwen3.5
hybrid (`qwen35`) with a mixture of experts in every block and a shared expert gated by a
sigmoid of its own (``ffn_gate_inp_shexp``) (`moe.MoE`).
"""

from __future__ import annotations

from .decoder import Model
from .qwen35 import ModelArgs as Qwen35Args

__all__ = ["ModelArgs", "Model"]


class ModelArgs(Qwen35Args):
    required = (*Qwen35Args.required, "expert_count", "expert_used_count", "expert_feed_forward_length")
