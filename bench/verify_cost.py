"""What a speculative verification costs, in decode steps: one forward of k rows at a depth.

    python bench/verify_cost.py [--models gemma,qwen] [--depth 3800] [--rows 2,4,8,16] [--json F]

A document of `--depth` tokens (the essays) is prefilled into the model's default cache; then
a decode step, and verifications of k rows (`engine/speculative.verify`) two ways: attention in
one kernel call that computes each row as its decode step would (the kernel's steps calls, what
speculation runs), and row by row (one attention call per row, what it ran before). Each is
timed `--reps` times (medians, milliseconds) and the cache trimmed back after each. Lookup
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

import torch

sys.path.insert(0, str(Path(__file__).parent))
from speculative import ESSAYS, machine, model_paths


def timed(fn, reps: int) -> float:
    """Median milliseconds of `reps` calls (one warm-up call first)."""
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


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

    row = {"depth": depth, "kv": str(model.kv), "decode_ms": round(timed(step, args.reps), 2), "verify": {}}
    one_call = speculative._steps_exact
    for k in args.rows:
        one = timed(verify(k), args.reps)
        speculative._steps_exact = lambda layer, rows: False  # attention row by row
        try:
            rowwise = timed(verify(k), args.reps)
        finally:
            speculative._steps_exact = one_call
        row["verify"][k] = {"one_call_ms": round(one, 2), "row_by_row_ms": round(rowwise, 2)}
        print(
            f"  {k:2d} rows: one call {one:7.2f} ms ({one / row['decode_ms']:.2f} steps), "
            f"row by row {rowwise:7.2f} ms ({rowwise / row['decode_ms']:.2f} steps)",
            flush=True,
        )
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
            d = m["decode_ms"]
            print(
                f"| {name} | {m['depth']} | {d} | {k} | {v['one_call_ms']} ({v['one_call_ms'] / d:.2f}) | "
                f"{v['row_by_row_ms']} ({v['row_by_row_ms'] / d:.2f}) |"
            )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
