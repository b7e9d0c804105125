"""The fused attention kernel alone: one decode step over a filled cache, per KV type.

    python bench/bench_attention.py --depth 8192 --shape gemma --types f16,q8_0,progressive,kvarn4
    TIGHTKV_SIMD=avx2 python bench/bench_attention.py ...   # another instruction path
    python bench/bench_attention.py --int8 on,off ...         # the integer paths, then the float ones
    python bench/bench_attention.py --positions 512 ...       # a prompt chunk of 512 positions at depth

Each row is one layer's attention for one query position (what a decode step pays per
layer), the minimum and the median of --reps timed calls after a warm-up (the minimum is
the steadier figure on a shared box), and the bytes the cache holds, with the rate at
which the kernel reads them. Shapes: gemma (1 KV head, 4 query heads, head dim 256:
Gemma 3 270M's global layers), qwen (2 KV heads, 14 query heads, 64: Qwen2.5-0.5B),
llama (8 KV, 32 query, 128), phi (32 KV, 32 query, 96), d80 (4 KV, 16 query, 80).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import tightkv  # noqa: F401  (before torch: its OpenMP defaults, `tightkv._openmp_defaults`, as users get them)
import torch

SHAPES = {"gemma": (1, 4, 256), "qwen": (2, 14, 64), "llama": (8, 32, 128), "phi": (32, 32, 96), "d80": (4, 16, 80)}


def fill(spec: str, hkv: int, h: int, d: int, depth: int, seed: int = 0, positions: int = 1):
    """A cache of `spec` holding `depth` random tokens, and the (q, k, v) of the next
    `positions` (one decode step, or a prompt chunk)."""
    from tightkv.kv.spec import parse_kv

    g = torch.Generator().manual_seed(seed)
    cache = parse_kv(spec).make_cache(0, 1, hkv, d, d, None)
    shift = torch.randn(hkv, 1, d, generator=g) * 2
    for s in range(0, depth, 1024):
        n = min(1024, depth - s)
        k = torch.randn(hkv, n, d, generator=g) + shift
        v = torch.randn(hkv, n, d, generator=g)
        if hasattr(cache, "_forget"):  # a compressed cache: encode as a prefill chunk does
            cache.append(k, v, torch.randn(h, n, d, generator=g))
            cache._forget()
        else:
            cache._append(k, v)
    step = (
        torch.randn(h, positions, d, generator=g),
        torch.randn(hkv, positions, d, generator=g) + shift,
        torch.randn(hkv, positions, d, generator=g),
    )
    return cache, step


def time_type(spec: str, shape: str, depth: int, reps: int, clock=time.perf_counter, positions: int = 1) -> dict:
    """Time the attention of the next `positions` (append excluded) over a filled cache."""
    from tightkv.kv.cache import DenseCache

    hkv, h, d = SHAPES[shape]
    cache, (q, k, v) = fill(spec, hkv, h, d, depth, positions=positions)
    if isinstance(cache, DenseCache):
        cache.attend(q, k, v, d**-0.5)  # the step's token appended, as in decode
        from tightkv.kv import fused

        def run():
            return fused.dense_attend(cache, q, d**-0.5)

        nbytes = cache.nbytes
    else:
        b = cache.append(k, v, q)

        def run():
            return cache.attend_stored(q, b, d**-0.5)

        nbytes = cache.nbytes
    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        t = clock()
        run()
        times.append(clock() - t)
    best = min(times)
    return {
        "kv": spec,
        "shape": shape,
        "depth": depth,
        "positions": positions,
        "min_us": round(best * 1e6, 1),
        "median_us": round(statistics.median(times) * 1e6, 1),
        "kv_bytes": nbytes,
        "gb_s": round(nbytes / best / 1e9, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=8192)
    ap.add_argument("--shape", default="gemma", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--types", default="f16,q8_0,k8v4,progressive,kvarn4,tq3,aggressive,kivi4,q4_0")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--positions", type=int, default=1, help="query positions: 1 a decode step, more a prompt chunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the calling thread's CPU time (with --threads 1: steady on a busy box)",
    )
    ap.add_argument("--int8", default="on", help="on, off or on,off: the kernel's integer paths (`set_int8`)")
    ap.add_argument("--json", help="write the rows here")
    ns = ap.parse_args()
    from tightkv.eval.bench import machine
    from tightkv.kernels import attention, build

    torch.set_num_threads(ns.threads)
    build.set_threads(ns.threads)
    info = machine()
    clock = "thread CPU time" if ns.cpu_time else "wall time"
    print(f"# {info.get('cpu', '?')}; kernels {build.summary()}; {clock}")
    print(f"# {ns.positions} position(s) at depth {ns.depth}")
    print(f"{'kv':<14} {'int8':<4} {'shape':<6} {'depth':>6} {'min us':>9} {'median us':>10} {'KV MiB':>8} {'GB/s':>6}")
    rows = []
    for mode in ns.int8.split(","):
        attention.set_int8(mode == "on", mode == "on")
        for shape in ns.shape.split(","):
            for spec in ns.types.split(","):
                timer = time.thread_time if ns.cpu_time else time.perf_counter
                r = time_type(spec, shape, ns.depth, ns.reps, timer, ns.positions)
                rows.append({**r, "int8": mode})
                print(
                    f"{spec:<14} {mode:<4} {shape:<6} {ns.depth:>6} {r['min_us']:>9.1f} {r['median_us']:>10.1f} "
                    f"{r['kv_bytes'] / 2**20:>8.2f} {r['gb_s']:>6.2f}",
                    flush=True,
                )
    attention.set_int8()
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"machine": info, "kernels": build.summary(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
