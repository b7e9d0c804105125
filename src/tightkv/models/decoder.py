"""The one decoder every family runs: the token embedding, blocks of pre-normed grouped-query
attention and a gated MLP (each added to the residual stream), the output norm and the output
head (the embedding itself where the file has no output.weight).

A family (``models/<arch>.py``) states only what differs, in its ``ModelArgs``
(`base.BaseModelArgs`): the RoPE style, base, scaling and frequency factors of each layer, the
rotated width, q/k/v biases, per-head q/k norms, norms after each sublayer, the activation, a
fused gate/up matrix, the sliding-window pattern, the embedding and attention scales. The
family module re-exports `Model`, which `base.build_model` instantiates.

For decode rows over weights kept in blocks a block is two kernel calls (`kernels.sublayers`):
the q/k/v projection through RoPE, and wo through the feed-forward half.
"""

from __future__ import annotations

import torch

from ..kernels import sublayers
from ..kv.cache import BatchLayer, positions
from .base import (
    BaseModelArgs,
    Weights,
    add_rms_norm,
    apply_rope_interleaved,
    glu,
    qkv_heads,
    rms_norm,
    rope_cos_sin,
)
from .deltanet import GatedDeltaNet
from .moe import MoE


class Attention(torch.nn.Module):
    """Grouped-query attention over a layer's cache.

    `forward` takes the block's normed rows (T, hidden) and RoPE's cos, sin (T, R/2), and
    returns the attended rows (T, H D) *before* the output projection wo: the block applies
    wo together with the feed-forward half, one kernel call for decode rows
    (`sublayers.ffn_block`). NeoX-style RoPE takes one kernel call from the projection to the
    rotated heads (`sublayers.qkv_block`, which reads wqkv, bqkv, q_norm, k_norm and the head
    counts from this object); the interleaved style (llama.cpp's "normal") runs op by op."""

    def __init__(self, args: BaseModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.sizes = [args.num_heads * args.head_dim] + [args.num_kv_heads * args.head_dim] * 2  # q, k, v widths
        fused = p + "attn_qkv.weight"  # one matrix where the file fuses q, k and v (Phi-3)
        self.wqkv = w.linear(fused) if w.has(fused) else w.stacked([p + f"attn_{n}.weight" for n in "qkv"])
        self.bqkv = torch.cat([w.vector(p + f"attn_{n}.bias") for n in "qkv"]) if args.qkv_bias else None
        self.q_norm = w.vector(p + "attn_q_norm.weight") if args.qk_norm else None  # (head_dim,)
        self.k_norm = w.vector(p + "attn_k_norm.weight") if args.qk_norm else None  # (head_dim,)
        self.wo = w.linear(p + "attn_output.weight")
        if w.has(p + "attn_output.bias"):  # (gpt-oss, some Mistral 3)
            self.wo = Biased(self.wo, w.vector(p + "attn_output.bias", (args.hidden_size,)))
        self.sinks = w.vector(p + "attn_sinks.weight", (args.num_heads,)) if args.attention_sinks else None
        self.temperature = args.attn_temperature
        self.eps, self.scale = args.rms_norm_eps, args.attention_scale
        self.interleaved = args.rope_style == "interleaved"
        self.gated = args.gated_attention
        if self.gated:  # attn_q's rows: per head, its query then its output gate
            self.sizes[0] *= 2

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache) -> torch.Tensor:
        T = x.shape[0]
        if self.gated:
            return self._gated(x, cos, sin, cache)
        q, k, v = self._heads_interleaved(x, cos, sin) if self.interleaved else self._heads_neox(x, cos, sin)
        if self.temperature is not None:
            q = q * temperature(self.temperature, cache, T)[:, None]
        out = cache.attend(q, k, v, self.scale, self.sinks)  # (H, T, D)
        return out.transpose(0, 1).reshape(T, self.num_heads * self.head_dim)  # before wo

    def _gated(self, x, cos, sin, cache) -> torch.Tensor:
        """Qwen3.5's gated attention: the attended rows times sigmoid(gate), before wo."""
        T, H, D = x.shape[0], self.num_heads, self.head_dim
        qg, k, v = self.wqkv(x).split(self.sizes, dim=-1)
        q, gate = qg.reshape(T, H, 2, D).unbind(2)  # (T, H, D) each
        q = torch.cat([q.reshape(T, H * D), k, v], dim=-1)
        q, k, v = qkv_heads(q, H, self.num_kv_heads, D, cos, sin, self.q_norm, self.k_norm, self.eps)
        out = cache.attend(q, k, v, self.scale).transpose(0, 1).reshape(T, H * D)
        return out * torch.sigmoid(gate.reshape(T, H * D))

    __call__ = forward  # no hooks on the hot path (nn.Module's call machinery)

    def _heads_neox(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (H, T, D), k and v (Hkv, T, D): projected, biased, normed per head, NeoX-rotated."""
        out = sublayers.qkv_block(self, x, cos, sin, self.eps)
        if out is not None:
            return out
        qkv = self.wqkv(x) if self.bqkv is None else self.wqkv(x) + self.bqkv  # (T, (H + 2 Hkv) D)
        return qkv_heads(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim, cos, sin, self.q_norm, self.k_norm, self.eps
        )

    def _heads_interleaved(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same with adjacent pairs (2i, 2i + 1) rotated."""
        T, D = x.shape[0], self.head_dim
        qkv = self.wqkv(x) if self.bqkv is None else self.wqkv(x) + self.bqkv
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = q.view(T, self.num_heads, D).transpose(0, 1)  # (H, T, D)
        k = k.view(T, self.num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D)
        v = v.view(T, self.num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        return apply_rope_interleaved(q, cos, sin), apply_rope_interleaved(k, cos, sin), v


def temperature(params: tuple[float, int], cache, T: int) -> torch.Tensor:
    """Llama 4's and Mistral 3's query scale by position, (T,): 1 + a log(floor(pos / n) + 1)
    for the rows' positions (each sequence's in a batch), params (a, n)."""
    if isinstance(cache, BatchLayer):
        pos = torch.cat([torch.arange(c.offset, c.offset + n) for c, n in zip(cache.layers, cache.rows)])
    else:
        pos = torch.arange(cache.offset, cache.offset + T)
    a, n = params
    return 1 + a * torch.log(torch.floor(pos.double() / n) + 1).float()


class Biased(torch.nn.Module):
    """A linear layer plus its bias vector (out,)."""

    def __init__(self, linear, bias: torch.Tensor):
        super().__init__()
        self.linear, self.bias = linear, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.bias

    __call__ = forward


class MLP(torch.nn.Module):
    """down(act(gate(x)) * up(x)), gate and up in one kernel call: stacked, or the one ffn_up
    matrix of gate rows then up rows where the family fuses them (Phi-3)."""

    def __init__(self, args: BaseModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.act = args.act
        if args.fused_gate_up:
            self.gate_up = w.linear(p + "ffn_up.weight")  # (2 ff, hidden): gate rows, then up rows
        else:
            self.gate_up = w.stacked([p + "ffn_gate.weight", p + "ffn_up.weight"])  # (2 ff, hidden)
        self.down = w.linear(p + "ffn_down.weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(glu(self.gate_up(x), self.act))

    __call__ = forward


class Block(torch.nn.Module):
    """x + attn(attn_norm(x)), then + mlp(ffn_norm(x)); with post norms (Gemma) each sublayer's
    output is normed before it is added. In a hybrid model `attn` is linear attention on a
    recurrent layer (`deltanet.GatedDeltaNet`), and `mlp` a mixture of experts where the
    file has experts (`moe.MoE`).

    `forward` takes the stream x (T, hidden) and its attn_norm already applied (y), and returns
    the new stream and its next_norm (the next block's attn_norm, or the output norm), so each
    residual add and the norm after it are one kernel call (`add_rms_norm`); for decode rows wo
    through the feed-forward half are one (`sublayers.ffn_block`, which reads attn.wo, mlp,
    post_attn_norm, ffn_norm and post_ffn_norm from this object)."""

    def __init__(self, args: BaseModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.eps = args.rms_norm_eps
        self.attn = GatedDeltaNet(args, w, i) if args.recurrent(i) else Attention(args, w, i)
        self.mlp = MoE(args, w, i) if args.num_experts else MLP(args, w, i)
        # wo through the feed-forward half (dense or routed experts) in one kernel call
        self.fused = not isinstance(self.attn.wo, Biased)
        self.attn_norm = w.vector(p + "attn_norm.weight")  # (hidden,)
        self.ffn_norm = w.vector(p + args.ffn_norm + ".weight")  # (hidden,)
        self.post_attn_norm = w.vector(p + "post_attention_norm.weight") if args.post_norms else None
        self.post_ffn_norm = w.vector(p + "post_ffw_norm.weight") if args.post_norms else None

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache, next_norm: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.attn(y, *rope, cache)  # (T, H D)
        out = sublayers.ffn_block(self, a, x, next_norm, self.eps) if self.fused else None
        if out is not None:
            return out
        x, y = add_rms_norm(x, self.attn.wo(a), self.post_attn_norm, self.ffn_norm, self.eps)
        return add_rms_norm(x, self.mlp(y), self.post_ffn_norm, next_norm, self.eps)

    __call__ = forward


class Model(torch.nn.Module):
    """A decoder-only text model over quantized GGUF weights, for every family."""

    def __init__(self, args: BaseModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.embed = w.linear("token_embd.weight")  # (vocab, hidden) blocks
        self.output = w.linear("output.weight") if w.has("output.weight") else self.embed
        self.layers = torch.nn.ModuleList(Block(args, w, i) for i in range(args.num_layers))
        self.norm = w.vector("output_norm.weight")
        self.embed_scale = args.embed_scale
        self.rope_dim = args.rope_dim or args.head_dim  # rotated dims of each head
        rope = [args.rope(i) for i in range(args.num_layers)]  # (theta, position scale) per layer
        self.ropes = list(dict.fromkeys(rope))  # the distinct ones: cos/sin made once per forward each
        self.layer_rope = [self.ropes.index(r) for r in rope]
        # RoPE frequency divisors (rope_dim/2,) by kind, where the file has them
        self.factors = {kind: w.vector(name) for kind, name in args.rope_factor_tensors.items() if w.has(name)}
        self.set_context_length(args.context_length)

    def set_context_length(self, n: int) -> None:
        """Pick RoPE's frequency divisors for a context of n tokens, as the family does (Phi-3's
        LongRoPE: the long ones beyond the original context, as llama.cpp decides from its
        context size). Once per cache, never between its tokens: call before filling one."""
        self.rope_factors = self.factors.get(self.args.rope_factors(n))

    def cache_layout(self) -> list[tuple[int, int, int, int | None]]:
        return self.args.cache_layout()

    def forward(
        self, ids: torch.Tensor, cache: list, logits_at: torch.Tensor | None = None, hidden: bool = False
    ) -> torch.Tensor | None:
        """Run ids (T,) at positions cache.offset.. (a batch: one row per sequence); logits
        (len(logits_at), vocab) for the chosen row indices (all rows if None), or None when
        logits_at is empty. With hidden=True, the final-normed hidden states (rows, hidden_size)
        instead: `self.output` turns them into logits."""
        a = self.args
        pos = positions(cache, ids.shape[0])
        tables = [
            rope_cos_sin(pos, self.rope_dim, *r, self.rope_factors, a.rope_attn_factor, a.rope_yarn) for r in self.ropes
        ]
        x = self.embed.embed_rows(ids)  # (T, hidden)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        layers = list(self.layers)  # (slicing a ModuleList builds a new one every step)
        y = rms_norm(x, layers[0].attn_norm, a.rms_norm_eps)
        next_norms = [layer.attn_norm for layer in layers[1:]] + [self.norm]
        for layer, r, c, next_norm in zip(layers, self.layer_rope, cache, next_norms):
            x, y = layer(x, y, tables[r], c, next_norm)
        if logits_at is not None:  # y (T, hidden): the output-normed rows
            if logits_at.numel() == 0:
                return None
            y = y[logits_at]
        return y if hidden else self.output(y)
