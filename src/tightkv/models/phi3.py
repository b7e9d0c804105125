"""Phi-3 / Phi-3.5 / Phi-4-mini: a Llama-like decoder with fused projections
(``attn_qkv``: query, key and value rows stacked; ``ffn_up``: gate rows, then up
rows), NeoX RoPE over the first ``rope.dimension_count`` dims of each head
(partial rotary in Phi-4-mini), and head_dim 96 in Phi-3.5 mini.

LongRoPE (the 128k models) comes as per-frequency divisors ``rope_factors_long``
and ``rope_factors_short`` plus ``rope.scaling.attn_factor`` multiplying cos and
sin. As in llama.cpp, the long factors are used when the context the model runs
with exceeds ``rope.scaling.original_context_length``; that is decided once (by
default from the trained context, or by `set_context_length`), never between
tokens of one cache. Phi-3's sliding window is ignored, as llama.cpp does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import BaseModelArgs
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(BaseModelArgs):
    original_context_length: int = 0  # LongRoPE's pretraining context (0: no LongRoPE)
    fused_gate_up = True  # ffn_up: the gate rows, then the up rows (attn_qkv, fused too, is read where present)
    rope_factor_tensors = {"long": "rope_factors_long.weight", "short": "rope_factors_short.weight"}

    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        extra.setdefault("rope_dim", int(m.get(f"{arch}.rope.dimension_count") or 0))
        extra.setdefault("rope_attn_factor", float(m.get(f"{arch}.rope.scaling.attn_factor") or 1.0))
        extra.setdefault("original_context_length", int(m.get(f"{arch}.rope.scaling.original_context_length") or 0))
        return super().from_gguf(g, **extra)

    def rope_factors(self, context_length: int) -> str:
        """LongRoPE's long factors for a context beyond the original one, else the short ones."""
        long = self.original_context_length and context_length > self.original_context_length
        return "long" if long else "short"
