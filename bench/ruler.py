"""RULER-style tasks (`tightkv niah --task`) at 4K, 8K and 16K tokens, 40 samples per
task and length, on f16 and the default cache, for one model: issue #52's goal is the
default's mean score within 3 points of f16 on every task, averaged over lengths.

    python bench/ruler.py MODEL [--lengths 4096,8192,16384] [--samples 40] [--types f16,kvarn4]
        [--tasks ...] [--name NAME] [--json PATH]

MODEL is a registry name or a .gguf path; the JSON goes to docs/bench/ruler_NAME.json
(NAME: the registry name with ':' as '-', or the file's stem). The haystack is the
essays (`tightkv.eval.corpus`). Each (length, task) is one `tightkv niah --task` run,
merged into the JSON as it ends: an interrupted sweep resumes at the next one, and a
later run with other lengths adds them (a sample's prompt depends only on the seed, task,
length and index, so a length run alone is the same as in a longer sweep). Shorter
lengths run first, every task at one length before the next. Prefill dominates: the full
sweep is 6 tasks x 40 samples x (4,096 + 8,192 + 16,384) tokens, 6.9M prompt tokens a
type, many hours on 2 cores (less since session 51: each type's prompts take the haystack
they share before their first needle from a prefix store, `eval.endpoint.LocalTarget`,
bit for bit what a cold prefill gives); `--samples`, `--lengths` and `--tasks` size it (add 32768
where the model's f16 scores above chance at 16K).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tightkv.errors import TightKVError
from tightkv.eval.ruler import TASKS, parse_tasks

ROOT = Path(__file__).resolve().parents[1]


def default_name(model: str) -> str:
    path = Path(model)
    return path.stem.lower() if model.endswith(".gguf") else model.replace(":", "-").replace("/", "-")


def run_one(ns, task: str, length: int, part: Path) -> dict:
    """One `tightkv niah --task TASK --lengths LENGTH` over the types: its JSON's cells
    and samples per type, and its wall time."""
    cmd = [sys.executable, "-m", "tightkv.cli", "niah", ns.model, "--task", task, "--lengths", str(length)]
    cmd += ["--samples", str(ns.samples), "--seed", str(ns.seed), "--compare", ns.types]
    cmd += ["--haystack", str(ns.haystack), "--threads", str(ns.threads), "--json", str(part)]
    print("$ tightkv " + " ".join(cmd[3:]), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)  # tightkv niah prints its own one-line error
    results = json.loads(part.read_text())["results"][task]
    return {"seconds": round(time.time() - t0), "results": results}


def merge(run: dict, one: dict, length: int) -> None:
    """Add one length's run to a task's results (each type's cells and samples)."""
    run["seconds"] = run.get("seconds", 0) + one["seconds"]
    for t, r in one["results"].items():
        into = run.setdefault("results", {}).setdefault(t, {"cells": {}, "samples": []})
        into["cells"][str(length)] = r["cells"][str(length)]
        into["samples"] = [s for s in into["samples"] if s["length"] != length] + r["samples"]


def summary(doc: dict) -> str:
    """Per task: the lengths measured, each type's mean score over them, and the last type's
    difference from the first (the baseline) in points."""
    types = doc["types"].split(",")
    lines = [f"{'task':<12}{'lengths':>18}" + "".join(f"{t:>12}" for t in types) + f"{'diff (pts)':>12}"]
    for task, run in doc["tasks"].items():
        lengths = ",".join(sorted(run["results"][types[0]]["cells"], key=int))
        means = []
        for t in types:
            scores = [x["score"] for x in run["results"][t]["samples"]]
            means.append(sum(scores) / len(scores))
        row = "".join(f"{m:>12.1%}" for m in means)
        lines.append(f"{task:<12}{lengths:>18}{row}{100 * (means[-1] - means[0]):>+12.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
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
    ns = ap.parse_args(argv)
    try:
        parse_tasks(ns.tasks)
        if any(int(n) < 1 for n in ns.lengths.split(",")):
            raise ValueError
    except TightKVError as err:
        ap.error(str(err))
    except ValueError:
        ap.error(f"--lengths must be positive integers, got {ns.lengths!r}")
    from tightkv.eval.bench import machine
    from tightkv.eval.corpus import essays_path

    ns.haystack = essays_path()
    out = ns.json or ROOT / "docs" / "bench" / f"ruler_{ns.name or default_name(ns.model)}.json"
    doc = json.loads(out.read_text()) if out.exists() else {}
    same = {"samples": ns.samples, "seed": ns.seed, "types": ns.types}
    if any(doc.get(k) != v for k, v in same.items()) or "lengths" in doc:
        doc = {}  # another sweep's file (or one of a whole sweep per task): start again
    doc.update(model=ns.model, haystack=ns.haystack.name, **same, machine=machine(), tasks=doc.get("tasks", {}))
    part = out.with_suffix(".part.json")
    for length in sorted(int(n) for n in ns.lengths.split(",")):
        for task in ns.tasks.split(","):
            run = doc["tasks"].setdefault(task, {})
            if str(length) in run.get("results", {}).get(ns.types.split(",")[0], {}).get("cells", {}):
                print(f"{task} at {length}: kept from {out}")
                continue
            try:
                one = run_one(ns, task, length, part)
            except subprocess.CalledProcessError as err:
                print(f"error: tightkv niah exited with {err.returncode} on {task} at {length}", file=sys.stderr)
                return err.returncode
            merge(run, one, length)
            doc["seconds"] = sum(r.get("seconds", 0) for r in doc["tasks"].values())
            out.write_text(json.dumps(doc, indent=1) + "\n")
    part.unlink(missing_ok=True)
    print(f"\n{ns.model}: mean score over the lengths measured, {ns.samples} samples a task and length")
    print(summary(doc))
    print(f"wall time {doc['seconds']} s; {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
