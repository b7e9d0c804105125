"""A block's sublayers in one kernel call each, for decode rows.

Between attention calls a decoder block is a chain of small steps: the output projection,
the residual add and norm, gate and up, the gated unit, down, the next add and norm; and
before attention, the q/k/v projection, its bias, per-head norms and RoPE. Run op by op
from Python, a decode step of a 24-layer model makes some 300 calls, and each finds its
caches cold after the weights streamed through: on a 2-core AVX2 EPYC that was a quarter
of a Qwen2.5 0.5B step. `ffn_block` (dense or routed experts) and `qkv_block` run each chain in one call of the
same kernels in the same order, so the numbers are the ones the steps give one by one
(tested). They apply to rows that take the block-dot kernel (`qmatmul.gemv_max_rows`)
and weights kept as blocks; elsewhere they return None and the caller runs the steps.
"""

from __future__ import annotations

import ctypes

import torch

from . import abi, build
from . import qmatmul as qm

ACT_IDS = {"silu": 0, "gelu": 1, "swiglu_oai": 2}  # the kernels' act argument (`tk_glu`)


def _product(linear) -> abi.Product | None:
    """A QuantLinear or StackedLinear as the kernels' product (`abi.Product`: up to three
    parts over one input); None where a part is not in blocks."""
    parts = getattr(linear, "parts", [linear])
    if not 1 <= len(parts) <= 3 or any(getattr(p, "type_id", -1) < 0 for p in parts):
        return None
    return abi.Product(len(parts), linear.nbytes, (abi.Part * 3)(*[p.kernel_part() for p in parts]))


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _floats(vectors) -> bool:
    """Whether every given vector (None: absent) is float32 and contiguous, as the kernels read it."""
    return all(t is None or (t.dtype == torch.float32 and t.is_contiguous()) for t in vectors)


def _usable(lib, x: torch.Tensor) -> bool:
    return (
        lib is not None
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.is_contiguous()
        and x.shape[0] <= qm.gemv_max_rows(lib)
    )


class FfnPlan:
    """The output projection wo and the feed-forward half of a block, as `tk_ffn_block` takes
    them, or as `tk_moe_block` takes them where the feed-forward half is routed experts (an
    `ExpertTable` as `mlp.table`, and no shared expert): `plan`, an `abi.FfnPlan` (None where
    the kernels do not apply; for experts its gate_up and down are empty), `experts` (the
    table, or None) and the plan's address (built once; holds the norms it points at)."""

    def __init__(self, wo, mlp, post_attn_norm, ffn_norm, post_ffn_norm, act: str):
        self.norms = (post_attn_norm, ffn_norm, post_ffn_norm)  # kept alive: the plan points at them
        table = getattr(mlp, "table", None)
        self.experts = table if table is not None and table.plan is not None and mlp.shared is None else None
        if table is not None:
            products = [_product(wo), abi.Product(), abi.Product()] if self.experts else [None]
            self.d, self.ff = wo.out_features, table.ff
        else:
            products = [_product(m) for m in (wo, mlp.gate_up, mlp.down)]
            self.d, self.ff = wo.out_features, mlp.down.in_features
        self.plan = (
            None
            if None in products or not _floats(self.norms)
            else abi.FfnPlan(self.d, self.ff, ACT_IDS[act], wo.in_features, *map(_ptr, self.norms), *products)
        )
        self.address = None if self.plan is None else ctypes.addressof(self.plan)


def ffn_block(
    block, a: torch.Tensor, x: torch.Tensor, next_norm: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A decoder block's output projection and feed-forward half (dense, or routed experts):
    from the attention's rows a (T, width) and the residual stream x (T, d), the new stream
    and its next_norm (T, d) each, as `models.decoder.Block` computes them op by op; None
    where the kernels do not apply.

    block: attn.wo, mlp (gate_up, down, act; or an MoE's table), ffn_norm, and post_attn_norm /
    post_ffn_norm (None where absent); its `FfnPlan` is built on first use and kept on it (the
    plan points at its weights and norms, and goes with them)."""
    plan = block.__dict__.get("_ffn_plan")
    if plan is None:
        m = block.mlp
        plan = block.__dict__["_ffn_plan"] = FfnPlan(
            block.attn.wo, m, block.post_attn_norm, block.ffn_norm, block.post_ffn_norm, m.act
        )
    lib = build.library() if plan.plan is not None and qm.get_backend() == "fast" else None
    if not _usable(lib, a) or not x.is_contiguous() or next_norm.dtype != torch.float32:
        return None
    T = a.shape[0]
    if plan.experts is not None and not plan.experts.usable(T):
        return None
    xo, y = torch.empty(T, plan.d), torch.empty(T, plan.d)
    head = (plan.address,) if plan.experts is None else (plan.address, plan.experts.address)
    rc = (lib.tk_ffn_block if plan.experts is None else lib.tk_moe_block)(
        *head,
        a.data_ptr(),
        x.data_ptr(),
        T,
        eps,
        next_norm.data_ptr(),
        xo.data_ptr(),
        y.data_ptr(),
        build.threads(),
        qm.PARALLEL_MIN_BYTES,
    )
    if rc:
        raise RuntimeError("tightkv kernel: the feed-forward sublayer failed")
    return xo, y


class QkvPlan:
    """A q/k/v projection (one stacked linear), its bias and per-head norms, as `tk_qkv_block`
    takes them: `plan`, an `abi.QkvPlan` (None where the kernel does not apply), and its address."""

    def __init__(self, wqkv, heads: int, kv_heads: int, head_dim: int, bias=None, q_norm=None, k_norm=None):
        self.vectors = (bias, q_norm, k_norm)  # kept alive: the plan points at them
        product = _product(wqkv)
        self.shape = (heads, kv_heads, head_dim)
        self.plan = (
            None
            if product is None or not _floats(self.vectors) or head_dim > 512
            else abi.QkvPlan(heads, kv_heads, head_dim, wqkv.in_features, *map(_ptr, self.vectors), product)
        )
        self.address = None if self.plan is None else ctypes.addressof(self.plan)


def qkv_block(
    attn, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """An attention's q (H, T, D), k and v (Hkv, T, D) from the normed rows y (T, hidden), as
    `models.base.qkv_heads` gives them from the projection; None where the kernel does not apply.

    attn: wqkv, bqkv, q_norm, k_norm (None where absent), num_heads, num_kv_heads, head_dim;
    its `QkvPlan` is built on first use and kept on it."""
    plan = attn.__dict__.get("_qkv_plan")
    if plan is None:
        plan = attn.__dict__["_qkv_plan"] = QkvPlan(
            attn.wqkv, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.bqkv, attn.q_norm, attn.k_norm
        )
    lib = build.library() if plan.plan is not None and qm.get_backend() == "fast" else None
    if not _usable(lib, y):
        return None
    H, Hkv, D = plan.shape
    T = y.shape[0]
    cos, sin = cos.contiguous(), sin.contiguous()
    q, k, v = torch.empty(H, T, D), torch.empty(Hkv, T, D), torch.empty(Hkv, T, D)
    if lib.tk_qkv_block(
        plan.address,
        y.data_ptr(),
        T,
        eps,
        cos.data_ptr(),
        sin.data_ptr(),
        2 * cos.shape[-1],
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        build.threads(),
        qm.PARALLEL_MIN_BYTES,
    ):
        raise RuntimeError("tightkv kernel: the q/k/v sublayer failed")
    return q, k, v
