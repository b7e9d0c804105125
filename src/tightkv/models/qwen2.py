"""Qwen2 / Qwen2.5: Llama's graph with biases on the q/k/v projections and
NeoX-style RoPE (halves, not adjacent pairs: the converter does not permute Qwen's
Q/K rows). Small models tie the output to the embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..kv.cache import positions
from .base import (
    BaseModelArgs,
    GatedMLP,
    PreNormBlock,
    RopeTables,
    Weights,
    linear_rope_scale,
    output_rows,
    project_heads,
    run_layers,
)


@dataclass
class ModelArgs(BaseModelArgs):
    rope_scale: float = 1.0  # linear scaling of positions

    @classmethod
    def from_gguf(cls, g, **extra):
        extra.setdefault("rope_scale", linear_rope_scale(g))
        return super().from_gguf(g, **extra)


class Attention(torch.nn.Module):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.args = args
        self.wqkv = w.stacked([p + f"attn_{n}.weight" for n in "qkv"])  # ((H + 2 Hkv) * D, hidden)
        self.bqkv = torch.cat([w.vector(p + f"attn_{n}.bias") for n in "qkv"])  # ((H + 2 Hkv) * D,)
        self.wo = w.linear(p + "attn_output.weight")
        self.scale = 1.0 / math.sqrt(args.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeTables, cache) -> torch.Tensor:
        a = self.args
        T, D = x.shape[0], a.head_dim
        cos, sin = rope.get(a.rope_theta, a.rope_scale)
        q, k, v = project_heads(self, x, cos, sin)  # (H, T, D), (Hkv, T, D) x 2
        out = cache.attend(q, k, v, self.scale)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, a.num_heads * D)  # before wo (the block's `forward`)


class Block(PreNormBlock):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.eps = args.rms_norm_eps
        self.attn = Attention(args, w, i)
        self.mlp = GatedMLP(w, i, "silu")
        self.attn_norm = w.vector(p + "attn_norm.weight")  # (hidden,)
        self.ffn_norm = w.vector(p + "ffn_norm.weight")  # (hidden,)


class Model(torch.nn.Module):
    """Qwen2 text model over quantized GGUF weights."""

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.embed = w.linear("token_embd.weight")  # (vocab, hidden) blocks
        self.output = w.linear("output.weight") if w.has("output.weight") else self.embed
        self.layers = torch.nn.ModuleList(Block(args, w, i) for i in range(args.num_layers))
        self.norm = w.vector("output_norm.weight")

    def cache_layout(self) -> list[tuple[int, int, int, int | None]]:
        return self.args.cache_layout()

    def forward(
        self, ids: torch.Tensor, cache: list, logits_at: torch.Tensor | None = None, hidden: bool = False
    ) -> torch.Tensor | None:
        """Run ids (T,) at positions cache.offset.. (a batch: one row per sequence); logits (len(logits_at), vocab) for the
        chosen row indices (all rows if None), or None when logits_at is empty. With
        hidden=True, the final-normed hidden states (rows, hidden_size) instead."""
        rope = RopeTables(positions(cache, ids.shape[0]), self.args.head_dim)
        x = self.embed.embed_rows(ids)  # (T, hidden)
        y = run_layers(self.layers, x, rope, cache, self.norm, self.args.rms_norm_eps)  # (T, hidden)
        return output_rows(y, logits_at, hidden, self.output)
