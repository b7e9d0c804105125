"""Regenerate docs/benchmarks.md from the committed commands.

Each section runs one `tightkv` command with --json into docs/bench/, then the
page is assembled from whatever JSON is there. Sections:

    machine   CPU, cores, memory and measured read bandwidth
    memory    bench/load_memory.py: RSS rise from loading the embedded model
    ppl       tightkv ppl on the essays (ctx 2048, 6 chunks) across KV types
    niah-rerun  tightkv niah for NIAH_RERUN_TYPES only, merged into niah.json and niah.png
    ppl-texts the ppl protocol on both real models and on texts the defaults were not chosen on
              (bench/texts.py: late essays, the brief's docs/*.md with --brief DIR, Python source, Korean)
    kv-policy tightkv ppl (ctx 2048, 2 chunks) over exact sink and window sizes: the
              measurement behind each compressed type's defaults
    niah      tightkv niah on the essays (1K-8K x 5 depths) across KV types
    niah-needles  the same grid with two needles, questions and answers given as a user would
    speed     tightkv bench --vs-llamacpp at depths 16, 2048, 8192 (one JSON per kernel path)
    speed-qwen  the same on Qwen2.5-Coder-0.5B-Instruct (bench/qwen_model.py)
    synthetic bench/synthetic_llama.py: a KV-dominated Llama shape at 16K tokens, speed
              beside llama.cpp and peak RSS of f16 against the default compressed cache
    decode-memory  bench/decode_memory.py: peak RSS of decode steps at 32,000 tokens
    prefill-cost   bench/prefill_cost.py: an 8,192-token prefill into every compressed type against f16
                   (one JSON per kernel path)
    docqa     tightkv docqa: whole-document QA, full vs rag vs rlv, f16 and progressive
              (resumable; DOCQA_ARGS sets --quick or not)

The figures of the other docs come from sections run only by name (`sections.EXTRA` has
each one's commands, and the doc that cites them):

    weight-types      bench/weight_types.py: every llama.cpp file type against llama.cpp (docs/weight-types.md)
    vs-llamacpp       bench/vs_llamacpp.py --hf: tokens, greedy text and logits against llama.cpp live
    weight-kernels    bench/bench_qmatmul.py: each block type's dot, and the kernel/tiles crossover (docs/speed.md)
    attention-kernel  bench/bench_attention.py: the attention kernel alone at depth 8192, integer paths on/off
    step-overhead     bench/step_overhead.py: a decode step's time in the kernels and between them
    long-context      tightkv bench --pp-depths --ttft: a prompt at 32K, a 32K document's first token and
                      decode at 32K beside llama.cpp, both models (about an hour each on 2 cores)
    kv-auto           bench/kv_auto.py: what --kv auto picks under five budgets (needs --brief; docs/kv-cache.md)
    serving           bench/bench_serving.py: prefix reuse, concurrent streams beside llama-server, memory
                      (docs/server.md; --llama-server names the binary bench/build_llama_server.sh builds)
    sampling-cost     bench/sampling_cost.py: a sampled token's cost beside greedy, both models
    grammar-overhead  bench/grammar_overhead.py: a JSON-schema constraint's cost per token
    lm-eval           bench/lm_eval_server.py: lm-evaluation-harness through the server (needs lm_eval[api])
    fuzz-server       bench/fuzz_server.py: schemathesis over every route (needs schemathesis)
    web-screenshot    bench/web_screenshot.py: docs/web.png (needs chromium and playwright)
    endpoint-llamaserver  bench/endpoint_llamaserver.py: our checks on llama-server (docs/scale-out.md)
    ruler             bench/ruler.py: RULER-style tasks at 4K-16K, f16 and the default, both models (hours each)

    python bench/make_benchmarks.py                  # run every section of the page, write the page
    python bench/make_benchmarks.py --only ppl,speed # rerun some sections
    python bench/make_benchmarks.py --only speed --dry-run  # print the commands, run nothing
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
from tightkv.eval.corpus import essays_path

from render_benchmarks import render
from sections import (
    DOCQA_ARGS,
    DOCQA_TYPES,
    EXTRA,
    LEGACY_JSON,
    NIAH_RERUN_TYPES,
    NIAH_TYPES,
    OUT,
    POLICY_CHUNKS,
    PPL_TYPES,
    PREFILL_TYPES,
    ROOT,
    SECTIONS,
    SPEED_QWEN_TYPES,
    SPEED_TYPES,
    TEXTS_RUNS,
    USER_NEEDLES,
    USER_NEEDLE_TYPES,
    policy_types,
)

BRIEF = None  # --brief DIR: the project brief's docs folder, the `shared-docs` text of ppl-texts
LLAMA_SERVER = Path.home() / ".cache/tightkv/llama-server/build/bin/llama-server"  # --llama-server
DRY_RUN = False  # --dry-run: print each command instead of running it
RUNNABLE = [*SECTIONS, "niah-rerun", *EXTRA]


def tightkv(*args: str) -> None:
    cmd = [sys.executable, "-m", "tightkv.cli", *args]
    print("$ tightkv " + " ".join(args), flush=True)
    if not DRY_RUN:
        subprocess.run(cmd, check=True)


def script(name: str, *args: str) -> None:
    """python bench/NAME ARGS, in this Python."""
    print(f"$ python bench/{name} " + " ".join(args), flush=True)
    if not DRY_RUN:
        subprocess.run([sys.executable, str(ROOT / "bench" / name), *args], check=True)


class _Values(dict):
    """The placeholders of `sections.EXTRA`'s arguments, each worked out when first used."""

    def __missing__(self, key: str) -> str:
        if key == "qwen" and DRY_RUN:
            value = '"$(python bench/qwen_model.py)"'
        elif key == "qwen":
            from qwen_model import qwen_path  # bench/qwen_model.py: assembled from PyPI, verified

            value = str(qwen_path())
        elif key == "brief":
            if BRIEF is None:
                raise SystemExit("this section needs --brief DIR (the project brief's docs folder)")
            value = str(BRIEF)
        elif key.startswith("json_"):
            value = str(speed_path(key.removeprefix("json_")))
        else:
            raise KeyError(key)
        self[key] = value
        return value


