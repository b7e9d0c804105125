"""What a speculative verification of k rows costs, in decode steps (#55).

    python bench/verify_cost.py [MODEL ...] [--kv kvarn4] [--depth 3800] [--rows 2,4,8] [--reps 15] [--json F]

After a context of `--depth` tokens, times a one-token decode step and a verification of
k rows (`engine.speculative.verify`: the pending token and k - 1 drafted ones in one forward)
two ways: attention in one kernel call per layer (what verification does), and row by row
(each row appended and attended as a decode step, what it did before the kernel summed a
call of few positions row by row). The cache is trimmed back after each run; medians of
`--reps`. A draft of k tokens pays when about k x acceptance exceeds the verification's
cost in steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tightkv import Model
from tightkv.engine import speculative
from tightkv.engine.generate import decode_step, prefill
from tightkv.eval.bench import bench_tokens, write_json
from tightkv.kv.cache import trim_to


def median_ms(run, cache, depth: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
        trim_to(cache, depth)
    return statistics.median(times) * 1e3


def measure(name: str | None, kv: str, depth: int, rows: list[int], reps: int) -> dict:
    model = Model(name, threads=2)
    vocab = model.args.vocab_size
    cache = model.new_cache(kv)
    prefill(model.net, [model.tokenizer.bos_id] + bench_tokens(depth - 1, vocab, 2), cache)
    tokens = bench_tokens(max(rows), vocab, 3)
    if speculative.room(cache) < max(rows):
        raise SystemExit(f"the cache takes only {speculative.room(cache)} rows here: pick another --depth")
    step = median_ms(lambda: decode_step(model.net, tokens[0], cache), cache, depth, reps)
    label = Path(name).name if name else "gemma3:270m"  # a registry name as typed, a file by its name
    out = {"model": label, "kv": kv, "depth": depth, "step_ms": round(step, 2), "rows": {}}
    one_call = speculative._one_call
    for k in rows:
        verify = lambda: speculative.verify(model.net, tokens[:k], cache)  # noqa: E731
        together = median_ms(verify, cache, depth, reps)
        speculative._one_call = lambda *a: False  # every layer row by row
        try:
            apart = median_ms(verify, cache, depth, reps)
        finally:
            speculative._one_call = one_call
        out["rows"][k] = {"one_call_ms": round(together, 2), "row_by_row_ms": round(apart, 2)}
        print(
            f"{label} {kv} d{depth}: step {step:.2f} ms; {k} rows {together:.2f} ms in one call "
            f"({together / step:.2f} steps), {apart:.2f} ms row by row ({apart / step:.2f} steps)",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=[None], help="GGUF paths or names (default: the embedded model)")
    ap.add_argument("--kv", default="kvarn4")
    ap.add_argument("--depth", type=int, default=3800)
    ap.add_argument("--rows", default="2,4,8")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    runs = [measure(m, args.kv, args.depth, rows, args.reps) for m in args.models]
    print("| model | kv | depth | step ms | rows | one call ms (steps) | row by row ms (steps) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in runs:
        for k, v in r["rows"].items():
            s = r["step_ms"]
            print(
                f"| {r['model']} | {r['kv']} | {r['depth']} | {s} | {k} | {v['one_call_ms']} ({v['one_call_ms'] / s:.2f}) "
                f"| {v['row_by_row_ms']} ({v['row_by_row_ms'] / s:.2f}) |"
            )
    if args.json:
        write_json(args.json, "bench/verify_cost.py", threads=2, runs=runs)


if __name__ == "__main__":
    main()
