"""gpt-oss (20B, 120B; GGUF ``gpt-oss``): a mixture of experts (32 or 128, top 4) in every
block (the softmax of the top-4 logits: the top 4 of the softmax, renormalized), biases on the
router and every expert and gpt-oss's clamped SwiGLU (`moe.MoE`); the experts ship in MXFP4.
Attention: q/k/v and output biases, a learned sink logit per head in every softmax, sliding
windows of ``attention.sliding_window`` tokens on every other layer (the first sliding), NeoX
RoPE with YaRN scaling (`base.yarn_rope`). The feed-forward's input norm is
``post_attention_norm``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import BaseModelArgs, metadata_key, sliding_layers
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(BaseModelArgs):
    sliding_window: int = 128
    sliding: tuple[bool, ...] = ()
    rope_sliding_theta: float = 0.0  # the sliding layers' RoPE base (0: the global one)
    qkv_bias = True
    attention_sinks = True
    act = "swiglu_oai"
    ffn_norm = "post_attention_norm"
    required = ("expert_count", "expert_used_count", "expert_feed_forward_length")

    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        extra.setdefault("sliding_window", int(metadata_key(g, "attention.sliding_window")))
        extra.setdefault("sliding", sliding_layers(g, 2))
        extra.setdefault("rope_sliding_theta", float(m.get(f"{arch}.rope.freq_base_swa") or 0.0))
        return super().from_gguf(g, **extra)

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.sliding[layer] else None

    def rope(self, layer: int) -> tuple[float, float]:
        theta = self.rope_sliding_theta if self.sliding[layer] and self.rope_sliding_theta else self.rope_theta
        return theta, self.rope_scale
