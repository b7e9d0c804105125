"""`tightkv niah`: needle-in-a-haystack grid, JSON and a PNG heatmap."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import TightKVError
from .flags import add_endpoint_flags, add_model_flags, int_list, measured_entries, model_label

NAME = "niah"
HELP = "needle-in-a-haystack over lengths x depths, with a PNG heatmap"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--lengths", default="1024,4096,8192", help="prompt lengths in tokens")
    p.add_argument("--depths", default="0,25,50,75,100", help="needle depths in percent of the haystack")
    p.add_argument("--haystack", default=None, help="haystack text file (default: a built-in generated text)")
    p.add_argument("--needle", action="append", default=None, help="needle sentence (repeatable)")
    p.add_argument(
        "--question",
        action="append",
        default=None,
        help='question about it, one per needle; a plain question is asked as "Question: ...\\nAnswer:"',
    )
    p.add_argument(
        "--answer",
        action="append",
        default=None,
        help="the key fact the answer must contain (ignoring case), one per needle",
    )
    p.add_argument(
        "--task",
        default=None,
        help="RULER-style tasks instead of the needle grid, comma-separated: single, multikey, multivalue, "
        "multiquery, vt, cwe (or all); they place their needles at random depths, so --depths and --needle "
        "do not apply; a table per task, the mean score with its 95%% interval per type and length",
    )
    p.add_argument("--samples", type=int, default=10, help="prompts per task and length with --task (default 10)")
    p.add_argument("--seed", type=int, default=0, help="the tasks' prompts are fixed by it (default 0)")
    p.add_argument("--compare", default=None, help="comma-separated KV types (or endpoint URLs) run on the same grid")
    p.add_argument("--png", default=None, help="write the heatmap here")
    p.add_argument(
        "--json", default=None, metavar="FILE", help="also write the grid and every answer to this JSON file"
    )
    add_model_flags(p, kv_default="f16")
    add_endpoint_flags(p)


def _depths(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TightKVError(f"--depths takes comma-separated percentages, got '{text}'") from None
    if not values or min(values) < 0 or max(values) > 100:
        raise TightKVError(f"--depths must lie in 0..100, got '{text}'")
    return values


def _needles(ns):
    from ..eval.niah import DEFAULT_NEEDLES, Needle

    if not ns.needle:
        return DEFAULT_NEEDLES
    q, a = ns.question or [], ns.answer or []
    if not (len(ns.needle) == len(q) == len(a)):
        raise TightKVError("give one --question and one --answer for each --needle")
    if not all(x.strip() for x in [*ns.needle, *q, *a]):
        raise TightKVError("--needle, --question and --answer must not be empty")
    return [Needle.from_user(n, qq, aa) for n, qq, aa in zip(ns.needle, q, a)]


def _haystack(ns) -> str:
    from ..eval.niah import generated_haystack

    if not ns.haystack:
        return generated_haystack()
    path = Path(ns.haystack)
    if not path.is_file():
        raise TightKVError(f"{path}: no such haystack file")
    return path.read_text(encoding="utf-8", errors="replace")


def _open(ns):
    """(tokens, targets, the local model or None) of the entries measured."""
    from ..api import Model
    from ..eval.endpoint import LocalTarget, open_targets

    tokens, targets = open_targets(
        measured_entries(ns),
        lambda: Model(ns.model, threads=ns.threads, context_length=ns.ctx or None),
        ns.model is not None,
        ns.api_key,
        ns.served_model,
    )
    return tokens, targets, next((t.model for t in targets if isinstance(t, LocalTarget)), None)


def _figure_label(ns, local, targets) -> str:
    return model_label(ns.model) if local is not None or ns.model else targets[0].endpoint.model


def run(ns: argparse.Namespace) -> int:
    from ..eval.niah import format_grid, heatmap, run_grid

    lengths = int_list(ns.lengths, "--lengths")
    if ns.task is not None:
        return _run_tasks(ns, lengths)
    depths, needles = _depths(ns.depths), _needles(ns)
    haystack = _haystack(ns)
    tokens, targets, local = _open(ns)
    if local is not None and max(lengths) + 16 > local.context_length:
        raise TightKVError(f"length {max(lengths)} does not fit the context of {local.context_length}")
    results = run_grid(tokens, haystack, lengths, depths, targets, needles)
    print(format_grid(results, lengths, depths))
    label = _figure_label(ns, local, targets)
    doc = {
        "model": tokens.source,
        "lengths": lengths,
        "depths": depths,
        "needles": [n.__dict__ for n in needles],
        "results": results,
    }
    return _write(ns, lambda png: heatmap(results, lengths, depths, png, model=label, needles=needles), doc)


def _write(ns: argparse.Namespace, draw, doc: dict) -> int:
    """The heatmap (`draw(path)`) under --png and the JSON under --json, each where asked."""
    if ns.png:
        draw(ns.png)
        print(f"heatmap: {ns.png}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0


def _check_room(lengths: list[int], tasks: list[str], targets, local) -> None:
    """A length whose prompt and answer the model's context cannot hold is an error
    (never a silent truncation); an endpoint that does not say its context is trusted."""
    from ..eval.endpoint import EndpointTarget
    from ..eval.ruler import ANSWER_TOKENS

    need = max(lengths) + max(ANSWER_TOKENS[t] for t in tasks)
    places = [(local.context_length, "the context")] if local is not None else []
    places += [(t.endpoint.context_length, f"{t.label}'s context") for t in targets if isinstance(t, EndpointTarget)]
    for ctx, where in places:
        if ctx is not None and need > ctx:
            raise TightKVError(
                f"length {max(lengths)} and its answer ({need} tokens) do not fit {where} of {ctx} tokens"
            )


def _run_tasks(ns: argparse.Namespace, lengths: list[int]) -> int:
    """`niah --task`: the RULER-style tasks over lengths x targets."""
    from ..eval.ruler import Generator, format_tables, heatmap, parse_tasks, run_tasks

    tasks = parse_tasks(ns.task)
    if ns.samples < 1:
        raise TightKVError(f"--samples must be at least 1, got {ns.samples}")
    if ns.needle or ns.question or ns.answer:
        raise TightKVError("--needle, --question and --answer do not apply to --task")
    haystack = _haystack(ns)
    tokens, targets, local = _open(ns)
    _check_room(lengths, tasks, targets, local)
    prompts, results = run_tasks(Generator(tokens, haystack), tasks, lengths, ns.samples, ns.seed, targets)
    print(format_tables(results, lengths))
    label = _figure_label(ns, local, targets)
    doc = {
        "model": tokens.source,
        "tasks": tasks,
        "lengths": lengths,
        "samples": ns.samples,
        "seed": ns.seed,
        "prompts": [
            {"id": s.id, "task": s.task, "length": s.length, "tokens": len(s.ids), "expected": s.expected}
            for s in prompts
        ],
        "results": results,
    }
    return _write(ns, lambda png: heatmap(results, lengths, png, model=label), doc)
