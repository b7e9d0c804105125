"""A decode row's mixture of experts in one kernel call (`tk_moe_row`): the router's softmax
and top-k, gate and up of the k routed experts over the row (`tk_gemv_parts`, the activations quantized once), their biases where
the file has them, the gated units, the k down projections each over its own expert's unit
(`tk_gemv_each`), and their weighted sum. Per expert the same arithmetic as its
`QuantLinear` alone; every row alike, alone or in a batch. The table's `plan` is what the
kernels read (`abi.MoePlan`); `sublayers.ffn_block` hands it to `tk_moe_block` with the
block's output projection and norms."""

from __future__ import annotations

import ctypes

import torch

from . import abi, build
from . import qmatmul as qm
from .sublayers import ACT_IDS

MAX_PARTS = 16  # the kernels' most parts in one call (csrc/qmatmul.cpp): gate and up of 8 experts


class ExpertTable:
    """The kernels' view of a block's router (float32) and every expert's gate, up and down
    rows (type, address, row stride), indexed by expert, for `rows`."""

    def __init__(
        self,
        router,
        gates: list,
        ups: list,
        downs: list,
        k: int,
        scale: float,
        act: str,
        biases: tuple | None = None,
    ):
        """act: the gated unit's (`sublayers.ACT_IDS`); biases: (router (E,), gate (E, ff),
        up (E, ff), down (E, hidden)) float32, or None."""
        parts = [*gates, *ups, *downs]
        self.router = router.raw if router.qtype == "F32" else None  # (experts, hidden)
        self.ok = self.router is not None and all(p.type_id >= 0 for p in parts) and 2 * k <= MAX_PARTS
        self.k = k
        self.biases = [None] * 4 if biases is None else [b.contiguous() for b in biases]
        self.ff, self.hidden = gates[0].out_features, gates[0].in_features

        def table(pairs):
            return (
                torch.tensor([[p.type_id for p in ps] for ps in pairs], dtype=torch.int32),
                torch.tensor([[p.data_ptr for p in ps] for ps in pairs], dtype=torch.int64),  # addresses
                torch.tensor([[p.row_stride for p in ps] for ps in pairs], dtype=torch.int64),
            )

        self.gate_up = table(list(zip(gates, ups)))  # each (experts, 2)
        self.down = table([[d] for d in downs])  # each (experts, 1)
        self.plan = None
        if self.ok:  # points at the router, the tables and the biases, which this object holds
            self.plan = abi.MoePlan(
                self.router.data_ptr(),
                _ptr(self.biases[0]),
                self.router.shape[0],
                self.hidden,
                k,
                self.ff,
                ACT_IDS[act],
                *(t.data_ptr() for t in (*self.gate_up, *self.down)),
                *map(_ptr, self.biases[1:]),
                scale,
            )
        self.address = None if self.plan is None else ctypes.addressof(self.plan)

    def rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """The routed experts' weighted sum for each row of x (T, hidden), a row at a time,
        within the rows the block-dot kernel takes; None where the kernels do not apply."""
        lib = qm.small_ops(x)
        if lib is None or not self.usable(x.shape[0]):
            return None
        x = x.contiguous()
        out = torch.empty_like(x)
        ids, weights = torch.empty(self.k, dtype=torch.int32), torch.empty(self.k)
        for t in range(x.shape[0]):
            args = (x[t].data_ptr(), ids.data_ptr(), weights.data_ptr(), out[t].data_ptr(), build.threads())
            if lib.tk_moe_row(self.address, *args):
                raise RuntimeError("tightkv kernel: the routed experts failed")
        return out

    def usable(self, rows: int) -> bool:
        """Whether `tk_moe_row` takes this table for a call of `rows` rows."""
        return self.plan is not None and rows <= max(1, qm.kernel_rows())


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()
