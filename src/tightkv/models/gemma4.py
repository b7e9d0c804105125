"""Gemma 4 (GGUF ``gemma4``: E2B, E4B, 31B, 26B-A4B), as llama.cpp's gemma4 graph runs it.

- Sliding-window and global layers (``attention.sliding_window_pattern``) with their own head
  dims (``key_length_swa`` / ``key_length``), KV heads (``head_count_kv`` may be per layer),
  RoPE bases (``rope.freq_base_swa`` / ``rope.freq_base``) and rotated dims; the global
  layers' "proportional" RoPE is NeoX over the whole head with ``rope_freqs`` dividing the
  frequencies (1e30 for the dims left unrotated).
- q/k norms, V RMS-normed without a weight, attention scale 1; V is K's projection where a
  layer has no attn_v (the 31B and 26B-A4B global layers).
- Pre and post norms around attention and the MLP (GELU-tanh), the embedding times
  sqrt(hidden), every layer's output (the stream) times ``layer_output_scale``, the logits
  soft-capped (``final_logit_softcapping``). Norm weights are used as stored (no +1).
- The last ``attention.shared_kv_layers`` layers compute queries only and attend over the KV
  of the last earlier layer of their kind (`kv.shared`: stored once).
- E2B/E4B: per-layer token embeddings, ``per_layer_token_embd`` rows of the tokens (the table
  stays quantized in the map), plus the embedding projected by ``per_layer_model_proj`` and
  normed, both scaled; each layer adds proj(gelu(inp_gate(x)) * its slice), normed.
- 26B-A4B: a mixture of experts beside the MLP in every layer (`moe.MoE`, routed on the
  stream RMS-normed and scaled by ``ffn_gate_inp.scale``; per-expert down scales), each side
  with its own post norm.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..errors import GGUFError
from ..kernels import sublayers
from ..kernels.qmatmul import StackedLinear
from ..kv.cache import positions
from ..kv.shared import SharedLayout
from . import decoder
from .base import (
    BaseModelArgs,
    Weights,
    add_rms_norm,
    apply_rope_neox,
    glu,
    metadata_key,
    rms_norm,
    rope_cos_sin,
)
from .moe import MoE

__all__ = ["Model", "ModelArgs"]


@dataclass
class ModelArgs(BaseModelArgs):
    sliding: tuple[bool, ...] = ()  # per layer: a sliding-window layer
    kv_heads: tuple[int, ...] = ()  # per layer
    sliding_window: int = 512
    head_dim_swa: int = 0
    rope_dim_swa: int = 0
    rope_theta_swa: float = 10000.0
    shared_kv_layers: int = 0  # the last layers, which read earlier layers' KV
    per_layer_dim: int = 0  # per-layer token embedding width (0: none)
    logit_softcap: float = 0.0
    qk_norm = True
    post_norms = True
    act = "gelu"
    required = ("attention.sliding_window_pattern", "attention.sliding_window", "attention.key_length_swa")

    @classmethod
    def from_gguf(cls, g, **extra):
        m, arch = g.metadata, g.architecture
        key = functools.partial(metadata_key, g)
        for name in cls.required:
            key(name)
        n = int(key("block_count"))
        sliding = tuple(bool(s) for s in key("attention.sliding_window_pattern"))
        kv = per_layer(g, "attention.head_count_kv", n, key("attention.head_count"))
        if len(sliding) != n:
            raise GGUFError(f"{g.path}: {arch}.attention.sliding_window_pattern has {len(sliding)} entries, not {n}")
        ff = per_layer(g, "feed_forward_length", n, 0)
        # the decoder's scalar fields take the largest; the per-layer values are read here
        scalars = {f"{arch}.attention.head_count_kv": max(kv), f"{arch}.feed_forward_length": max(ff)}
        swa = int(key("attention.key_length_swa"))
        extra.update(
            sliding=sliding,
            kv_heads=kv,
            sliding_window=int(key("attention.sliding_window")),
            head_dim_swa=swa,
            rope_dim_swa=int(m.get(f"{arch}.rope.dimension_count_swa") or swa),
            rope_theta_swa=float(m.get(f"{arch}.rope.freq_base_swa") or 10000.0),
            rope_dim=int(m.get(f"{arch}.rope.dimension_count") or 0),
            shared_kv_layers=int(m.get(f"{arch}.attention.shared_kv_layers") or 0),
            per_layer_dim=int(m.get(f"{arch}.embedding_length_per_layer_input") or 0),
            logit_softcap=float(m.get(f"{arch}.final_logit_softcapping") or 0.0),
        )
        args = super().from_gguf(replace(g, metadata={**m, **scalars}), **extra)
        for i in range(n):
            args.kv_source(i)  # a shared layer's source exists, or a one-line error now
        return args

    def is_sliding(self, layer: int) -> bool:
        return self.sliding[layer]

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.sliding[layer] else None

    def rope(self, layer: int) -> tuple[float, float]:
        return (self.rope_theta_swa, 1.0) if self.sliding[layer] else (self.rope_theta, self.rope_scale)

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dim_swa if self.sliding[layer] else self.head_dim

    def kv_source(self, layer: int) -> int | None:
        """The layer whose KV a shared layer reads: the last one of its kind (sliding or global)
        before the shared ones, as transformers decides (and llama.cpp, whose n_kv - 1 / n_kv - 2
        is that layer in every Gemma 4 layout); None for a layer with KV of its own."""
        first = self.num_layers - self.shared_kv_layers
        if layer < first:
            return None
        kind = self.sliding[layer]
        source = next((j for j in range(first - 1, -1, -1) if self.sliding[j] == kind), None)
        if source is None:
            raise GGUFError(
                f"layer {layer} shares the KV of an earlier {'sliding' * kind or 'global'} layer: none has KV"
            )
        return source

    def cache_layout(self) -> list:
        layout = []
        for i in range(self.num_layers):
            source = self.kv_source(i)
            d = self.layer_head_dim(i)
            layout.append(SharedLayout(source) if source is not None else (self.kv_heads[i], d, d, self.window(i)))
        return layout

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)

    @property
    def attention_scale(self) -> float:
        return 1.0


def per_layer(g, name: str, n: int, default) -> tuple[int, ...]:
    """A metadata value that is one number or one per layer, as n ints."""
    value = metadata_key(g, name, default)
    values = [int(v) for v in np.atleast_1d(value)]
    if len(values) == 1:
        values *= n
    if len(values) != n:
        raise GGUFError(f"{g.path}: {g.architecture}.{name} has {len(values)} entries, not {n}")
    return tuple(values)


class Attention(decoder.Attention):
    """The decoder's attention with this layer's head dim and KV heads, V normed, V = K where
    the layer has no attn_v, and queries only in a layer sharing another's KV."""

    def __init__(self, args: ModelArgs, w: Weights, i: int):
        torch.nn.Module.__init__(self)
        p, d = f"blk.{i}.", args.hidden_size
        H, Hkv, D = args.num_heads, args.kv_heads[i], args.layer_head_dim(i)
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, D
        self.sizes = [H * D, Hkv * D, Hkv * D]
        self.bqkv, self.interleaved, self.gated = None, False, False
        self.eps, self.scale = args.rms_norm_eps, args.attention_scale
        self.shared = args.kv_source(i) is not None
        q = w.linear(p + "attn_q.weight", (H * D, d))
        self.q_norm = w.vector(p + "attn_q_norm.weight", (D,))
        self.wo = w.linear(p + "attn_output.weight", (d, H * D))
        self.v_norm = torch.ones(D)
        if self.shared:
            self.wq, self.wqkv, self.k_norm = q, None, None
            return
        k = w.linear(p + "attn_k.weight", (Hkv * D, d))
        v = w.linear(p + "attn_v.weight", (Hkv * D, d)) if w.has(p + "attn_v.weight") else k  # V is K's projection
        self.wqkv = StackedLinear([q, k, v])
        self.k_norm = w.vector(p + "attn_k_norm.weight", (D,))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache) -> torch.Tensor:
        T, H, D = x.shape[0], self.num_heads, self.head_dim
        if self.shared:
            q = rms_norm(self.wq(x).view(T, H, D).transpose(0, 1), self.q_norm, self.eps)
            out = cache.attend(apply_rope_neox(q, cos, sin), None, None, self.scale)
        else:
            q, k, v = self._heads_neox(x, cos, sin)
            out = cache.attend(q, k, rms_norm(v, self.v_norm, self.eps), self.scale)
        return out.transpose(0, 1).reshape(T, H * D)

    __call__ = forward


