"""The cost of filling a context into a compressed KV cache, against f16.

    python bench/prefill_cost.py                       # Gemma 3 270M, 8,192 tokens
    python bench/prefill_cost.py MODEL.gguf -n 4096    # any model, any length
    python bench/prefill_cost.py --compare f16,kvarn4,tq3 --rounds 2 --json docs/bench/prefill_cost.json

Prefills the same token ids into each cache type (after a short warm-up), the
types taking turns round by round, and prints a table of tokens/s and the time
relative to the first type (medians over the rounds). The issue's bar: at most
1.3x the f16 time at 8K tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tightkv import Model
from tightkv.errors import TightKVError
from tightkv.kv.spec import parse_kv
from tightkv.engine.generate import prefill
from tightkv.eval.bench import bench_tokens, machine, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="gemma3:270m")
    ap.add_argument("-n", "--tokens", type=int, default=8192, help="tokens to prefill")
    ap.add_argument("--compare", default="f16,progressive", help="cache types; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, the types taking turns in each")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="FILE")
    ns = ap.parse_args()
    kinds = ns.compare.split(",")
    for kv in kinds:
        parse_kv(kv)  # a bad type stops here, before any prefill
    m = Model(ns.model, threads=ns.threads, context_length=max(ns.tokens + 64, 4096))
    ids = bench_tokens(ns.tokens, m.args.vocab_size, 2)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(ns.rounds):
        for kv in kinds:
            prefill(m.net, ids[:64], m.new_cache(kv))  # warm-up
            cache = m.new_cache(kv)
            t = time.perf_counter()
            prefill(m.net, ids, cache)
            times[kv].append(time.perf_counter() - t)
            print(f"round {r + 1}: {kv}: {ns.tokens / times[kv][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    base = statistics.median(times[kinds[0]])
    rows = [
        {
            "kv": k,
            "tok_s": round(ns.tokens / statistics.median(v), 1),
            "seconds": [round(x, 2) for x in v],
            "vs_first": round(statistics.median(v) / base, 3),
        }
        for k, v in times.items()
    ]
    mach = machine()
    print(
        f"{ns.model}, prefill of {ns.tokens} tokens, {ns.threads} threads, medians of {ns.rounds}; "
        f"{mach['cpu']}, kernels {mach['kernels']}"
    )
    print(f"| kv | tok/s | time vs {kinds[0]} |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['kv']} | {row['tok_s']:.1f} | {row['vs_first']:.2f}x |")
    if ns.json:
        write_json(
            ns.json,
            "bench/prefill_cost.py",
            model=ns.model,
            tokens=ns.tokens,
            rounds=ns.rounds,
            threads=ns.threads,
            rows=rows,
        )


if __name__ == "__main__":
    try:
        main()
    except TightKVError as err:  # a bad model name or cache type: one line, exit 1
        sys.exit(f"error: {err}")
