"""Where a process's memory goes, phase by phase: tightkv and llama.cpp on the same GGUF (#56).

    python bench/memory_breakdown.py [MODEL] [-n 32768] [--kv kvarn4] [--llama-kv q8_0,f16] [--json PATH]

Each engine and cache type runs in its own process, as `tightkv bench` runs llama.cpp
(flash attention on, `swa_full` off, 2 threads), through the same fill and decode step as
the bench (`eval.bench`'s adapters). Phases:

- `imports`: the interpreter and the engine's imports (torch for us; llama-cpp-python);
- `loaded`: the model opened (tokenizer, tables, the weights' memory map);
- `touched`: one short generation, so every weight page has been read once;
- `filled`: N tokens run into the cache in the engine's own chunks (`peak` is the most
  the process held during the fill, `after` what it holds once it ends);
- `decode`: 16 decode steps after the fill, their peak.

At each phase the resident memory is split by mapping (/proc/self/smaps): the GGUF's
memory map (`weights`), shared libraries (`libraries`: torch's, oneDNN's, llama.cpp's),
the C heap (`heap`, where most of a run's buffers and Python objects live) and the other
anonymous maps (`anon`: large buffers, thread stacks, llama.cpp's KV and compute buffers).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
from collections import Counter

PHASES = ("imports", "loaded", "touched", "filled", "decode")
PARTS = ("weights", "libraries", "heap", "anon")


def status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS
        f.write("5")


def split(gguf: str) -> dict[str, int]:
    """Resident bytes by kind of mapping (PARTS)."""
    real = os.path.realpath(gguf)
    parts: Counter = Counter()
    kind = "anon"
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode, path
                path = fields[5] if len(fields) > 5 else ""
                if path and os.path.realpath(path) == real:
                    kind = "weights"
                elif path == "[heap]":
                    kind = "heap"
                elif path.startswith("/"):
                    kind = "libraries"
                else:
                    kind = "anon"
            elif fields[0] == "Rss:":
                parts[kind] += int(fields[1]) * 1024
    return {p: parts[p] for p in PARTS}


def snapshot(gguf: str, peak: bool = False) -> dict:
    row = {"rss": status("VmRSS"), **split(gguf)}
    if peak:
        row["peak"] = status("VmHWM")
    return row


def _ours(gguf: str, kv: str, tokens: int, threads: int) -> dict:
    import torch

    out = {"imports": snapshot(gguf)}
    from tightkv import Model
    from tightkv.eval.bench import _Ours

    torch.set_num_threads(threads)
    model = Model(gguf, threads=threads, context_length=tokens + 16)
    out["loaded"] = snapshot(gguf)
    engine = _Ours(model, kv)
    return _phases(engine, gguf, tokens, out, lambda: engine.kv_bytes())


def _llama(gguf: str, kv: str, tokens: int, threads: int) -> dict:
    from tightkv import restore_openmp_env

    restore_openmp_env()  # before libgomp loads, as `open_llama` does
    import llama_cpp  # noqa: F401  (the imports phase counts it)

    out = {"imports": snapshot(gguf)}
    from tightkv.eval.bench import _Llama, open_llama

    m = open_llama(gguf, tokens + 16, kv, threads)
    out["loaded"] = snapshot(gguf)
    return _phases(_Llama(m), gguf, tokens, out, lambda: 0)


def _phases(engine, gguf: str, tokens: int, out: dict, kv_bytes) -> dict:
    from tightkv.eval.bench import bench_tokens

    engine.reset()
    engine.eval([engine.bos] + bench_tokens(63, engine.vocab, 1))
    for tok in bench_tokens(4, engine.vocab, 3):
        engine.step(tok)
    out["touched"] = snapshot(gguf)
    engine.reset()
    reset_peak()
    engine.eval([engine.bos] + bench_tokens(tokens - 1, engine.vocab, 2), f"{engine.name} filling {tokens}")
    out["filled"] = snapshot(gguf, peak=True)
    reset_peak()
    for tok in bench_tokens(16, engine.vocab, 3):
        engine.step(tok)
    out["decode"] = snapshot(gguf, peak=True)
    out["cache_bytes"] = kv_bytes()
    return out


def _child(fn, args, queue) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except Exception as err:  # one line to the parent
        queue.put(("error", f"{type(err).__name__}: {err}"))


def run(engine: str, gguf: str, kv: str, tokens: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    fn = _ours if engine == "tightkv" else _llama
    proc = ctx.Process(target=_child, args=(fn, (gguf, kv, tokens, threads), queue))
    proc.start()
    state, payload = queue.get()
    proc.join()
    if state != "ok":
        raise SystemExit(f"error: {engine} {kv}: {payload}")
    return {"engine": engine, "kv": kv, "tokens": tokens, **payload}


def table(rows: list[dict]) -> str:
    mib = 2**20
    head = "| engine | kv | phase | RSS MiB | peak MiB | weights | libraries | heap | anon |"
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for phase in PHASES:
            s = r[phase]
            peak = f"{s['peak'] / mib:.0f}" if "peak" in s else ""
            parts = " | ".join(f"{s[p] / mib:.0f}" for p in PARTS)
            lines.append(f"| {r['engine']} | {r['kv']} | {phase} | {s['rss'] / mib:.0f} | {peak} | {parts} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    ap.add_argument("-n", "--tokens", type=int, default=32752, help="tokens to fill (the context holds 16 more)")
    ap.add_argument("--kv", default="kvarn4", help="our cache types, comma-separated")
    ap.add_argument("--llama-kv", default="q8_0,f16", help="llama.cpp's cache types ('' for none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    from tightkv.eval.bench import machine
    from tightkv.errors import TightKVError
    from tightkv.registry import resolve

    try:
        gguf = str(resolve(ns.model, pull=False))
    except TightKVError as err:
        raise SystemExit(f"error: {err}") from None
    runs = [("tightkv", k) for k in ns.kv.split(",") if k] + [("llama.cpp", k) for k in ns.llama_kv.split(",") if k]
    rows = []
    for engine, kv in runs:
        print(f"{engine} {kv} ...", file=sys.stderr, flush=True)
        rows.append(run(engine, gguf, kv, ns.tokens, ns.threads))
    print(table(rows))
    if ns.json:
        command = "python bench/memory_breakdown.py " + " ".join(sys.argv[1:])
        doc = {"command": command, "machine": machine(), "model": gguf, "threads": ns.threads, "rows": rows}
        with open(ns.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
