"""Regenerate docs/benchmarks.md from the committed commands.

Each section runs one `tightkv` command with --json into docs/bench/, then the
page is assembled from whatever JSON is there. Sections:

    machine   CPU, cores, memory and measured read bandwidth
    memory    bench/load_memory.py: RSS rise from loading the embedded model
    ppl       tightkv ppl on the essays (ctx 2048, 6 chunks) across KV types
    niah      tightkv niah on the essays (1K-8K x 5 depths) across KV types
    speed     tightkv bench --vs-llamacpp at depths 16, 2048, 8192

    python bench/make_benchmarks.py                  # run every section, write the page
    python bench/make_benchmarks.py --only ppl,speed # rerun some sections
    python bench/make_benchmarks.py --render         # only rebuild the page from the JSON
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
ESSAYS = ROOT.parent / "shared" / "data" / "essays.txt"
PPL_TYPES = "f16,q8_0,q4_0,tq4,tq3,kvarn4,kivi4,progressive,k8v4,aggressive"
NIAH_TYPES = "f16,q8_0,progressive,aggressive"
SPEED_TYPES = "f16,progressive"
SECTIONS = ["machine", "memory", "ppl", "niah", "speed"]


def tightkv(*args: str) -> None:
    cmd = [sys.executable, "-m", "tightkv.cli", *args]
    print("$ tightkv " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def run_machine() -> None:
    import psutil
    import torch

    torch.set_num_threads(2)
    x = torch.ones(128 * 2**20)  # 512 MB
    x.sum()
    import time

    t = time.perf_counter()
    for _ in range(5):
        x.sum()
    gbs = 5 * x.numel() * 4 / (time.perf_counter() - t) / 1e9
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    doc = {"cpu": cpu, "cores": psutil.cpu_count(logical=False), "threads": psutil.cpu_count(),
           "memory_gb": round(psutil.virtual_memory().total / 1e9, 1), "read_gb_s_2_threads": round(gbs, 1),
           "python": platform.python_version(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat()}
    (OUT / "machine.json").write_text(json.dumps(doc, indent=1))


def run_section(name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if name == "machine":
        run_machine()
    elif name == "memory":
        subprocess.run([sys.executable, str(ROOT / "bench" / "load_memory.py"), "--json", str(OUT / "memory.json")],
                       check=True)
    elif name == "ppl":
        tightkv("ppl", "--file", str(ESSAYS), "--ctx", "2048", "--chunks", "6", "--compare", PPL_TYPES,
                "--threads", "2", "--json", str(OUT / "ppl.json"))
    elif name == "niah":
        tightkv("niah", "--lengths", "1024,4096,8192", "--depths", "0,25,50,75,100", "--haystack", str(ESSAYS),
                "--compare", NIAH_TYPES, "--threads", "2", "--png", str(ROOT / "docs" / "niah.png"),
                "--json", str(OUT / "niah.json"))
    elif name == "speed":
        tightkv("bench", "--depths", "16,2048,8192", "--n-gen", "64", "-r", "3", "--compare", SPEED_TYPES,
                "--threads", "2", "--vs-llamacpp", "--json", str(OUT / "speed.json"))


def _load(name: str) -> dict | None:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render() -> str:
    parts = ["# Benchmarks", "",
             "Produced by `python bench/make_benchmarks.py`; the raw JSON is in `docs/bench/`.", ""]
    m = _load("machine")
    if m:
        parts += ["## Machine", "",
                  f"{m['cpu']}, {m['cores']} cores ({m['threads']} threads), {m['memory_gb']} GB RAM, "
                  f"measured read bandwidth {m['read_gb_s_2_threads']} GB/s with 2 threads; "
                  f"Python {m['python']}, torch {m['torch']}; measured {m['date']}. "
                  "Absolute times on this shared machine are noisy; compare ratios from one run.", ""]
    mem = _load("memory")
    if mem:
        parts += ["## Load memory", "", "`python bench/load_memory.py`", "",
                  f"Loading the embedded model raises resident memory by {mem['rise_bytes'] / 1e6:.1f} MB over the "
                  f"RSS after `import torch`; the bound is 1.3 x {mem['gguf_bytes'] / 1e6:.1f} MB + 100 MB = "
                  f"{mem['bound_bytes'] / 1e6:.1f} MB ({'within' if mem['ok'] else 'OVER'}).", ""]
    ppl = _load("ppl")
    if ppl:
        base = ppl["results"]["f16"]["ppl"]
        parts += ["## Perplexity and KLD against f16", "",
                  f"`tightkv ppl --file essays.txt --ctx {ppl['ctx']} --chunks {ppl['chunks']} --compare {PPL_TYPES}`",
                  "", "llama.cpp on the same protocol: f16 16.467, q8_0 16.470 (+0.02%), q4_0 17.990 (+9.2%).", "",
                  "| kv | PPL | ± | ΔPPL vs f16 | KLD mean | KLD p99 | KLD p99.9 | same top-1 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for kv, r in ppl["results"].items():
            parts.append(f"| {kv} | {r['ppl']:.4f} | {r['ppl_stderr']:.4f} | {100 * (r['ppl'] / base - 1):+.2f}% | "
                         f"{r['kld_mean']:.5f} | {r['kld_p99']:.4f} | {r['kld_p999']:.4f} | {100 * r['same_top1']:.2f}% |")
        parts.append("")
    niah = _load("niah")
    if niah:
        parts += ["## Needle in a haystack", "",
                  f"`tightkv niah --lengths {','.join(map(str, niah['lengths']))} --depths "
                  f"{','.join(f'{d:g}' for d in niah['depths'])} --haystack essays.txt --compare {NIAH_TYPES}`", "",
                  "| kv | passed | failed cells (length @ depth) |", "|---|---:|---|"]
        for kv, r in niah["results"].items():
            fails = [f"{c['length']}@{c['depth']:g}%" for c in r["cells"] if not c["passed"]]
            parts.append(f"| {kv} | {sum(c['passed'] for c in r['cells'])}/{len(r['cells'])} | {', '.join(fails)} |")
        parts += ["", "![needle heatmap](niah.png)", ""]
    speed = _load("speed")
    if speed:
        bw = (m or {}).get("read_gb_s_2_threads")
        parts += ["## Speed beside llama.cpp", "",
                  f"`tightkv bench --depths 16,2048,8192 --n-gen 64 -r 3 --compare {SPEED_TYPES} --vs-llamacpp` "
                  f"({speed['threads']} threads, medians of {speed['reps']} runs, same GGUF and token ids). "
                  "GB/s counts weights plus the KV cache read per token"
                  + (f", against the measured {bw} GB/s." if bw else "."), "",
                  "| engine | kv | test | t/s | vs llama.cpp f16 | vs llama.cpp q8_0 | GB/s |",
                  "|---|---|---|---:|---:|---:|---:|"]
        theirs = {(r["test"], r["kv"]): r["tok_s"] for r in speed["rows"] if r["engine"] == "llama.cpp"}
        for r in speed["rows"]:
            f16, q8 = theirs.get((r["test"], "f16")), theirs.get((r["test"], "q8_0"))
            ours = r["engine"] == "tightkv"
            vs16 = f"{r['tok_s'] / f16:.2f}x" if ours and f16 else ""
            vs8 = f"{r['tok_s'] / q8:.2f}x" if ours and q8 else ""
            parts.append(f"| {r['engine']} | {r['kv']} | {r['test']} | {r['tok_s']:.2f} | {vs16} | {vs8} | "
                         f"{r['gb_s'] or ''} |")
        parts.append("")
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated sections to run")
    ap.add_argument("--render", action="store_true", help="only rebuild the page from existing JSON")
    ns = ap.parse_args()
    if not ns.render:
        for name in (ns.only.split(",") if ns.only else SECTIONS):
            run_section(name.strip())
    (ROOT / "docs" / "benchmarks.md").write_text(render())
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
