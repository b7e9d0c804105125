"""Memory of a decode step at a long context: does decode allocate anything that grows with it?

    python bench/decode_memory.py                                  # Gemma 3 270M, 32,768 tokens
    python bench/decode_memory.py MODEL.gguf -n 16384 --compare f16,progressive --json OUT.json

Each cache type runs in its own process: load the model (and touch every weight), fill the
context, reset the peak-RSS counter (/proc/self/clear_refs), decode `--steps` tokens, then
read the peak. The check: the decode's peak RSS is within 5% of the model's load RSS plus the
cache's own bytes (`nbytes`). The RSS after the fill is printed too (the allocator keeps some
of the prefill's buffers).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _measure(model: str | None, kv: str, tokens: int, steps: int, threads: int, queue) -> None:
    import torch

    from tightkv import Model
    from tightkv.engine.generate import decode_step, prefill
    from tightkv.eval.bench import bench_tokens
    from tightkv.progress import Progress

    torch.set_num_threads(threads)
    m = Model(model, threads=threads, context_length=tokens + steps + 8)
    m.generate("Hello", max_tokens=4)  # touch every weight once
    load = _status("VmRSS")
    ids = [m.tokenizer.bos_id] + bench_tokens(tokens - 1, m.args.vocab_size, 2)
    cache = m.new_cache(kv)
    with Progress(f"{kv}: filling {tokens} tokens", tokens) as bar:
        prefill(m.net, ids, cache, progress=lambda done, _n: bar.advance_to(done))
    filled = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # peak RSS := current RSS
        f.write("5")
    for tok in bench_tokens(steps, m.args.vocab_size, 3):
        decode_step(m.net, tok, cache)
    queue.put(
        {
            "kv": kv,
            "tokens": tokens,
            "steps": steps,
            "load_rss": load,
            "filled_rss": filled,
            "decode_peak_rss": _status("VmHWM"),
            "cache_bytes": sum(c.nbytes for c in cache),
        }
    )


def run(model: str | None, kv: str, tokens: int, steps: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(model, kv, tokens, steps, threads, queue))
    proc.start()
    row = queue.get()
    proc.join()
    bound = row["load_rss"] + row["cache_bytes"]
    row["bound"] = bound
    row["ratio"] = row["decode_peak_rss"] / bound
    row["ok"] = row["ratio"] <= 1.05
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("-n", "--tokens", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--compare", default="f16,progressive,kvarn4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    rows = [run(ns.model, kv, ns.tokens, ns.steps, ns.threads) for kv in ns.compare.split(",")]
    mib = 2**20
    print("| kv | load RSS MiB | cache MiB | RSS after fill MiB | decode peak RSS MiB | peak / (load + cache) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['kv']} | {r['load_rss'] / mib:.0f} | {r['cache_bytes'] / mib:.1f} | {r['filled_rss'] / mib:.0f} "
            f"| {r['decode_peak_rss'] / mib:.0f} | {r['ratio']:.3f} {'ok' if r['ok'] else 'OVER'} |"
        )
    if ns.json:
        from tightkv.eval.bench import machine

        json.dump(
            {"machine": machine(), "tokens": ns.tokens, "steps": ns.steps, "rows": rows}, open(ns.json, "w"), indent=1
        )
    return 0  # a benchmark reports; the table says which rows are over


if __name__ == "__main__":
    sys.exit(main())