class Block(decoder.Block):
    """Attention and the MLP as the decoder's block (post norms), a mixture of experts beside
    the MLP where the layer has one, then the per-layer embedding's residual and the output scale."""

    def __init__(self, args: ModelArgs, w: Weights, i: int):
        torch.nn.Module.__init__(self)
        p, d = f"blk.{i}.", args.hidden_size

        def norm(name: str, size: int = d) -> torch.Tensor:
            return w.vector(p + name + ".weight", (size,))

        self.eps = args.rms_norm_eps
        self.attn = Attention(args, w, i)
        self.mlp = decoder.MLP(args, w, i)
        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.post_attn_norm, self.post_ffn_norm = norm("post_attention_norm"), norm("post_ffw_norm")
        self.moe = None
        if w.has(p + "ffn_gate_inp.weight"):
            self.moe = Experts(args, w, i)
            self.router_norm = w.vector(p + "ffn_gate_inp.scale", (d,)) / math.sqrt(d)
            self.pre_moe_norm, self.post_mlp_norm = norm("pre_ffw_norm_2"), norm("post_ffw_norm_1")
            self.post_moe_norm = norm("post_ffw_norm_2")
        self.fused = self.moe is None  # wo through the MLP in one kernel call
        self.inp_gate = None
        if args.per_layer_dim:
            P = args.per_layer_dim
            self.inp_gate = w.linear(p + "inp_gate.weight", (P, d))
            self.proj, self.post_norm = w.linear(p + "proj.weight", (d, P)), norm("post_norm")
        scale = p + "layer_output_scale.weight"
        self.out_scale = w.vector(scale, (1,)) if w.has(scale) else None

    def forward(self, x, y, rope, cache, next_norm, per_layer=None):
        eps = self.eps
        a = self.attn(y, *rope, cache)  # (T, H D)
        out = sublayers.ffn_block(self, a, x, next_norm, eps) if self.fused else None
        if out is None:
            x, y = add_rms_norm(x, self.attn.wo(a), self.post_attn_norm, self.ffn_norm, eps)
            h = self.mlp(y)
            if self.moe is not None:
                experts = self.moe(rms_norm(x, self.pre_moe_norm, eps), rms_norm(x, self.router_norm, eps))
                h = rms_norm(h, self.post_mlp_norm, eps) + rms_norm(experts, self.post_moe_norm, eps)
            out = add_rms_norm(x, h, self.post_ffn_norm, next_norm, eps)
        if self.inp_gate is None and self.out_scale is None:
            return out
        x = out[0]
        if self.inp_gate is not None:  # per_layer (T, P): this layer's slice of the per-layer inputs
            gated = glu(torch.cat([self.inp_gate(x), per_layer], -1), "gelu")  # gelu(inp_gate(x)) * per_layer
            x = x + rms_norm(self.proj(gated), self.post_norm, eps)
        if self.out_scale is not None:
            x = x * self.out_scale
        return x, rms_norm(x, next_norm, eps)

    __call__ = forward


