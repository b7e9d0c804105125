"""`tightkv bench`: llama-bench-style speed table."""
from __future__ import annotations

import argparse
import sys

from ..errors import TightKVError

from .common import add_model_flags, int_list, kv_types

NAME = "bench"
HELP = "prompt and generation speed, optionally beside llama.cpp"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--depths", default="16,2048", help="context depths for tg, comma-separated")
    p.add_argument("--n-prompt", "-p", type=int, default=512, help="prompt tokens of the pp test")
    p.add_argument("--n-gen", type=int, default=128, help="decode steps of each tg test")
    p.add_argument("--reps", "-r", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--compare", default=None, help="comma-separated KV types")
    p.add_argument("--vs-llamacpp", action="store_true", help="also run llama.cpp (llama-cpp-python)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    add_model_flags(p, kv_default="f16")


def run(ns: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..api import Model, default_threads
    from ..eval.bench import LLAMA_SETTINGS, format_table, machine, run_llamacpp, run_tightkv

    depths = int_list(ns.depths, "--depths")
    threads = ns.threads or default_threads()
    kinds = kv_types(ns)
    model = Model(ns.model, threads=threads, context_length=ns.ctx or None)
    if max(depths) + ns.n_gen + 1 > model.context_length:
        raise TightKVError(f"depth {max(depths)} + {ns.n_gen} tokens exceeds the context of {model.context_length}")
    for kind in kinds:
        model.new_cache(kind)
    rows = []

    def show(row) -> None:
        print(row.summary(), file=sys.stderr, flush=True)

    for kind in kinds:
        rows += run_tightkv(model, kind, depths, ns.n_prompt, ns.n_gen, ns.reps, on_row=show)
    if ns.vs_llamacpp:
        for kind in dict.fromkeys(["f16", "q8_0"] + kinds):
            print(f"llama.cpp {kind} ...", file=sys.stderr, flush=True)
            rows += run_llamacpp(model.path, kind, depths, ns.n_prompt, ns.n_gen, ns.reps, threads, on_row=show)
    print(format_table(rows))
    mach = machine()
    print(f"model {model.path.name}, {threads} threads, medians of {ns.reps} runs; {mach['cpu']}, "
          f"kernels {mach['kernels']}")
    if ns.json:
        name = Path(ns.model).name if ns.model else "gemma3:270m"
        doc = {"model": str(model.path), "model_name": name, "threads": threads, "reps": ns.reps, "machine": mach,
               "llama_settings": LLAMA_SETTINGS, "rows": [r.as_dict() for r in rows]}
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0
