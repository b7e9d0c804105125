"""Every layer's weights of a model once, per input-row count: the block-dot kernel
against dequantized tiles + float32 matmul (`qmatmul.gemv_max_rows` is their crossover).

    python bench/gemv_crossover.py MODEL.gguf [--rows 1,8,16,24,32,48,64,96] [--threads 2]

Prints ms per input row, best of 3 calls in each of 3 alternating rounds.
"""

from __future__ import annotations

import argparse
import time

import torch

from tightkv.api import Model
from tightkv.kernels import qmatmul as qm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,8,16,24,32,48,64,96")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    m = Model(args.model, threads=args.threads)
    mods = [s for layer in m.net.layers for s in layer.modules() if isinstance(s, (qm.QuantLinear, qm.StackedLinear))]
    inner = {id(p) for s in mods if isinstance(s, qm.StackedLinear) for p in s.parts}
    mods = [s for s in mods if id(s) not in inner]  # (rows, in_features) inputs, made once
    xs: dict[tuple[int, int], torch.Tensor] = {}

    def step(rows: int) -> None:
        for s in mods:
            k = s.parts[0].in_features if isinstance(s, qm.StackedLinear) else s.in_features
            s(xs.setdefault((k, rows), torch.randn(rows, k)))

    counts = [int(r) for r in args.rows.split(",")]
    best: dict[tuple[int, str], float] = {}
    for _ in range(3):
        for rows in counts:
            for path, limit in (("kernel", 10**6), ("tiles", 0)):
                qm.GEMV_MAX_ROWS = limit
                step(rows)
                times = []
                for _ in range(3):
                    t = time.perf_counter()
                    step(rows)
                    times.append(time.perf_counter() - t)
                best[rows, path] = min(best.get((rows, path), 1e9), min(times))
    print(f"{len(mods)} weight calls per pass; ms per input row")
    print("| rows | kernel | tiles |\n|---:|---:|---:|")
    for rows in counts:
        print(f"| {rows} | {1e3 * best[rows, 'kernel'] / rows:.2f} | {1e3 * best[rows, 'tiles'] / rows:.2f} |")


if __name__ == "__main__":
    main()
