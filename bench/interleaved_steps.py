"""Decode step time per cache type, the types taking turns step by step in one process.

    python bench/interleaved_steps.py [--model PATH] [--compare f16,kvarn4,progressive] [--depth 16]
                                      [--steps 100] [--rounds 2] [--threads 2] [--json FILE]

What a cache type costs beside another at short context is a few percent of a step, below
what separate runs on a shared box can tell apart (`tightkv bench` rows move 10-20% between
rounds). Here every type's cache is filled to the same depth, then each step runs one token
on each type in turn, so a slow spell of the machine falls on all of them alike; the table
gives each type's median step and its ratio to the first type's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from tightkv import Model
from tightkv.engine.generate import decode_step, prefill
from tightkv.errors import TightKVError
from tightkv.eval.bench import bench_tokens, write_json
from tightkv.kernels import build
from tightkv.kv.spec import parse_kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3:270m", help="registry name or GGUF path (default: the embedded Gemma)")
    ap.add_argument("--compare", default="f16,kvarn4,progressive", help="KV types, the first the baseline")
    ap.add_argument("--depth", type=int, default=16, help="tokens in the cache before the timed steps")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per round and type")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each from a fresh fill")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    kinds = args.compare.split(",")
    for k in kinds:
        parse_kv(k)  # an unknown type fails here, before the model loads
    model = Model(args.model, threads=args.threads)
    torch.set_num_threads(args.threads)
    vocab = model.args.vocab_size
    context = [model.tokenizer.bos_id] + bench_tokens(args.depth - 1, vocab, 2)
    tokens = bench_tokens(args.steps + 1, vocab, 3)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        caches = {k: model.new_cache(k) for k in kinds}
        for k in kinds:
            prefill(model.net, context, caches[k])
            decode_step(model.net, tokens[0], caches[k])  # warm the decode path
        for tok in tokens[1:]:
            for k in kinds:
                t = time.perf_counter()
                decode_step(model.net, tok, caches[k])
                times[k].append(time.perf_counter() - t)
    base = statistics.median(times[kinds[0]])
    rows = [
        {
            "kv": k,
            "median_step_ms": round(statistics.median(v) * 1e3, 3),
            "mean_step_ms": round(statistics.mean(v) * 1e3, 3),
            "vs_first": round(statistics.median(v) / base, 4),
        }
        for k, v in times.items()
    ]
    print(
        f"{model.path.name}, depth {args.depth}, {args.steps} steps x {args.rounds} rounds, "
        f"{args.threads} threads, {build.status()}"
    )
    print("| kv | median step ms | mean step ms | vs " + kinds[0] + " |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kv']} | {r['median_step_ms']:.2f} | {r['mean_step_ms']:.2f} | {r['vs_first']:.3f}x |")
    if args.json:
        write_json(
            args.json,
            "bench/interleaved_steps.py",
            model=model.path.name,
            depth=args.depth,
            steps=args.steps,
            rounds=args.rounds,
            threads=args.threads,
            rows=rows,
        )


if __name__ == "__main__":
    try:
        main()
    except TightKVError as err:  # a bad model name or cache type: one line, exit 1
        sys.exit(f"error: {err}")
