"""Qwen3.5 / Qwen3.6 (dense; GGUF ``qwen35``): a hybrid of Gated DeltaNet linear attention
(`deltanet.GatedDeltaNet`, with a recurrent state per layer, its shapes in ``ssm.*``) and
gated full attention, one layer in ``full_attention_interval`` (4) full, or as
``attention.recurrent_layers`` lists.

Full attention: attn_q gives each head's query and an output gate (sigmoid), q/k norms,
NeoX RoPE over the first ``rope.dimension_count`` dims of each head (llama.cpp's
interleaved multi-section RoPE, which for text, every section at the same position, is
this). The feed-forward's input norm is ``post_attention_norm``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import BaseModelArgs, metadata_key
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(BaseModelArgs):
    recurrent_layers: tuple[bool, ...] = ()
    qk_norm = True
    gated_attention = True
    ffn_norm = "post_attention_norm"
    required = ("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank")

    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        n = int(metadata_key(g, "block_count")) - int(m.get(f"{arch}.nextn_predict_layers") or 0)  # MTP blocks: unused
        layers = m.get(f"{arch}.attention.recurrent_layers")
        if layers is None:
            interval = int(m.get(f"{arch}.full_attention_interval") or 4)
            layers = [(i + 1) % interval != 0 for i in range(n)]
        extra.setdefault("rope_dim", int(m.get(f"{arch}.rope.dimension_count") or 0))
        return super().from_gguf(g, recurrent_layers=tuple(bool(x) for x in layers[:n]), **extra)

    def recurrent(self, layer: int) -> bool:
        return self.recurrent_layers[layer]
