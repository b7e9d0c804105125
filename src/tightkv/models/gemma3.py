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

import torch

from ..kv.cache import positions
from .base import BaseModelArgs, GatedMLP, PreNormBlock, RopeTables, Weights, output_rows, project_heads, run_layers


@dataclass
class ModelArgs(BaseModelArgs):
    sliding_window: int = 512
    sliding_window_pattern: int = 6
    rope_local_theta: float = 10000.0
    rope_scale: float = 1.0  # linear scaling of global-layer positions

    @classmethod
    def from_gguf(cls, g, **extra):
        m = g.metadata
        factor = m.get("gemma3.rope.scaling.factor")
        extra.setdefault("sliding_window", int(m.get("gemma3.attention.sliding_window", 512)))
        if factor and m.get("gemma3.rope.scaling.type", "linear") == "linear":
            extra.setdefault("rope_scale", 1.0 / float(factor))
        return super().from_gguf(g, **extra)

    def cache_layout(self) -> list[tuple[int, int, int, int | None]]:
        return [
            (self.num_kv_heads, self.head_dim, self.head_dim, self.sliding_window if self.is_sliding(i) else None)
            for i in range(self.num_layers)
        ]

    def is_sliding(self, layer: int) -> bool:
        return layer % self.sliding_window_pattern < self.sliding_window_pattern - 1

    @property
    def attention_scale(self) -> float:
        if self.num_layers == 62:  # Gemma 3 27B scales by hidden / heads, as llama.cpp does
            return 1.0 / math.sqrt(self.hidden_size / self.num_heads)
        return 1.0 / math.sqrt(self.head_dim)


class Attention(torch.nn.Module):
    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.args = args
        self.sliding = args.is_sliding(i)
        self.theta = args.rope_local_theta if self.sliding else args.rope_theta
        self.rope_scale = 1.0 if self.sliding else args.rope_scale
        self.wqkv = w.stacked([p + f"attn_{n}.weight" for n in "qkv"])  # ((H + 2 Hkv) * D, hidden)
        self.wo = w.linear(p + "attn_output.weight")
        self.q_norm = w.vector(p + "attn_q_norm.weight")  # (head_dim,)
        self.k_norm = w.vector(p + "attn_k_norm.weight")  # (head_dim,)

    def forward(self, x: torch.Tensor, rope: RopeTables, cache) -> torch.Tensor:
        a = self.args
        T, D = x.shape[0], a.head_dim
        cos, sin = rope.get(self.theta, self.rope_scale)
        q, k, v = project_heads(self, x, cos, sin, a.rms_norm_eps)  # (H, T, D), (Hkv, T, D) x 2
        out = cache.attend(q, k, v, a.attention_scale)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, a.num_heads * D)  # before wo (the block's `forward`)


class Block(PreNormBlock):
    """Pre-norm, with each sublayer's output normed too (post_attn_norm, post_ffn_norm)."""

    def __init__(self, args: ModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.eps = args.rms_norm_eps
        self.attn = Attention(args, w, i)
        self.mlp = GatedMLP(w, i, "gelu")
        names = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
        self.attn_norm, self.post_attn_norm, self.ffn_norm, self.post_ffn_norm = (
            w.vector(p + n + ".weight") for n in names
        )


class Model(torch.nn.Module):
    """Gemma 3 text model over quantized GGUF weights."""

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.embed = w.linear("token_embd.weight")  # (vocab, hidden) blocks, also the output layer
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
        hidden=True, the final-normed hidden states (rows, hidden_size) instead:
        `self.output` turns them into logits."""
        rope = RopeTables(positions(cache, ids.shape[0]), self.args.head_dim)
        x = self.embed.embed_rows(ids) * math.sqrt(self.args.hidden_size)  # (T, hidden)
        y = run_layers(self.layers, x, rope, cache, self.norm, self.args.rms_norm_eps)  # (T, hidden)
        return output_rows(y, logits_at, hidden, self.output)
