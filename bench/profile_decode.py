"""Where decode time goes: ms/token at a depth, optionally a cProfile of the decode loop.

python bench/profile_decode.py --kv progressive --depth 2048 --steps 64 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--kv", default="progressive")
    ap.add_argument("--depth", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ns = ap.parse_args()
    from tightkv.api import Model
    from tightkv.engine.generate import decode_step, prefill
    from tightkv.eval.bench import bench_tokens

    torch.set_num_threads(ns.threads)
    model = Model(ns.model, threads=ns.threads)
    vocab = model.args.vocab_size
    context = [model.tokenizer.bos_id] + bench_tokens(ns.depth - 1, vocab, 2)
    steps = bench_tokens(ns.steps + 1, vocab, 3)
    for kv in ns.kv.split(","):
        times = []
        for _ in range(ns.reps):
            cache = model.new_cache(kv)
            prefill(model.net, context, cache)
            decode_step(model.net, steps[0], cache)
            prof = cProfile.Profile() if ns.profile else None
            t = time.perf_counter()
            if prof:
                prof.enable()
            for tok in steps[1:]:
                decode_step(model.net, tok, cache)
            if prof:
                prof.disable()
            times.append((time.perf_counter() - t) / ns.steps * 1e3)
        print(
            f"{kv} d{ns.depth}: {statistics.median(times):.2f} ms/token ({1e3 / statistics.median(times):.1f} tok/s), "
            f"runs {[round(x, 2) for x in times]}"
        )
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
