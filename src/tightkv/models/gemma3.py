"""Gemma 3 (text): sliding-window layers with their own RoPE base, Q/K norms,
pre and post norms around attention and MLP, a scaled embedding, GELU-tanh,
and the output tied to the embedding.

Follows llama.cpp's gemma3 graph: 5 of every 6 layers attend to the last
``sliding_window`` tokens with RoPE base 10000; every 6th layer is global with
the file's RoPE base (and linear RoPE scaling, if the file has one). GGUF stores
the norm weights with Gemma's ``+1`` already added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(BaseModelArgs):
    sliding_window: int = 512
    sliding_window_pattern: int = 6
    rope_local_theta: float = 10000.0
    qk_norm = True  # each query and key head RMS-normed before RoPE
    post_norms = True  # post_attention_norm, post_ffw_norm on each sublayer's output
    act = "gelu"

    @classmethod
    def from_gguf(cls, g, **extra):
        m = g.metadata
        factor = m.get("gemma3.rope.scaling.factor")
        linear = factor and m.get("gemma3.rope.scaling.type", "linear") == "linear"
        extra.setdefault("sliding_window", int(m.get("gemma3.attention.sliding_window", 512)))
        extra.setdefault("rope_scale", 1.0 / float(factor) if linear else 1.0)  # global layers only
        return super().from_gguf(g, **extra)

    def is_sliding(self, layer: int) -> bool:
        return layer % self.sliding_window_pattern < self.sliding_window_pattern - 1

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.is_sliding(layer) else None

    def rope(self, layer: int) -> tuple[float, float]:
        return (self.rope_local_theta, 1.0) if self.is_sliding(layer) else (self.rope_theta, self.rope_scale)

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)

    @property
    def attention_scale(self) -> float:
        if self.num_layers == 62:  # Gemma 3 27B scales by hidden / heads, as llama.cpp does
            return 1.0 / math.sqrt(self.hidden_size / self.num_heads)
        return 1.0 / math.sqrt(self.head_dim)
