"""Decode speed of a synthetic Llama-shaped model whose KV dominates at long context,
ours (default compressed cache, optionally f16) against llama.cpp f16 (and q8_0).

The model: 16 layers, 16 query heads and 8 KV heads of 128, hidden 2048, FFN
4096, Q4_0 weights (random, seeded; speed only), written with tests/tiny_gguf.py's
writer into a temporary directory. f16 KV at 16K tokens is 1 GiB.

    python bench/synthetic_llama.py --depth 16384 --n-gen 32 --json docs/bench/synthetic_llama.json

Both engines get the same token ids and threads; each engine fills its cache to
`depth` tokens with a prefill, then decodes `n-gen` tokens one at a time (the
first step is not timed). Prints a table and writes JSON. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(
    hidden=2048,
    heads=16,
    kv_heads=8,
    head_dim=128,
    layers=16,
    intermediate=4096,
    context=32768,
    vocab=300,
    rope_base=500000.0,
    eps=1e-5,
)


def write_model(path: Path, seed: int = 0) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_gguf import _family_metadata, llama_vocab, write_gguf

    c = CONFIG
    rng = np.random.default_rng(seed)

    def mat(out, inp):
        return rng.standard_normal((out, inp), dtype=np.float32) / np.float32(np.sqrt(inp))

    h, hd = c["hidden"], c["head_dim"]
    t = {"token_embd.weight": rng.standard_normal((c["vocab"], h), dtype=np.float32) * np.float32(0.4)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(h, np.float32)
        t[p + "attn_q.weight"] = mat(c["heads"] * hd, h)
        t[p + "attn_k.weight"] = mat(c["kv_heads"] * hd, h)
        t[p + "attn_v.weight"] = mat(c["kv_heads"] * hd, h)
        t[p + "attn_output.weight"] = mat(h, c["heads"] * hd)
        t[p + "ffn_norm.weight"] = np.ones(h, np.float32)
        t[p + "ffn_gate.weight"] = mat(c["intermediate"], h)
        t[p + "ffn_up.weight"] = mat(c["intermediate"], h)
        t[p + "ffn_down.weight"] = mat(h, c["intermediate"])
    t["output_norm.weight"] = np.ones(h, np.float32)
    t["output.weight"] = mat(c["vocab"], h)
    return write_gguf(
        path, "llama", _family_metadata(c), t, llama_vocab(c["vocab"]), qtype="Q4_0", name="synthetic-llama"
    )


def tokens(n: int, seed: int, vocab: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(10, vocab or CONFIG["vocab"], size=n).tolist()


def ours(path: Path, kv: str, depth: int, n_gen: int, threads: int, reps: int, vocab: int = 0, warmup: int = 1) -> dict:
    import torch

    from tightkv.api import Model
    from tightkv.engine.generate import decode_step, prefill
    from tightkv.eval.bench import peak_rss

    torch.set_num_threads(threads)
    model = Model(str(path), threads=threads, context_length=max(depth + n_gen + 8, 520))
    if warmup > 1:  # every weight page touched once (a mixture's experts too), in a cache thrown away
        prefill(model.net, tokens(512, 4, vocab), model.new_cache(kv))
    context, steps = [1] + tokens(depth - 1, 2, vocab), tokens(n_gen + warmup, 3, vocab)
    runs, pp = [], []
    for _ in range(reps):
        cache = model.new_cache(kv)
        t = time.perf_counter()
        prefill(model.net, context, cache)
        pp.append(depth / (time.perf_counter() - t))
        for tok in steps[:warmup]:  # not timed (the first steps touch weights not yet mapped)
            decode_step(model.net, tok, cache)
        t = time.perf_counter()
        for tok in steps[warmup:]:
            decode_step(model.net, tok, cache)
        runs.append(n_gen / (time.perf_counter() - t))
        kv_bytes = sum(c.nbytes for c in cache)
        del cache
    model.close()
    return {
        "engine": "tightkv",
        "kv": kv,
        "depth": depth,
        "tg_tok_s": statistics.median(runs),
        "tg_runs": runs,
        "pp_tok_s": statistics.median(pp),
        "kv_bytes": kv_bytes,
        "peak_rss": peak_rss(),
    }


def llamacpp(
    path: Path, kv: str, depth: int, n_gen: int, threads: int, reps: int, vocab: int = 0, warmup: int = 1
) -> dict:
    from tightkv.eval.bench import open_llama, peak_rss

    m = open_llama(path, max(depth + n_gen + 8, 520), kv, threads)  # in its own process
    context, steps = [1] + tokens(depth - 1, 2, vocab), tokens(n_gen + warmup, 3, vocab)
    if warmup > 1:  # as ours: a throwaway prefill first
        m.eval(tokens(512, 4, vocab))
    runs, pp = [], []
    for _ in range(reps):
        m.reset()
        t = time.perf_counter()
        m.eval(context)
        pp.append(depth / (time.perf_counter() - t))
        for tok in steps[:warmup]:
            m.eval([tok])
        t = time.perf_counter()
        for tok in steps[warmup:]:
            m.eval([tok])
        runs.append(n_gen / (time.perf_counter() - t))
    return {
        "engine": "llama.cpp",
        "kv": kv,
        "depth": depth,
        "tg_tok_s": statistics.median(runs),
        "tg_runs": runs,
        "pp_tok_s": statistics.median(pp),
        "kv_bytes": 0,
        "peak_rss": peak_rss(),
    }


def _child(fn, args, queue):
    try:
        queue.put(("ok", fn(*args)))
    except Exception as err:
        queue.put(("error", f"{type(err).__name__}: {err}"))


def isolated(fn, *args) -> dict:
    """Run one measurement in a fresh process (memory of the engines never mixes)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, args, q))
    p.start()
    status, payload = q.get()
    p.join()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def write_json(ns: argparse.Namespace, rows: list[dict]) -> None:
    doc = {"config": CONFIG, "threads": ns.threads, "n_gen": ns.n_gen, "reps": ns.reps, "rows": rows}
    Path(ns.json).write_text(json.dumps(doc, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=16384)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ours", default="progressive", help="our KV types, comma-separated")
    ap.add_argument("--llamacpp", default="f16", help="llama.cpp KV types, comma-separated ('' to skip)")
    ap.add_argument("--model", default=None, help="an existing synthetic GGUF (default: write one to a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model of the same kind (smoke test of this script)")
    ns = ap.parse_args()
    if ns.tiny:
        CONFIG.update(layers=2, hidden=256, heads=2, kv_heads=1, intermediate=256)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(ns.model) if ns.model else None
        if path is None:
            t = time.perf_counter()
            path = write_model(Path(tmp) / "synthetic-llama-q4_0.gguf")
            print(
                f"wrote {path.name} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s",
                file=sys.stderr,
            )
        rows = []
        runs = [(ours, "tightkv", kv) for kv in filter(None, ns.ours.split(","))]
        runs += [(llamacpp, "llama.cpp", kv) for kv in filter(None, ns.llamacpp.split(","))]
        for fn, engine, kv in runs:
            print(f"{engine} {kv} ...", file=sys.stderr, flush=True)
            rows.append(isolated(fn, path, kv, ns.depth, ns.n_gen, ns.threads, ns.reps))
            if ns.json:  # after every row: a long run that is stopped keeps what it measured
                write_json(ns, rows)
    base = next((r["tg_tok_s"] for r in rows if r["engine"] == "llama.cpp" and r["kv"] == "f16"), None)
    print("| engine    | kv          | depth | tg t/s | vs llama.cpp f16 | pp t/s | KV MiB | peak RSS MiB |")
    print("|-----------|-------------|------:|-------:|-----------------:|-------:|-------:|-------------:|")
    for r in rows:
        ratio = f"{r['tg_tok_s'] / base:.2f}x" if base else ""
        kv_mib = f"{r['kv_bytes'] / 2**20:.0f}" if r["kv_bytes"] else ""
        print(
            f"| {r['engine']:<9} | {r['kv']:<11} | {r['depth']:>5} | {r['tg_tok_s']:6.2f} | {ratio:>16} "
            f"| {r['pp_tok_s']:6.1f} | {kv_mib:>6} | {r['peak_rss'] / 2**20:12.0f} |"
        )
    print(
        f"synthetic Llama (16 layers, 8 KV heads of 128, hidden 2048, Q4_0), {ns.threads} threads, "
        f"{ns.n_gen} tokens, medians of {ns.reps}"
    )


if __name__ == "__main__":
    main()
