"""What a speculative verification costs, in decode steps: one forward of k rows at a depth.

    python bench/verify_cost.py [--models gemma,qwen] [--depth 3800] [--rows 2,4,8,16] [--json F]

A document of `--depth` tokens (the essays) is prefilled into the model's default cache; then
a decode step, and verifications of k rows (`engine/speculative.verify`) two ways: attention in
one kernel call that computes each row as its decode step would (the kernel's steps calls, what
speculation runs), and row by row (one attention call per row, what it ran before). The three
are timed in turn for `--reps` rounds (medians, milliseconds), so that a busy machine slows
all three alike, and the cache is trimmed back after each. Lookup
drafts pay when a verification of k rows costs well under the k decode steps its accepted
tokens replace; the ratio column says how many decode steps one verification costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import tightkv  # noqa: F401  (before torch: its OpenMP defaults, `tightkv._openmp_defaults`, as users get them)
import torch

sys.path.insert(0, str(Path(__file__).parent))
from speculative import ESSAYS, machine, model_paths


def timed(fns: list, reps: int) -> list[float]:
    """Median milliseconds of each of `fns`, called in turn for `reps` rounds (after one
    warm-up round)."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(reps + 1):
        for fn, out in zip(fns, times):
            t = time.perf_counter()
            fn()
            if r:
                out.append((time.perf_counter() - t) * 1000)
    return [statistics.median(t) for t in times]


@torch.inference_mode()
def run_model(name: str, args) -> dict:
    from tightkv import Model
    from tightkv.engine import speculative
    from tightkv.engine.generate import decode_step, prefill
    from tightkv.kv.cache import trim_to

    model = Model(str(model_paths(name)[0]), threads=2, context_length=8192)
    ids = model.tokenizer.encode(ESSAYS.read_text(encoding="utf-8")[: args.depth * 6], add_bos=True)[: args.depth]
    cache = model.new_cache()
    prefill(model.net, ids[:-1], cache)
    depth, tok = len(ids) - 1, ids[-1]
    print(f"{name}: KV {model.kv}, depth {depth}, room for {speculative.room(cache)} rows", flush=True)

    def step():
        decode_step(model.net, tok, cache)
        assert trim_to(cache, depth)

    def verify(k: int):
        def go():
            speculative.verify(model.net, ids[depth - k + 1 :] + [tok], cache)
            assert trim_to(cache, depth)

        return go

    one_call = speculative._steps_exact

    def row_by_row(k: int):
        def go():
            speculative._steps_exact = lambda layer, rows: False  # attention row by row
            try:
                verify(k)()
            finally:
                speculative._steps_exact = one_call

        return go

    row = {"depth": depth, "kv": str(model.kv), "verify": {}}
    for k in args.rows:
        step_ms, one, rowwise = timed([step, verify(k), row_by_row(k)], args.reps)
        row["verify"][k] = {
            "decode_ms": round(step_ms, 2),
            "one_call_ms": round(one, 2),
            "row_by_row_ms": round(rowwise, 2),
        }
        print(
            f"  {k:2d} rows: decode step {step_ms:6.2f} ms, one call {one:7.2f} ms ({one / step_ms:.2f} steps), "
            f"row by row {rowwise:7.2f} ms ({rowwise / step_ms:.2f} steps)",
            flush=True,
        )
    row["decode_ms"] = round(statistics.median(v["decode_ms"] for v in row["verify"].values()), 2)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma,qwen")
    ap.add_argument("--depth", type=int, default=3800)
    ap.add_argument("--rows", default="2,4,8,16")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.rows = [int(k) for k in args.rows.split(",")]
    doc = {"machine": machine(), "threads": 2, "models": {}}
    print(
        f"| model | depth | decode step ms | rows | one call ms (steps) | row by row ms (steps) |\n|---|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        m = doc["models"][name] = run_model(name, args)
        for k, v in m["verify"].items():
            d = v["decode_ms"]
            print(
                f"| {name} | {m['depth']} | {d} | {k} | {v['one_call_ms']} ({v['one_call_ms'] / d:.2f}) | "
                f"{v['row_by_row_ms']} ({v['row_by_row_ms'] / d:.2f}) |"
            )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