class Experts(MoE):
    """Gemma 4's routed experts (`moe.MoE`'s softmax gating, top k renormalized): gate and up
    in one tensor per expert (``ffn_gate_up_exps``, gate rows first) or two, each expert's
    weight times its ``ffn_down_exps.scale``, the router reading its own input. The torch path
    (`MoE.routed`) runs them: the decode kernel (`kernels.experts`) routes on the experts'
    own input and knows no per-expert scale."""

    def __init__(self, args: ModelArgs, w: Weights, i: int):
        torch.nn.Module.__init__(self)
        p, E, ff, d = f"blk.{i}.", args.num_experts, args.expert_ff, args.hidden_size
        self.act, self.k, self.scale = args.act, args.experts_used, args.expert_weights_scale
        self.after, self.biases, self.shared, self.table = False, None, None, None
        self.router = w.linear(p + "ffn_gate_inp.weight", (E, d))
        if w.has(p + "ffn_gate_up_exps.weight"):
            self.gate_up = w.experts(p + "ffn_gate_up_exps.weight", (E, 2 * ff, d))  # each (2 ff, hidden)
        else:
            gates, ups = (w.experts(p + f"ffn_{n}_exps.weight", (E, ff, d)) for n in ("gate", "up"))
            self.gate_up = [StackedLinear([g, u]) for g, u in zip(gates, ups)]
        self.down = w.experts(p + "ffn_down_exps.weight", (E, d, ff))  # each (hidden, ff)
        scale = p + "ffn_down_exps.scale"
        self.expert_scale = w.vector(scale, (E,)) if w.has(scale) else None
        if not 0 < self.k <= E:
            raise GGUFError(f"{w.g.path}: {args.architecture}.expert_used_count is {self.k}, of {E} experts")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        experts, weights = super().route(x)
        return experts, weights if self.expert_scale is None else weights * self.expert_scale[experts]

    def forward(self, x: torch.Tensor, router_x: torch.Tensor) -> torch.Tensor:
        """x (T, hidden), the experts' input, routed by router_x (T, hidden) -> (T, hidden)."""
        return self.routed(x, router_x)

    __call__ = forward


