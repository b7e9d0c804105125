"""The mixture-of-experts feed-forward (Qwen3-MoE, Qwen3.5/3.6-MoE, gpt-oss), as llama.cpp
runs it (`build_moe_ffn`, softmax gating):

    probs = softmax(router(x))                       # (T, experts)
    w, e = top-k of probs; w /= sum(w)               # (T, k): the routed experts and weights
    out = sum_j w_j * down_e(silu(gate_e(x)) * up_e(x))
        + sigmoid(x . shared_gate) * shared(x)       # the shared expert, where there is one

gpt-oss gates as llama.cpp's "softmax_weight" (the softmax of the top k of the router's
logits), which is this; it has biases on the router and on each expert's gate, up and down
rows, and its clamped SwiGLU (``act = "swiglu_oai"``).

The experts stay blocks in the memory map: each is a `QuantLinear` over its rows of the
3-D expert tensors (`base.Weights.experts`), so a decode step reads the routed experts'
rows and no others, in one kernel call (`kernels.experts.ExpertTable`: the router, gate and
up of all k, the k down projections, their sum). A prompt chunk is grouped by expert:
each expert runs once over the rows routed to it.
"""

from __future__ import annotations

import torch

from ..errors import GGUFError
from ..kernels.experts import ExpertTable
from ..kernels.qmatmul import StackedLinear, kernel_rows
from .base import BaseModelArgs, Weights, glu


class MoE(torch.nn.Module):
    """A block's routed experts and its shared expert (where the file has one)."""

    def __init__(self, args: BaseModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.act, self.k, self.scale = args.act, args.experts_used, args.expert_weights_scale
        E, ff, d = args.num_experts, args.expert_ff, args.hidden_size
        self.router = w.linear(p + "ffn_gate_inp.weight", (E, d))
        gates, ups = (w.experts(p + f"ffn_{n}_exps.weight", (E, ff, d)) for n in ("gate", "up"))
        self.gate_up = [StackedLinear([g, u]) for g, u in zip(gates, ups)]  # each (2 ff, hidden)
        self.down = w.experts(p + "ffn_down_exps.weight", (E, d, ff))  # each (hidden, ff)
        self.biases = None  # router (E,), gate and up as one (E, 2 ff), down (E, hidden)
        if w.has(p + "ffn_gate_inp.bias"):
            shapes = {"gate_inp": (E,), "gate_exps": (E, ff), "up_exps": (E, ff), "down_exps": (E, d)}
            b = {n: w.vector(p + f"ffn_{n}.bias", shape) for n, shape in shapes.items()}
            self.biases = (b["gate_inp"], torch.cat([b["gate_exps"], b["up_exps"]], 1), b["down_exps"])
        table_biases = None if self.biases is None else (b["gate_inp"], b["gate_exps"], b["up_exps"], b["down_exps"])
        self.table = ExpertTable(self.router, gates, ups, self.down, self.k, self.scale, self.act, table_biases)
        if not 0 < self.k <= len(self.down):
            raise GGUFError(
                f"{w.g.path}: {args.architecture}.expert_used_count is {self.k}, of {len(self.down)} experts"
            )
        self.shared = None
        if w.has(p + "ffn_up_shexp.weight"):
            self.shared = w.stacked([p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"])  # (2 ff, hidden)
            self.shared_down = w.linear(p + "ffn_down_shexp.weight")
            self.shared_gate = w.vector(p + "ffn_gate_inp_shexp.weight").reshape(-1)  # (hidden,)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts (T, k) each row goes to and their weights (T, k)."""
        logits = rowwise(self.router, x)  # (T, experts)
        if self.biases is not None:
            logits = logits + self.biases[0]
        weights, experts = torch.softmax(logits, dim=-1).topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        if self.scale not in (0.0, 1.0):
            weights = weights * self.scale
        return experts, weights

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e over rows x (n, hidden) -> (n, hidden)."""
        if self.biases is None:
            return self.down[e](glu(self.gate_up[e](x), self.act))
        return self.down[e](glu(self.gate_up[e](x) + self.biases[1][e], self.act)) + self.biases[2][e]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, hidden) -> (T, hidden)."""
        out = self.table.rows(x)  # decode rows: a kernel call each
        if out is None:
            out = self.routed(x)
        if self.shared is not None:
            gate = torch.sigmoid((x * self.shared_gate).sum(-1, keepdim=True))  # (T, 1), each row's sum alike
            out = out + gate * self.shared_down(glu(self.shared(x), self.act))
        return out

    __call__ = forward

    def routed(self, x: torch.Tensor, router_x: torch.Tensor | None = None) -> torch.Tensor:
        """The routed experts' weighted sum (T, hidden), grouped by expert: each routed
        expert runs once over its rows (gathered, then its weighted output added back into
        theirs: a row's sum in expert order); router_x (T, hidden): what the router reads
        where that is not x (Gemma 4)."""
        experts, weights = self.route(x if router_x is None else router_x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs, grouped by expert
        tokens, w = order // self.k, weights.reshape(-1)[order, None]  # (T k,), (T k, 1)
        out, start = torch.zeros_like(x), 0
        for e, n in enumerate(torch.bincount(flat, minlength=len(self.down)).tolist()):
            if n:
                rows = tokens[start : start + n]
                out.index_add_(0, rows, self.expert(e, x[rows]).mul_(w[start : start + n]))
            start += n
        return out


def rowwise(linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) for a float32 matrix (the router), each row's sums alike however many rows
    come along, up to the rows the block-dot kernel takes (a decode batch or a chunk beside
    it: a row then computes what it computes alone, as the kernels' rows do); torch's matmul,
    whose sums depend on the rows, above."""
    if linear.qtype != "F32" or x.shape[0] > max(1, kernel_rows()):
        return linear(x)
    return (x[:, None, :] * linear.raw).sum(-1)  # (T, out)
