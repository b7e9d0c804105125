"""One prefill chunk of N tokens into a fresh cache, per N: as the engine runs it
(`engine.generate.run_chunk`, torch's ops on one thread up to `qmatmul.kernel_rows()`
rows) against the same forward with torch on all its threads.

    python bench/prefill_chunks.py MODEL [--rows 8,16,32,40,64,128] [--threads 2] [--kv KV]

Prints ms per chunk and per token, best of 3 alternating rounds.
"""

from __future__ import annotations

import argparse
import time

import torch

from tightkv.api import Model
from tightkv.engine.generate import run_chunk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rows", default="8,16,32,40,64,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default=None, help="cache type (default: the model's)")
    args = ap.parse_args()
    m = Model(args.model, threads=args.threads, **({"kv": args.kv} if args.kv else {}))
    text = "Write a short story about a lighthouse keeper who keeps a logbook of every ship. " * 40
    ids = m.tokenize(text)
    counts = [int(r) for r in args.rows.split(",")]

    def engine(n: int) -> None:
        run_chunk(m.net, ids[:n], m.new_cache(), last=True)

    def all_threads(n: int) -> None:
        with torch.inference_mode():
            m.net(torch.tensor(ids[:n]), m.new_cache(), logits_at=torch.tensor([n - 1]))

    best: dict[tuple[int, str], float] = {}
    for _ in range(3):
        for n in counts:
            for name, fn in (("engine", engine), ("torch threads", all_threads)):
                t = time.perf_counter()
                fn(n)
                dt = time.perf_counter() - t
                best[n, name] = min(best.get((n, name), dt), dt)
    print(f"{m.kv} cache, {args.threads} threads; ms per chunk (ms per token)")
    print("| tokens | engine | torch on all threads |")
    print("|---:|---:|---:|")
    for n in counts:
        e, a = best[n, "engine"], best[n, "torch threads"]
        print(f"| {n} | {e * 1e3:.0f} ({e * 1e3 / n:.2f}) | {a * 1e3:.0f} ({a * 1e3 / n:.2f}) |")


if __name__ == "__main__":
    main()
