"""`tightkv bench`: llama-bench-style speed table."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ..errors import TightKVError

from .flags import add_model_flags, int_list, kv_types, model_label

NAME = "bench"
HELP = "prompt and generation speed, optionally beside llama.cpp"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--depths", default="16,2048", help="context depths for tg, comma-separated")
    p.add_argument(
        "--n-prompt", "-p", type=int, default=512, help="prompt tokens of the pp test (0 skips it, as in llama-bench)"
    )
    p.add_argument(
        "--pp-depths",
        default="",
        help="also time the pp prompt after these many tokens of context, comma-separated "
        "(llama-bench's -d for pp: 'pp512 @ d8192')",
    )
    p.add_argument(
        "--ttft",
        default="",
        help="time to first token for whole documents of these many tokens, comma-separated "
        "(prompt chunks as the engine runs them, then the first token picked)",
    )
    p.add_argument("--n-gen", type=int, default=128, help="decode steps of each tg test")
    p.add_argument("--reps", "-r", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--compare", default=None, help="comma-separated KV types")
    p.add_argument("--vs-llamacpp", action="store_true", help="also run llama.cpp (llama-cpp-python)")
    p.add_argument(
        "--llamacpp-gpu-layers",
        type=int,
        default=0,
        metavar="N",
        help="layers llama.cpp offloads to its GPU backend (Metal on a Mac; -1 all); default 0, its CPU",
    )
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    add_model_flags(p, kv_default="f16")


def run(ns: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..api import Model, default_threads
    from itertools import zip_longest

    from ..gguf.describe import read_per_token
    from ..hub import human_binary_bytes

    from ..eval.bench import (
        LLAMA_KV_TYPES,
        LLAMA_SETTINGS,
        Tests,
        format_table,
        machine,
        merge_runs,
        run_llamacpp,
        run_tightkv,
    )

    tests = Tests(
        ns.n_prompt,
        ns.n_gen,
        tuple(int_list(ns.depths, "--depths")) if ns.depths else (),
        tuple(int_list(ns.pp_depths, "--pp-depths")) if ns.pp_depths else (),
        tuple(int_list(ns.ttft, "--ttft")) if ns.ttft else (),
    )
    threads = ns.threads or default_threads()
    kinds = kv_types(ns)
    model = Model(ns.model, threads=threads, context_length=ns.ctx or None)
    if ns.n_prompt < 0 or ns.n_gen < 1:
        raise TightKVError("--n-prompt must be 0 or more and --n-gen at least 1")
    if min(tests.docs, default=2) < 2:
        raise TightKVError("--ttft documents need at least 2 tokens")
    if tests.tokens() > model.context_length:
        raise TightKVError(
            f"the tests hold up to {tests.tokens()} tokens, more than the context of {model.context_length} (-c)"
        )
    for kind in kinds:
        model.new_cache(kind)
    rows = []

    def show(row) -> None:
        print(row.summary(), file=sys.stderr, flush=True)

    theirs = [k for k in dict.fromkeys(["f16", "q8_0"] + kinds) if k in LLAMA_KV_TYPES] if ns.vs_llamacpp else []
    for rnd in range(ns.reps):  # rounds, the engines and types taking turns, so drift hits all alike
        jobs = [
            j
            for pair in zip_longest([("tightkv", k) for k in kinds], [("llama.cpp", k) for k in theirs])
            for j in pair
            if j
        ]
        for engine, kind in jobs if rnd % 2 == 0 else jobs[::-1]:
            if engine == "tightkv":
                rows += run_tightkv(model, kind, tests, 1, on_row=show)
            else:
                print(f"llama.cpp {kind} ...", file=sys.stderr, flush=True)
                rows += run_llamacpp(
                    model.path,
                    kind,
                    tests,
                    1,
                    threads,
                    on_row=show,
                    gpu_layers=ns.llamacpp_gpu_layers,
                )
    rows = merge_runs(rows)
    print(format_table(rows))
    mach = machine()
    build = next((r.build for r in rows if r.build), "")
    read = read_per_token(model.gguf)
    if read.moe:  # GB/s counts what a token reads: the routed experts' share, the rest whole
        print(f"weights read per token: {read.parts(human_binary_bytes)} of {human_binary_bytes(read.weights)}")
    name = model_label(ns.model)  # as every verb names it (gemma3:270m), not by its blob's hash
    print(
        f"model {name}, {threads} threads, medians of {ns.reps} rounds (engines and types in turn); "
        f"{mach['cpu']}, kernels {mach['kernels']}" + (f"; llama.cpp built with {build}" if build else "")
    )
    if ns.json:
        command = "tightkv " + shlex.join(sys.argv[1:])  # as typed (an in-process call records its own argv)
        doc = {
            "command": command,
            "model": str(model.path),
            "model_name": name,
            "threads": threads,
            "reps": ns.reps,
            "machine": mach,
            "simd_forced": os.environ.get("TIGHTKV_SIMD", ""),
            **({"llama_settings": LLAMA_SETTINGS, "llama_build": build} if ns.vs_llamacpp else {}),
            "rows": [r.as_dict() for r in rows],
        }
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0
