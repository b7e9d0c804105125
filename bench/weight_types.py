"""Every llama.cpp file type holding a weight block type of issue 19, against llama.cpp on the same file.

    python bench/weight_types.py [--types IQ4_XS,Q1_0,...] [--speed] [--reps 3] [--json docs/bench/weight_types.json]
                                 [--md docs/weight-types.md] [--render]

`--md` writes the JSON's table into that doc, between the markers that name the JSON
(one section per machine; a JSON not there yet gets a section of its own at the end).

Each file is the embedded Gemma 3 270M requantized by llama.cpp's own quantizer
(`llama_model_quantize`, llama-cpp-python 0.3.36; tests/requantized.py builds them once
and caches them under TIGHTKV_HOME; the IQ1/IQ2 types get an importance matrix made
from the essays). For each file type:

- `blocks`: the bytes of each block type in the file (Gemma's 640-wide rows fall back to
  IQ4_NL or Q4_0 where a 256-block type does not fit; the tied embedding stays Q8_0);
- `vs_llamacpp`: on 10 prompts, our greedy continuations (24 tokens) against llama.cpp's up
  to its first near tie (top-2 margin < 0.5), and the top-20 logits after each prompt
  (max and mean absolute difference; the issue's bars are 0.75 and 0.2), for this
  machine's kernels (`native`: on AVX-512, int8 activations in groups of 32, two groups
  per 512-bit register) and for the AVX2 build's (`avx2`: int8 activations in groups of
  32, as llama.cpp's own block dots take them, though it groups k-quant and IQ
  activations by 256);
- `llamacpp_self_*` (in each `vs_llamacpp` entry): llama.cpp against itself, its top-20
  logits from the batched prompt against those from the prompt fed one token at a time
  (its batch kernels differ from its single-token ones for several block types);
- `noise_floor`: the same top-20 logits, our native path against the portable build's
  float32 activations: how far the rounding of the activations alone moves the logits on
  that file. Where a file's weights are destroyed (1-2 bits on a 270M model) this is as
  large as the distance to llama.cpp, and no engine that rounds activations differently
  from llama.cpp can meet the bars there;
- with --ppl N: perplexity on the essays by the standard protocol (N chunks of 2048, f16 KV),
  ours against llama.cpp's on the same file (tests/reference/mkppl.py's way), twice: forwards
  of 512 rows (float32 activations through dequantized tiles, as a prompt runs) and forwards
  of 16 (`ours_int8`: the block-dot kernel's int8 activations, as llama.cpp's matmuls round
  them): how far the activations' rounding alone moves a file's perplexity;
- with --speed: decode at depth 16 (f16 KV, --threads threads, median of --reps rounds, the two
  engines alternating round by round) against llama.cpp's on the same file (flash attention, as `tightkv bench --vs-llamacpp`), and
  the RSS that loading the file adds (`bench/load_memory.py`'s bound: 1.3 x file + 100 MB).

The machine and kernel builds are named in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from requantized import PROMPTS as TEST_PROMPTS  # noqa: E402
from requantized import compare, llamacpp_reference, requantized  # noqa: E402

from tightkv.registry import embedded_path  # noqa: E402

INT8_ROWS = 16  # --ppl's second run: forwards of this many rows, within the block-dot kernel's (int8 activations)
BASELINE = "Q4_K_M"  # the embedded file itself, as shipped: what the other rows compare with
FILE_TYPES = [
    BASELINE,
    "IQ4_NL",
    "IQ4_XS",
    "IQ3_S",
    "IQ3_M",
    "IQ3_XXS",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ2_0",
    "TQ1_0",
    "Q2_0",
    "Q1_0",
]
PROMPTS = TEST_PROMPTS + [
    "The largest planet in our solar system is",
    "In 1492, Columbus",
    "import numpy as np\n",
    "The chemical symbol for gold is",
    "My favorite food is",
]


def blocks(path: Path) -> dict[str, int]:
    from tightkv.gguf.reader import read_gguf

    out: dict[str, int] = {}
    for t in read_gguf(path).tensors.values():
        out[t.qtype] = out.get(t.qtype, 0) + int(t.data.nbytes)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def with_kernels(target: str | None, fn):
    """fn() with the kernel library of `target` (None: this machine's), swapped in process-wide."""
    from tightkv.kernels import build

    if target is None:
        return fn()
    saved = build.library()
    build._lib = build.load(target)
    try:
        return fn()
    finally:
        build._lib = saved


def top20(model, ref: dict) -> list[np.ndarray]:
    """Our logits at llama.cpp's top-20 ids after each prompt."""
    return [model.logits(c["ids"])[-1][c["top20_ids"]] for c in ref["cases"]]


def quality(path: Path) -> dict:
    from tightkv import Model

    ref = llamacpp_reference(path, PROMPTS)
    with Model(str(path)) as model:
        out = {
            name: with_kernels(target, lambda: compare(model, ref))
            for name, target in (("native", None), ("avx2", "avx2"))
        }
        native = top20(model, ref)
        exact = with_kernels("portable", lambda: top20(model, ref))  # float32 activations
    floor = np.abs(np.concatenate(native) - np.concatenate(exact))
    for r in (out["native"], out["avx2"]):
        for c in r["cases"]:
            c.pop("text")
    return {"vs_llamacpp": out, "noise_floor": {"top20_max": float(floor.max()), "top20_mean": float(floor.mean())}}


_LOAD = r"""
import json, sys, psutil, torch
base = psutil.Process().memory_info().rss
from tightkv import Model
m = Model(sys.argv[1], kv="f16", context_length=512)
m.generate("Hello", max_tokens=4)
print(json.dumps({"rise_bytes": psutil.Process().memory_info().rss - base}))
"""


def speed(path: Path, reps: int, threads: int) -> dict:
    from tightkv import Model
    from tightkv.eval.bench import Tests, merge_runs, run_llamacpp, run_tightkv

    load_before = os.getloadavg()[0]
    ours, theirs = [], []
    tests = Tests(n_prompt=64, n_gen=64, depths=(16,))
    with Model(str(path), threads=threads, kv="f16", context_length=512) as model:
        for _ in range(reps):  # rounds alternate the engines: a neighbour's load weighs on both alike
            ours.append(run_tightkv(model, "f16", tests, 1)[-1])
            theirs.append(run_llamacpp(path, "f16", tests, 1, threads)[-1])
    ours, theirs = merge_runs(ours)[0], merge_runs(theirs)[0]
    load = json.loads(
        subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    size = path.stat().st_size
    return {
        "tg64_d16_tok_s": ours.tok_s,
        "runs": ours.tok_s_runs,
        "llamacpp_tok_s": theirs.tok_s,
        "llamacpp_runs": theirs.tok_s_runs,
        "llamacpp_build": theirs.build,
        "vs_llamacpp": ours.tok_s / theirs.tok_s,
        "load_rss_rise_bytes": load["rise_bytes"],
        "load_bound_bytes": int(1.3 * size + 100e6),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: a busy box
        "threads": threads,
    }


def _speed_threads(doc: dict) -> int:
    """The threads of the decode figures: as recorded, else as the command that measured them said."""
    import re

    for row in doc["files"].values():
        if "threads" in row.get("speed", {}):
            return row["speed"]["threads"]
    for command in [doc["command"], *doc.get("earlier_commands", [])]:
        if "--speed" in command:
            found = re.search(r"--threads (\d+)", command)
            return int(found.group(1)) if found else 2
    return doc.get("threads", 2)


def render(doc: dict, json_path: str = "JSON") -> str:
    """The JSON as a Markdown table (a machine's section of docs/weight-types.md)."""
    commands = " and ".join(f"`{c}`" for c in [*doc.get("earlier_commands", [])[::-1], doc["command"]])
    lines = [
        f"Measured by {commands}; rendered here by `python bench/weight_types.py --render --json {json_path} --md "
        f"docs/weight-types.md`. {doc['machine']['cpu']} "
        f"({doc.get('cpu_count', 2)} cores), kernels "
        f"{doc['machine']['kernels']}. Each file is the embedded Gemma 3 270M requantized by llama.cpp's own "
        "quantizer (tests/requantized.py); Q4_K_M is the embedded file itself. Top-20: |our logit - llama.cpp's| at llama.cpp's 20 best tokens after "
        f"each of {len(doc['prompts'])} prompts (the issue's bars: max 0.75, mean 0.2); greedy: "
        f"{doc['n_gen']} tokens agree up to llama.cpp's first near tie (margin < 0.5). llama.cpp self: its "
        "batched-prompt logits against its token-by-token ones. Noise floor: our native (int8-activation) "
        "path against the portable build's float32 activations. Decode: tg64 at depth 16, f16 KV, "
        f"{_speed_threads(doc)} thread(s) each, medians of 3, against llama.cpp on the same file in the same "
        "run (the 1-minute load average before and after: the box is shared, and at 2 threads llama.cpp's "
        "OpenMP threads fell to 3-7 tok/s whenever other work ran, 38 when it did not; one thread each keeps "
        "that out). PPL: the essays, chunks of 2048 (llama-perplexity's protocol), f16 KV, "
        "forwards of 512 rows (float32 activations), and where given (int8) of 16 rows: the block-dot "
        "kernel's int8 activations, as llama.cpp rounds them.",
        "",
        "| file type | MiB | blocks (MiB) | greedy | top-20 max / mean | AVX2 build: greedy, max / mean "
        "| llama.cpp self max / mean | noise floor max / mean | PPL ours vs llama.cpp | decode tok/s (vs llama.cpp) "
        "| load RSS +MiB (bound) | load avg |",
        "|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for ftype, r in doc["files"].items():
        n, a, f = r["vs_llamacpp"]["native"], r["vs_llamacpp"]["avx2"], r["noise_floor"]
        blocks_ = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["blocks"].items() if k != "F32")
        sp = r.get("speed")
        speed_ = (
            (
                f"{sp['tg64_d16_tok_s']:.1f} vs {sp['llamacpp_tok_s']:.1f} ({sp['vs_llamacpp']:.2f}x)",
                f"{sp['load_rss_rise_bytes'] / 2**20:.0f} ({sp['load_bound_bytes'] / 2**20:.0f})",
                "{:.1f} / {:.1f}".format(*sp["load_average_1min"]),
            )
            if sp
            else ("", "", "")
        )
        p = r.get("ppl")
        ppl_ = f"{p['ours']:.3f} vs {p['llamacpp']:.3f} ({p['vs_llamacpp']:+.2%})" if p else ""
        if p and "ours_int8" in p:
            ppl_ += f"; int8 {p['ours_int8']:.3f} ({p['int8_vs_llamacpp']:+.2%})"
        lines.append(
            f"| {ftype} | {r['bytes'] / 2**20:.1f} | {blocks_} | {'ok' if n['greedy_ok'] else 'differs'} "
            f"| {n['top20_max']:.2f} / {n['top20_mean']:.3f} | {'ok' if a['greedy_ok'] else 'differs'}, "
            f"{a['top20_max']:.2f} / {a['top20_mean']:.3f} | {n['llamacpp_self_max']:.2f} / "
            f"{n['llamacpp_self_mean']:.3f} | {f['top20_max']:.2f} / {f['top20_mean']:.3f} | {ppl_} | "
            + " | ".join(speed_)
            + " |"
        )
    return "\n".join(lines) + "\n"


def write_md(md: Path, json_path: str, doc: dict) -> None:
    """Put `doc`'s table into the Markdown file `md`, between the markers that name `json_path`."""
    rel = Path(json_path).resolve()
    rel = rel.relative_to(ROOT).as_posix() if rel.is_relative_to(ROOT) else json_path
    begin, end = f"<!-- {rel}: written by bench/weight_types.py --md -->", f"<!-- end of {rel} -->"
    block = f"{begin}\n{render(doc, rel)}{end}"
    text = md.read_text(encoding="utf-8") if md.exists() else "# Weight types\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        machine = doc["machine"]
        text = text.rstrip("\n") + f"\n\n## {machine['cpu']}, kernels {machine['kernels']}\n\n{block}\n"
    md.write_text(text, encoding="utf-8")


def perplexity(path: Path, n_chunks: int, ctx: int = 2048) -> dict:
    """Ours and llama.cpp's perplexity on the essays (the standard protocol, f16 KV both)."""
    from requantized import llamacpp_ppl

    from tightkv import Model
    from tightkv.eval.corpus import essays_path
    from tightkv.eval.ppl import perplexity as ours_ppl

    theirs = llamacpp_ppl(path, essays_path(), ctx, n_chunks)
    text = essays_path().read_text()
    with Model(str(path), kv="f16", context_length=ctx) as model:
        ours = ours_ppl(model, text, ctx, n_chunks, ["f16"], progress=False)["f16"]
        # forwards of 16 rows take the block-dot kernel, with int8 activations as llama.cpp's matmuls have them
        ours_i8 = ours_ppl(model, text, ctx, n_chunks, ["f16"], progress=False, batch=INT8_ROWS)["f16"]
    return {
        "chunks": n_chunks,
        "ctx": ctx,
        "ours": ours["ppl"],
        "llamacpp": theirs["ppl"],
        "ours_stderr": ours["ppl_stderr"],
        "n_scored": ours["n_scored"],
        "vs_llamacpp": ours["ppl"] / theirs["ppl"] - 1,
        "ours_int8": ours_i8["ppl"],
        "int8_vs_llamacpp": ours_i8["ppl"] / theirs["ppl"] - 1,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(FILE_TYPES))
    ap.add_argument("--speed", action="store_true", help="also decode speed vs llama.cpp and load RSS")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--ppl",
        type=int,
        default=0,
        metavar="CHUNKS",
        help="also perplexity on the essays against llama.cpp's, CHUNKS chunks of 2048",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--md", default=None, help="also write --json's table into this Markdown doc (docs/weight-types.md)"
    )
    ap.add_argument("--render", action="store_true", help="only render --json's existing results into --md")
    ns = ap.parse_args()
    if ns.render:
        write_md(Path(ns.md), ns.json, json.loads(Path(ns.json).read_text()))
        return 0
    from tightkv.eval.bench import machine

    command = "python bench/weight_types.py " + " ".join(sys.argv[1:])
    doc = {
        "command": command,
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "threads": ns.threads,
        "prompts": PROMPTS,
        "n_gen": 24,
        "files": {},
    }
    prev = json.loads(Path(ns.json).read_text()) if ns.json and Path(ns.json).exists() else None
    if prev and not (ns.speed and ns.ppl):  # the figures kept from earlier runs name their commands
        doc["earlier_commands"] = [c for c in [prev["command"], *prev.get("earlier_commands", [])] if c != command]
        doc["files"] = dict(prev["files"])  # the file types not run again keep their rows
    for ftype in ns.types.split(","):
        path = Path(embedded_path()) if ftype == BASELINE else requantized(ftype)
        row = {"file": path.name, "bytes": path.stat().st_size, "blocks": blocks(path), **quality(path)}
        for key, on, fn in (
            ("speed", ns.speed, lambda: speed(path, ns.reps, ns.threads)),
            ("ppl", ns.ppl, lambda: perplexity(path, ns.ppl)),
        ):
            if on:
                row[key] = fn()
            elif prev and key in prev.get("files", {}).get(ftype, {}):
                row[key] = prev["files"][ftype][key]  # kept from the run that measured it
        doc["files"][ftype] = row
        n, a = row["vs_llamacpp"]["native"], row["vs_llamacpp"]["avx2"]
        line = (
            f"{ftype:8s} {row['bytes'] / 2**20:6.1f} MiB  native: greedy {'ok' if n['greedy_ok'] else 'DIFF'}"
            f" top20 max {n['top20_max']:.3f} mean {n['top20_mean']:.3f} | avx2: greedy "
            f"{'ok' if a['greedy_ok'] else 'DIFF'} max {a['top20_max']:.3f} mean {a['top20_mean']:.3f}"
            f" | noise floor mean {row['noise_floor']['top20_mean']:.3f}"
            f" | llama.cpp self max {n['llamacpp_self_max']:.3f} mean {n['llamacpp_self_mean']:.3f}"
        )
        if ns.ppl:
            p = row["ppl"]
            line += (
                f" | ppl {p['ours']:.3f} vs {p['llamacpp']:.3f} ({p['vs_llamacpp']:+.2%}),"
                f" int8 {p['ours_int8']:.3f} ({p['int8_vs_llamacpp']:+.2%})"
            )
        if ns.speed:
            s = row["speed"]
            line += (
                f" | tg d16 {s['tg64_d16_tok_s']:.1f} vs {s['llamacpp_tok_s']:.1f} tok/s ({s['vs_llamacpp']:.2f}x),"
                f" load +{s['load_rss_rise_bytes'] / 2**20:.0f} MiB"
            )
        print(line, flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(doc, indent=1) + "\n")
    if ns.md and ns.json:
        write_md(Path(ns.md), ns.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