def run_extra(name: str) -> None:
    values = _Values(out=str(OUT), root=str(ROOT), llama_server=str(LLAMA_SERVER))
    for name_, *args in EXTRA[name][1]:
        (tightkv if name_ == "tightkv" else lambda *a: script(name_, *a))(*(a.format_map(values) for a in args))


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
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    doc = {
        "cpu": cpu,
        "cores": psutil.cpu_count(logical=False),
        "threads": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "read_gb_s_2_threads": round(gbs, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    (OUT / "machine.json").write_text(json.dumps(doc, indent=1))


def run_section(name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if name in EXTRA:
        run_extra(name)
    elif DRY_RUN and name in ("machine", "ppl-texts", "niah-rerun"):
        print(f"$ ({name}: {'measured in this process' if name == 'machine' else 'several runs, merged'})")
    elif name == "machine":
        run_machine()
    elif name == "memory":
        script("load_memory.py", "--json", str(OUT / "memory.json"))
    elif name == "ppl":
        _ppl(PPL_TYPES, OUT / "ppl.json")
    elif name == "ppl-texts":
        run_texts()
    elif name == "kv-policy":
        _ppl(policy_types(), OUT / "kv_policy.json", chunks=POLICY_CHUNKS)
    elif name == "niah":
        _niah(NIAH_TYPES, OUT / "niah.json", ROOT / "docs" / "niah.png")
    elif name == "niah-rerun":
        _niah(NIAH_RERUN_TYPES, OUT / "niah_rerun.json", OUT / "niah_rerun.png")
        (OUT / "niah_rerun.png").unlink()
        whole = _merge("niah", OUT / "niah_rerun.json")
        from tightkv.eval.niah import heatmap

        heatmap(whole["results"], whole["lengths"], whole["depths"], str(ROOT / "docs" / "niah.png"))
    elif name == "niah-needles":
        flags = [x for n, q, a in USER_NEEDLES for x in ("--needle", n, "--question", q, "--answer", a)]
        _niah(USER_NEEDLE_TYPES, OUT / "niah_needles.json", ROOT / "docs" / "niah_needles.png", *flags)
    elif name == "docqa":
        tightkv(
            "docqa",
            "--compare",
            DOCQA_TYPES,
            *DOCQA_ARGS,
            "--threads",
            "2",
            "--essays",
            str(essays_path()),
            "--json",
            str(OUT / "docqa.json"),
        )
    elif name == "synthetic":
        script(
            "synthetic_llama.py",
            *[
                "--depth",
                "16384",
                "--n-gen",
                "32",
                "--ours",
                "f16,progressive",
                "--llamacpp",
                "f16",
                "--json",
                str(OUT / "synthetic_llama.json"),
            ],
        )
    elif name == "decode-memory":
        script(
            "decode_memory.py",
            *[
                "-n",
                "32000",
                "--compare",
                "f16,progressive,kvarn4",
                "--json",
                str(OUT / "decode_memory.json"),
            ],
        )
    elif name == "prefill-cost":
        script(
            "prefill_cost.py",
            *[
                "--compare",
                PREFILL_TYPES,
                "--rounds",
                "2",
                "--json",
                str(speed_path(name)),
            ],
        )
    elif name in ("speed", "speed-qwen"):
        from qwen_model import qwen_path  # bench/qwen_model.py: assembled from PyPI, verified

        model = [] if name == "speed" else [str(qwen_path())]
        tightkv(
            "bench",
            *model,
            "--depths",
            "16,2048,8192",
            "--n-gen",
            "64",
            "-r",
            "3",
            "-p",
            "512",
            "-c",
            "8448",
            "--compare",
            SPEED_TYPES if name == "speed" else SPEED_QWEN_TYPES,
            "--threads",
            "2",
            "--vs-llamacpp",
            "--json",
            str(speed_path(name)),
        )


def speed_path(name: str) -> Path:
    """Speed tables are kept per model and per kernel instruction path (machines differ)."""
    from tightkv.kernels import build

    build.library()
    simd = build.status().split("(")[-1].rstrip(")") if build.status().startswith("loaded") else "reference"
    stem = f"{name.replace('-', '_')}_{simd.replace('+', '_')}"
    return OUT / f"{LEGACY_JSON.get(stem, stem)}.json"


def run_texts() -> None:
    """The ppl protocol per model x held-out text (`TEXTS_RUNS`); each part is merged into
    ppl_texts.json as it ends, and a rerun skips the parts already there (delete the file,
    or a model's entry, to measure again)."""
    import tempfile

    from qwen_model import qwen_path
    from texts import held_out_texts

    path = OUT / "ppl_texts.json"
    doc = json.loads(path.read_text()) if path.exists() else {"ctx": 2048, "models": {}}
    texts = held_out_texts(essays_path(), BRIEF)
    with tempfile.TemporaryDirectory() as tmp:
        for label, (types, chunks, names) in TEXTS_RUNS.items():
            model = [] if label.startswith("gemma") else [str(qwen_path())]
            run = doc["models"].setdefault(label, {"types": types, "chunks": chunks, "texts": {}})
            assert (run["types"], run["chunks"]) == (types, chunks), f"{label}: other settings in {path}"
            for name in names:
                if name in run["texts"] or name not in texts:
                    continue
                src, part = Path(tmp) / f"{name}.txt", Path(tmp) / f"{name}.json"
                src.write_text(texts[name], encoding="utf-8")
                _ppl(types, part, text=src, chunks=chunks, model=model)
                run["texts"][name] = json.loads(part.read_text())["results"]
                path.write_text(json.dumps(doc, indent=1))


def _ppl(types: str, out: Path, text: Path | None = None, chunks: int = 6, model: list[str] = ()) -> None:
    tightkv(
        "ppl",
        *model,
        "--file",
        str(text or essays_path()),
        "--ctx",
        "2048",
        "--chunks",
        str(chunks),
        "--compare",
        types,
        "--threads",
        "2",
        "--json",
        str(out),
    )


def _niah(types: str, out: Path, png: Path, *flags: str) -> None:
    tightkv(
        "niah",
        "--lengths",
        "1024,4096,8192",
        "--depths",
        "0,25,50,75,100",
        "--haystack",
        str(essays_path()),
        "--compare",
        types,
        "--threads",
        "2",
        "--png",
        str(png),
        "--json",
        str(out),
        *flags,
    )


def _merge(name: str, part: Path) -> dict:
    """Replace the rows of `name`.json by those of a partial rerun, if its f16 baseline
    agrees with the old one (perplexity within 0.01%, needles passed alike)."""
    whole, new = json.loads((OUT / f"{name}.json").read_text()), json.loads(part.read_text())
    a, b = whole["results"]["f16"], new["results"]["f16"]
    if "ppl" in a:
        assert abs(a["ppl"] - b["ppl"]) < 1e-4 * a["ppl"], f"the f16 baseline moved: {a['ppl']} -> {b['ppl']}"
    else:
        assert [c["passed"] for c in a["cells"]] == [c["passed"] for c in b["cells"]], "the f16 baseline moved"
    whole["results"].update(new["results"])
    (OUT / f"{name}.json").write_text(json.dumps(whole, indent=1))
    part.unlink()
    return whole


def main() -> int:
    global BRIEF, LLAMA_SERVER, DRY_RUN
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated sections to run")
    ap.add_argument("--render", action="store_true", help="only rebuild the page from existing JSON")
    ap.add_argument("--brief", default=None, help="the project brief's docs folder (the shared-docs text of ppl-texts)")
    ap.add_argument("--llama-server", default=None, help=f"the llama-server binary (default {LLAMA_SERVER})")
    ap.add_argument("--dry-run", action="store_true", help="print each section's commands, run nothing")
    ns = ap.parse_args()
    BRIEF = Path(ns.brief) if ns.brief else None
    LLAMA_SERVER = Path(ns.llama_server) if ns.llama_server else LLAMA_SERVER
    DRY_RUN = ns.dry_run
    names = [n.strip() for n in ns.only.split(",")] if ns.only else SECTIONS
    unknown = [n for n in names if n not in RUNNABLE]
    if unknown:
        ap.error(f"no section {', '.join(unknown)}; the sections are {', '.join(RUNNABLE)}")
    if not ns.render:
        for name in names:
            run_section(name)
    if DRY_RUN:
        return 0
    (ROOT / "docs" / "benchmarks.md").write_text(render())
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
