"""How a decode step's time splits between the C kernels and the Python/torch between them.

    python bench/step_overhead.py [--model PATH] [--kv f16] [--threads 1] [--streams 1] [--steps 30] [--rounds 3]
                                  [--depth 16] [--rows 1]

Wraps each kernel entry point the model calls with a timer, runs decode steps at
depth `--depth` (16 tokens; more: that many tokens of the essays) (with --streams N, batched
steps of N sequences, as the server runs them; with --rows K, speculative verifications of K
rows, `engine/speculative.verify`, the cache trimmed back after each), and prints per round: the
step, the time inside the kernel calls, the rest (Python, torch ops, caches gone cold after the
weights streamed through), and each entry point's share with its calls per step. With
--per-call NAME it also prints entry point NAME's mean time at each of its calls within a step
(for tk_attn: each layer's attention, so a model's global layers stand apart from its windows).
"""

from __future__ import annotations

import argparse
import collections
import time

import tightkv  # noqa: F401  (before torch: its OpenMP defaults, `tightkv._openmp_defaults`, as users get them)
import torch

from tightkv import Model
from tightkv.engine import speculative
from tightkv.engine.generate import decode_batch, prefill
from tightkv.eval.corpus import essays
from tightkv.kernels import build
from tightkv.kv.cache import trim_to

ENTRY_POINTS = [
    "tk_gemv",
    "tk_gemv_parts",
    "tk_gemv_float",
    "tk_ffn_block",
    "tk_qkv_block",
    "tk_glu",
    "tk_attn",
    "tk_rms_norm",
    "tk_add_rms_norm",
    "tk_qkv_heads",
    "tk_rope_neox",
    "tk_tq_encode",
    "tk_kvarn_encode",
    "tk_moe_row",
    "tk_moe_block",
]


class Timed:
    """A kernel entry point that adds its wall time and calls to shared counters (and, where
    `each` is a list, each call's time to it)."""

    def __init__(self, name, fn, spent, calls, each=None):
        self.name, self.fn, self.spent, self.calls, self.each = name, fn, spent, calls, each

    def __call__(self, *args):
        t = time.perf_counter()
        out = self.fn(*args)
        dt = time.perf_counter() - t
        self.spent[self.name] += dt
        self.calls[self.name] += 1
        if self.each is not None:
            self.each.append(dt)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF path (default: the embedded Gemma 3 270M)")
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--streams", type=int, default=1, help="sequences decoded together per step")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=16, help="tokens in the cache before the steps")
    ap.add_argument("--rows", type=int, default=1, help="rows a step runs: more than 1, a verification of that many")
    ap.add_argument("--per-call", default=None, metavar="NAME", help="also each call of this entry point within a step")
    args = ap.parse_args()
    model = Model(args.model, kv=args.kv, threads=args.threads, context_length=max(4096, args.depth + 64))
    torch.set_num_threads(args.threads)
    lib = build.library()
    spent, calls, each = collections.defaultdict(float), collections.Counter(), []
    for name in ENTRY_POINTS:
        setattr(lib, name, Timed(name, getattr(lib, name), spent, calls, each if name == args.per_call else None))
    text = essays() if args.depth > 16 else "The quick brown fox jumps over the lazy dog. " * 3
    prompt = model.tokenizer.encode(text[: 8 * args.depth])[: args.depth]
    caches = [model.new_cache() for _ in range(args.streams)]
    for cache in caches:
        prefill(model.net, prompt, cache)
    tokens = [100 + i for i in range(args.streams)]

    def run_step():
        if args.rows == 1:
            return decode_batch(model.net, tokens, caches)
        speculative.verify(model.net, prompt[-args.rows + 1 :] + tokens[:1], caches[0])
        assert trim_to(caches[0], len(prompt))

    for _ in range(5):
        run_step()
    print(
        f"{build.status()}, {args.threads} thread(s), KV {args.kv}, {args.streams} stream(s), depth {len(prompt)}, "
        f"{args.rows} row(s) a step, {args.steps} steps per round"
    )
    for _ in range(args.rounds):
        spent.clear()
        calls.clear()
        each.clear()
        t = time.perf_counter()
        for _ in range(args.steps):
            run_step()
        step = (time.perf_counter() - t) / args.steps
        inside = sum(spent.values()) / args.steps
        parts = ", ".join(f"{k} {v / args.steps * 1e3:.2f} ms ({calls[k] // args.steps})" for k, v in spent.items())
        print(
            f"step {step * 1e3:.2f} ms = in kernels {inside * 1e3:.2f} + outside {(step - inside) * 1e3:.2f} | {parts}"
        )
        if each:
            per = len(each) // args.steps  # calls a step
            means = [sum(each[i::per]) / args.steps * 1e3 for i in range(per)]
            print(f"  {args.per_call} by call within a step, ms: " + " ".join(f"{m:.3f}" for m in means))


if __name__ == "__main__":
    main()
