"""The server's step with a prompt chunk beside running decodes: one forward pass
(`engine.generate.forward_rows`, what `decode_sequences(..., filling=...)` runs) against
the chunk alone and then the decode batch (what the step did before).

    python bench/merged_step.py [MODEL] [--chunk 18] [--streams 3] [--rounds 6]

Each round gives every sequence a fresh cache holding a 21-token prefix (a chat's system
prompt), the running ones also their 18-token turn; prints ms per step, each round and best.
"""

from __future__ import annotations

import argparse
import time

from tightkv.api import Model
from tightkv.engine.generate import decode_batch, forward_rows, prefill, run_chunk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="gemma3:270m")
    ap.add_argument("--chunk", type=int, default=18, help="prompt chunk tokens")
    ap.add_argument("--streams", type=int, default=3, help="running decodes beside it")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ns = ap.parse_args()
    m = Model(ns.model, threads=ns.threads)
    ids = list(range(1000, 1021 + ns.chunk))
    chunk, tokens = ids[21:], [5 + i for i in range(ns.streams)]

    def caches():
        out = []
        for i in range(ns.streams + 1):
            c = m.new_cache()
            prefill(m.net, ids[:21] if i == 0 else ids, c)
            out.append(c)
        return out

    def separate(cs):
        run_chunk(m.net, chunk, cs[0], last=False)
        decode_batch(m.net, tokens, cs[1:])

    def merged(cs):
        forward_rows(m.net, [chunk] + [[t] for t in tokens], cs, [len(chunk) + i for i in range(ns.streams)])

    times: dict[str, list[float]] = {"chunk, then decodes": [], "one pass": []}
    for _ in range(ns.rounds):
        for name, fn in (("chunk, then decodes", separate), ("one pass", merged)):
            cs = caches()
            t = time.perf_counter()
            fn(cs)
            times[name].append(time.perf_counter() - t)
    print(f"{m.kv} cache, a {ns.chunk}-token chunk beside {ns.streams} decodes, {ns.threads} threads; ms per step")
    for name, v in times.items():
        print(f"{name:20s} " + " ".join(f"{x * 1e3:.0f}" for x in v) + f"  best {min(v) * 1e3:.0f}")


if __name__ == "__main__":
    main()