class SoftCapped(torch.nn.Module):
    """The output layer with its logits soft-capped: cap * tanh(logits / cap)."""

    def __init__(self, linear, cap: float):
        super().__init__()
        self.linear, self.cap = linear, cap

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(y) / self.cap) * self.cap

    __call__ = forward


class Model(decoder.Model):
    """The decoder (`decoder.Model`) with Gemma 4's blocks, RoPE per kind of layer, per-layer
    token embeddings and soft-capped logits."""

    def __init__(self, args: ModelArgs, w: Weights):
        torch.nn.Module.__init__(self)
        self.args = args
        d, n, P = args.hidden_size, args.num_layers, args.per_layer_dim
        self.embed = w.linear("token_embd.weight", (args.vocab_size, d))  # (vocab, hidden) blocks
        out = w.linear("output.weight", (args.vocab_size, d)) if w.has("output.weight") else self.embed
        self.output = SoftCapped(out, args.logit_softcap) if args.logit_softcap else out
        self.layers = torch.nn.ModuleList(Block(args, w, i) for i in range(n))
        self.norm = w.vector("output_norm.weight", (d,))
        self.embed_scale = args.embed_scale
        # RoPE of the sliding and the global layers: (rotated dims, base, position scale, divisors)
        factors = w.vector("rope_freqs.weight", (args.head_dim // 2,)) if w.has("rope_freqs.weight") else None
        self.ropes = {
            True: (args.rope_dim_swa, args.rope_theta_swa, 1.0, None),
            False: (args.rope_dim or args.head_dim, args.rope_theta, args.rope_scale, factors),
        }
        self.factors = {}
        if P:
            self.per_layer_embed = w.linear("per_layer_token_embd.weight", (args.vocab_size, n * P))  # stays blocks
            self.per_layer_proj = w.linear("per_layer_model_proj.weight", (n * P, d))
            self.per_layer_norm = w.vector("per_layer_proj_norm.weight", (P,))
        self.set_context_length(args.context_length)

    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> list:
        """Each layer's per-layer input (T, P) from the ids (T,) and the scaled embedding x (T, d):
        (the tokens' rows * sqrt(P) + norm(proj(x) / sqrt(d))) / sqrt(2); Nones without them."""
        a = self.args
        n, P = a.num_layers, a.per_layer_dim
        if not P:
            return [None] * n
        T = ids.shape[0]
        tokens = self.per_layer_embed.embed_rows(ids).view(T, n, P) * math.sqrt(P)
        proj = rms_norm(
            (self.per_layer_proj(x) / math.sqrt(a.hidden_size)).view(T, n, P), self.per_layer_norm, a.rms_norm_eps
        )
        return list(((proj + tokens) * 2**-0.5).transpose(0, 1).contiguous())

    def forward(self, ids, cache, logits_at=None, hidden=False):
        a = self.args
        pos = positions(cache, ids.shape[0])
        tables = {
            kind: rope_cos_sin(pos, dim, theta, scale, factors)
            for kind, (dim, theta, scale, factors) in self.ropes.items()
        }
        x = self.embed.embed_rows(ids) * self.embed_scale  # (T, hidden)
        per_layer = self.per_layer_inputs(ids, x)
        layers = list(self.layers)
        y = rms_norm(x, layers[0].attn_norm, a.rms_norm_eps)
        next_norms = [layer.attn_norm for layer in layers[1:]] + [self.norm]
        for i, (layer, c, next_norm) in enumerate(zip(layers, cache, next_norms)):
            x, y = layer(x, y, tables[a.sliding[i]], c, next_norm, per_layer[i])
        if logits_at is not None:
            if logits_at.numel() == 0:
                return None
            y = y[logits_at]
        return y if hidden else self.output(y)
