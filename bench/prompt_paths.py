"""Prompt speed (ppN) under the settings that choose a prompt's path, each in a fresh process.

    python bench/prompt_paths.py [MODEL ...] [--tokens 512] [--rounds 3] [--json OUT]

Two settings, four combinations, alternated round by round (the box is shared), medians:

- ``TIGHTKV_INT8_PROMPTS``: 1 (default) sends Q4_K, Q5_K and Q6_K products of every row count
  through the block-dot kernel on int8 activations (`kernels.qmatmul.INT8_PROMPTS`); 0 gives
  them float32 tiles above `gemv_max_rows`, as the measurements score.
- libgomp's spin: tightkv's default (``GOMP_SPINCOUNT`` 10000, `tightkv._openmp_defaults`)
  or libgomp's own (300,000 turns): torch's OpenMP threads spin after each op, on the cores
  the kernels' pool runs on next.

MODEL: paths or registry names (default: the embedded model). Prints a table of tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
import tightkv  # before torch: its OpenMP setting (tightkv._openmp_defaults)
from tightkv.api import Model
from tightkv.engine.generate import prefill
m = Model(sys.argv[1], threads=int(sys.argv[3]), context_length=int(sys.argv[2]) + 16)
ids = [(7 * i) % 5000 + 100 for i in range(int(sys.argv[2]))]
prefill(m.net, ids[:64], m.new_cache())  # warm: kernels loaded, pages mapped
best = []
for _ in range(2):
    c = m.new_cache()
    t = time.perf_counter()
    prefill(m.net, ids, c)
    best.append(len(ids) / (time.perf_counter() - t))
print(max(best))
"""

SETTINGS = {  # name: environment changes
    "int8 prompts, short spin": {"TIGHTKV_INT8_PROMPTS": "1"},
    "float prompts, short spin": {"TIGHTKV_INT8_PROMPTS": "0"},
    "int8 prompts, libgomp spin": {"TIGHTKV_INT8_PROMPTS": "1", "GOMP_SPINCOUNT": "300000"},
    "float prompts, libgomp spin": {"TIGHTKV_INT8_PROMPTS": "0", "GOMP_SPINCOUNT": "300000"},
}


def measure(model: str, tokens: int, threads: int, env: dict) -> float:
    full = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(tokens), str(threads)], env=full, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"error: {model}: {out.stderr.strip().splitlines()[-1]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["gemma3:270m"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    rows = []
    for model in ns.models:
        runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for r in range(ns.rounds):
            for name, env in SETTINGS.items():
                runs[name].append(measure(model, ns.tokens, ns.threads, env))
                print(f"  {model} round {r + 1}/{ns.rounds}: {name} {runs[name][-1]:.1f} tokens/s", file=sys.stderr)
        for name, v in runs.items():
            rows.append(
                {"model": model, "setting": name, "tokens": ns.tokens, "tok_s": statistics.median(v), "runs": v}
            )
    print(f"| model | setting | pp{ns.tokens} tokens/s (median of {ns.rounds}) |\n|---|---|---:|")
    for row in rows:
        print(f"| {os.path.basename(row['model'])} | {row['setting']} | {row['tok_s']:.1f} |")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"threads": ns.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
