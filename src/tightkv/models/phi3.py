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

import math
from dataclasses import dataclass

import torch

from ..kv.cache import positions
from .base import (
    BaseModelArgs,
    PreNormBlock,
    RopeTables,
    Weights,
    glu,
    linear_rope_scale,
    output_rows,
    project_heads,
    run_layers,
)


@dataclass
class ModelArgs(BaseModelArgs):
    rope_dim: int = 0  # rotated dims of each head (0: all of head_dim)
    rope_scale: float = 1.0  # linear scaling of positions
    rope_attn_factor: float = 1.0  # LongRoPE's cos/sin multiplier
    original_context_length: int = 0  # LongRoPE's pretraining context (0: no LongRoPE)

    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        extra.setdefault("rope_dim", int(m.get(f"{arch}.rope.dimension_count") or 0))
        extra.setdefault("rope_scale", linear_rope_scale(g))
        extra.setdefault("rope_attn_factor", float(m.get(f"{arch}.rope.scaling.attn_factor") or 1.0))
        extra.setdefault("original_context_length", int(m.get(f"{arch}.rope.scaling.original_context_length") or 0))
        return super().from_gguf(g, **extra)


class Attention(torch.nn.Module):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.args = args
        if w.has(p + "attn_qkv.weight"):
            self.wqkv = w.linear(p + "attn_qkv.weight")  # ((H + 2 Hkv) * D, hidden)
        else:
            self.wqkv = w.stacked([p + f"attn_{n}.weight" for n in "qkv"])
        self.wo = w.linear(p + "attn_output.weight")
        self.scale = 1.0 / math.sqrt(args.head_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache) -> torch.Tensor:
        a = self.args
        T, D, H = x.shape[0], a.head_dim, a.num_heads
        cos, sin = rope  # (T, rope_dim/2)
        q, k, v = project_heads(self, x, cos, sin)  # (H, T, D), (Hkv, T, D) x 2
        out = cache.attend(q, k, v, self.scale)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, H * D)  # before wo (the block's `forward`)


class MLP(torch.nn.Module):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.act = "silu"
        self.gate_up = w.linear(p + "ffn_up.weight")  # (2 * ff, hidden): gate rows, then up rows
        self.down = w.linear(p + "ffn_down.weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(glu(self.gate_up(x), self.act))


class Block(PreNormBlock):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.eps = args.rms_norm_eps
        self.attn = Attention(args, w, i)
        self.mlp = MLP(args, w, i)
        self.attn_norm = w.vector(p + "attn_norm.weight")  # (hidden,)
        self.ffn_norm = w.vector(p + "ffn_norm.weight")  # (hidden,)


class Model(torch.nn.Module):
    """Phi-3 text model over quantized GGUF weights."""

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.factors = {
            kind: w.vector(f"rope_factors_{kind}.weight")  # (rope_dim/2,) frequency divisors
            for kind in ("long", "short")
            if w.has(f"rope_factors_{kind}.weight")
        }
        self.rope_factors: torch.Tensor | None = None
        self.set_context_length(args.context_length)
        self.embed = w.linear("token_embd.weight")  # (vocab, hidden) blocks
        self.output = w.linear("output.weight") if w.has("output.weight") else self.embed
        self.layers = torch.nn.ModuleList(Block(args, w, i) for i in range(args.num_layers))
        self.norm = w.vector("output_norm.weight")

    def set_context_length(self, n: int) -> None:
        """Choose LongRoPE's long factors for contexts beyond the original one, as
        llama.cpp does from its context size; call before filling a cache."""
        long = self.args.original_context_length and n > self.args.original_context_length
        self.rope_factors = self.factors.get("long" if long else "short")

    def cache_layout(self) -> list[tuple[int, int, int, int | None]]:
        return self.args.cache_layout()

    def forward(
        self, ids: torch.Tensor, cache: list, logits_at: torch.Tensor | None = None, hidden: bool = False
    ) -> torch.Tensor | None:
        """Run ids (T,) at positions cache.offset.. (a batch: one row per sequence); logits (len(logits_at), vocab) for the
        chosen row indices (all rows if None), or None when logits_at is empty. With
        hidden=True, the final-normed hidden states (rows, hidden_size) instead."""
        a = self.args
        rope = RopeTables(positions(cache, ids.shape[0]), a.rope_dim or a.head_dim).get(
            a.rope_theta, a.rope_scale, self.rope_factors, a.rope_attn_factor
        )  # cos, sin (T, rope_dim/2)
        x = self.embed.embed_rows(ids)  # (T, hidden)
        y = run_layers(self.layers, x, rope, cache, self.norm, self.args.rms_norm_eps)  # (T, hidden)
        return output_rows(y, logits_at, hidden, self.output)
