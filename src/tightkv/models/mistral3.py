"""Mistral 3 (Ministral 3 3B/8B/14B, Mistral Small 3.x text; GGUF ``mistral3``): Llama's
graph (adjacent-pair RoPE on the converter's permuted q/k rows, `rope_freqs` where present)
with YaRN scaling (`base.yarn_rope`) and Llama 4's attention temperature: each query is
multiplied by 1 + a log(floor(pos / n) + 1), a = ``attention.temperature_scale`` and n the
YaRN original context, so attention sharpens slowly with distance into a long context.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .base import metadata_key
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(llama.ModelArgs):
    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        scale = float(m.get(f"{arch}.attention.temperature_scale") or 0.0)
        if scale:
            n = int(m.get(f"{arch}.rope.scaling.original_context_length") or metadata_key(g, "context_length"))
            extra.setdefault("attn_temperature", (scale, n))
        return super().from_gguf(g, **extra)
