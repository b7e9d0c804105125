"""RULER-style tasks (`tightkv niah --task`) at 4K, 8K and 16K tokens, 40 samples per
task and length, on f16 and the default cache, for one model: issue #52's goal is the
default's mean score within 3 points of f16 on every task, averaged over lengths.

    python bench/ruler.py MODEL [--lengths 4096,8192,16384] [--samples 40] [--types f16,kvarn4]
        [--name NAME] [--json PATH]

MODEL is a registry name or a .gguf path; the JSON goes to docs/bench/ruler_NAME.json
(NAME: the registry name with ':' as '-', or the file's stem). The haystack is the
essays (`tightkv.eval.corpus`). Each task is one `tightkv niah --task` run, merged into
the JSON as it ends, so an interrupted sweep resumes at the next task (a task already
there with the same lengths, samples and types is kept). Prefill dominates: the full
sweep is 6 tasks x 40 samples x (4,096 + 8,192 + 16,384) tokens, 6.9M prompt tokens a
type, many hours on 2 cores; `--samples` and `--lengths` size it (add 32768 where the
model's f16 scores above chance at 16K).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tightkv.eval.ruler import TASKS

ROOT = Path(__file__).resolve().parents[1]


def default_name(model: str) -> str:
    path = Path(model)
    return path.stem.lower() if model.endswith(".gguf") else model.replace(":", "-").replace("/", "-")


def run_task(ns, task: str, part: Path) -> dict:
    """One `tightkv niah --task TASK` over the lengths and types; its JSON."""
    cmd = [sys.executable, "-m", "tightkv.cli", "niah", ns.model, "--task", task, "--lengths", ns.lengths]
    cmd += ["--samples", str(ns.samples), "--seed", str(ns.seed), "--compare", ns.types]
    cmd += ["--haystack", str(ns.haystack), "--threads", str(ns.threads), "--json", str(part)]
    print("$ tightkv " + " ".join(cmd[3:]), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    doc = json.loads(part.read_text())
    return {"seconds": round(time.time() - t0), "prompts": doc["prompts"], "results": doc["results"][task]}


def summary(doc: dict) -> str:
    """Per task: each type's mean score over lengths, and the last type's difference from
    the first (the baseline) in points."""
    types = doc["types"].split(",")
    lines = [f"{'task':<12}" + "".join(f"{t:>12}" for t in types) + f"{'diff (pts)':>12}"]
    for task, run in doc["tasks"].items():
        means = []
        for t in types:
            scores = [x["score"] for x in run["results"][t]["samples"]]
            means.append(sum(scores) / len(scores))
        row = "".join(f"{m:>12.1%}" for m in means)
        lines.append(f"{task:<12}{row}{100 * (means[-1] - means[0]):>+12.1f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="registry name or .gguf path")
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--types", default="f16,kvarn4", help="the baseline first (default f16 and the default cache)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default=None, help="the JSON's model name (default: from MODEL)")
    ap.add_argument("--json", type=Path, default=None, help="default docs/bench/ruler_NAME.json")
    ns = ap.parse_args()
    from tightkv.eval.bench import machine
    from tightkv.eval.corpus import essays_path

    ns.haystack = essays_path()
    out = ns.json or ROOT / "docs" / "bench" / f"ruler_{ns.name or default_name(ns.model)}.json"
    doc = json.loads(out.read_text()) if out.exists() else {}
    same = {"lengths": ns.lengths, "samples": ns.samples, "seed": ns.seed, "types": ns.types}
    if any(doc.get(k) != v for k, v in same.items()):
        doc = {}  # another sweep's file: start again
    doc.update(model=ns.model, haystack=ns.haystack.name, **same, machine=machine(), tasks=doc.get("tasks", {}))
    part = out.with_suffix(".part.json")
    for task in ns.tasks.split(","):
        if task in doc["tasks"]:
            print(f"{task}: kept from {out}")
            continue
        doc["tasks"][task] = run_task(ns, task, part)
        doc["seconds"] = sum(run["seconds"] for run in doc["tasks"].values())
        out.write_text(json.dumps(doc, indent=1) + "\n")
    part.unlink(missing_ok=True)
    print(f"\n{ns.model}: mean score over lengths {ns.lengths}, {ns.samples} samples a task and length")
    print(summary(doc))
    print(f"wall time {doc['seconds']} s; {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
