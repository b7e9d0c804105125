"""Llama (2, 3, 3.1, 3.2) and the models that share its GGUF architecture
(SmolLM2, Mistral 7B as llama.cpp converts it, ...): RMSNorm, SwiGLU, grouped-query
attention, RoPE.

llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` within each head
so that its "normal" RoPE rotates adjacent pairs (2i, 2i+1) instead of HF's halves.
We keep the blocks as stored (no copy, no dequantization) and rotate adjacent
pairs too: queries and keys share the permutation, so their dot products, and the
attention, are those of the unpermuted model.

RoPE scaling: Llama 3.1+ files carry per-frequency divisors as the
``rope_freqs.weight`` tensor (the converter's llama3 factors), older ones may
have linear ``rope.scaling.{type,factor}``.
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
    apply_rope_interleaved,
    linear_rope_scale,
    output_rows,
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
    def __init__(self, args: ModelArgs, w: Weights, i: int, rope_freqs: torch.Tensor | None):
        super().__init__()
        p = f"blk.{i}."
        self.args = args
        self.rope_freqs = rope_freqs  # (head_dim/2,) frequency divisors, or None
        self.wqkv = w.stacked([p + f"attn_{n}.weight" for n in "qkv"])  # ((H + 2 Hkv) * D, hidden)
        self.wo = w.linear(p + "attn_output.weight")
        self.scale = 1.0 / math.sqrt(args.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeTables, cache) -> torch.Tensor:
        a = self.args
        T, D = x.shape[0], a.head_dim
        q, k, v = self.wqkv(x).split(self.wqkv.sizes, dim=-1)
        q = q.view(T, a.num_heads, D).transpose(0, 1)  # (H, T, D), rows permuted per head
        k = k.view(T, a.num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D), rows permuted per head
        v = v.view(T, a.num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D)
        cos, sin = rope.get(a.rope_theta, a.rope_scale, self.rope_freqs)
        q, k = apply_rope_interleaved(q, cos, sin), apply_rope_interleaved(k, cos, sin)
        out = cache.attend(q, k, v, self.scale)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, a.num_heads * D)  # before wo (the block's `forward`)


class Block(PreNormBlock):
    def __init__(self, args: ModelArgs, w: Weights, i: int, rope_freqs: torch.Tensor | None):
        super().__init__()
        p = f"blk.{i}."
        self.eps = args.rms_norm_eps
        self.attn = Attention(args, w, i, rope_freqs)
        self.mlp = GatedMLP(w, i, "silu")
        self.attn_norm = w.vector(p + "attn_norm.weight")  # (hidden,)
        self.ffn_norm = w.vector(p + "ffn_norm.weight")  # (hidden,)


class Model(torch.nn.Module):
    """Llama-architecture text model over quantized GGUF weights."""

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        rope_freqs = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
        self.embed = w.linear("token_embd.weight")  # (vocab, hidden) blocks
        self.output = w.linear("output.weight") if w.has("output.weight") else self.embed
        self.layers = torch.nn.ModuleList(Block(args, w, i, rope_freqs) for i in range(args.num_layers))
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
