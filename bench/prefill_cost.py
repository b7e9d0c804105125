"""The cost of filling a context into a compressed KV cache, against f16.

    python bench/prefill_cost.py                       # Gemma 3 270M, 8,192 tokens
    python bench/prefill_cost.py MODEL.gguf -n 4096    # any model, any length

Prefills the same token ids into each cache type (after a short warm-up) and
prints tokens/s and the time relative to the first type.
"""
from __future__ import annotations

import argparse
import time

from tightkv import Model
from tightkv.engine.generate import prefill
from tightkv.eval.bench import bench_tokens, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="gemma3:270m")
    ap.add_argument("-n", "--tokens", type=int, default=8192, help="tokens to prefill")
    ap.add_argument("--compare", default="f16,progressive", help="cache types; the first is the baseline")
    ap.add_argument("--threads", type=int, default=2)
    ns = ap.parse_args()
    m = Model(ns.model, threads=ns.threads, context_length=max(ns.tokens + 64, 4096))
    ids = bench_tokens(ns.tokens, m.args.vocab_size, 2)
    base = None
    for kv in ns.compare.split(","):
        prefill(m.net, ids[:64], m.new_cache(kv))  # warm-up
        cache = m.new_cache(kv)
        t = time.perf_counter()
        prefill(m.net, ids, cache)
        dt = time.perf_counter() - t
        base = base or dt
        print(f"{kv}: prefill {ns.tokens}: {ns.tokens / dt:.1f} tok/s, {dt / base:.2f}x the {ns.compare.split(',')[0]} time",
              flush=True)
    mach = machine()
    print(f"{ns.model}, {ns.threads} threads; {mach['cpu']}, kernels {mach['kernels']}")


if __name__ == "__main__":
    main()
