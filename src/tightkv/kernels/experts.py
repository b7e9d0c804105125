"""A decode row's routed experts in two kernel calls: gate and up of all k experts over the
row (`tk_gemv_parts`, the activations quantized once), the gated unit, then the k down
projections each over its own expert's unit (`tk_gemv_each`). Per row the same arithmetic
as each expert's `QuantLinear` alone."""

from __future__ import annotations

import numpy as np
import torch

from . import build
from . import qmatmul as qm
from .sublayers import ACT_IDS

MAX_PARTS = 16  # the kernels' most parts in one call (csrc/qmatmul.cpp)


class ExpertTable:
    """The kernels' view of every expert's gate, up and down rows (type, address, row stride),
    indexed by expert, for `run`."""

    def __init__(self, gates: list, ups: list, downs: list):
        parts = [*gates, *ups, *downs]
        self.ok = all(p.type_id >= 0 for p in parts)
        self.ff, self.hidden = gates[0].out_features, gates[0].in_features

        def table(pairs):
            return (
                np.array([[p.type_id for p in ps] for ps in pairs], np.int32),
                np.array([[p.data_ptr for p in ps] for ps in pairs], np.uint64),
                np.array([[p.row_stride for p in ps] for ps in pairs], np.int64),
            )

        self.gate_up = table(list(zip(gates, ups)))  # each (experts, 2)
        self.down = table([[d] for d in downs])  # each (experts, 1)

    def run(self, x: torch.Tensor, experts: list[int], act: str, out: torch.Tensor) -> bool:
        """out[j] (hidden,) = down_e(act(gate_e x) * up_e x) for the j-th of `experts` and the
        row x (1, hidden); False (out untouched) where the kernels do not apply."""
        k = len(experts)
        lib = qm.small_ops(x)
        if lib is None or not self.ok or 2 * k > MAX_PARTS or not x.is_contiguous():
            return False
        idx = np.asarray(experts)
        types, ptrs, lds = (t[idx].reshape(-1).copy() for t in self.gate_up)
        sizes = np.full(2 * k, self.ff, np.int64)
        gu = torch.empty(1, 2 * k * self.ff)  # [gate_0 | up_0 | gate_1 | up_1 | ...]
        nth = build.threads()
        if lib.tk_gemv_parts(
            2 * k,
            types.ctypes.data,
            ptrs.ctypes.data,
            lds.ctypes.data,
            sizes.ctypes.data,
            self.hidden,
            x.data_ptr(),
            1,
            gu.data_ptr(),
            nth,
        ):
            raise RuntimeError("tightkv kernel: the experts' gate and up failed")
        h = torch.empty(k, self.ff)
        lib.tk_glu(gu.data_ptr(), k, self.ff, ACT_IDS[act], h.data_ptr())
        types, ptrs, lds = (t[idx].reshape(-1).copy() for t in self.down)
        if lib.tk_gemv_each(
            k,
            types.ctypes.data,
            ptrs.ctypes.data,
            lds.ctypes.data,
            self.hidden,
            self.ff,
            h.data_ptr(),
            out.data_ptr(),
            nth,
        ):
            raise RuntimeError("tightkv kernel: the experts' down projections failed")
        return True
