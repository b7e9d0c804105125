"""`tightkv plan`: will this model and context fit, and which lever decides it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import TightKVError
from .flags import CTX_HELP, model_label, parse_size

NAME = "plan"
HELP = "memory plan: weights, KV per cache type, what fits (reads only the GGUF header)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("-c", "--ctx", type=int, default=None, help=CTX_HELP)
    p.add_argument("--mem", default=None, help="memory budget, e.g. 16GB or 8GiB (default: this machine's RAM)")
    p.add_argument("--compare", default=None, help="comma-separated KV types (default: a standard set)")
    p.add_argument(
        "--file",
        "-f",
        default=None,
        metavar="TEXT",
        help="probe the types' quality on this text, as --kv auto does (loads the model)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write the plan to this JSON file")
    p.add_argument(
        "-md",
        "--model-draft",
        default=None,
        metavar="MODEL",
        help="a draft model for speculative decoding (as run and serve take it): its weights and f16 KV at "
        "the context count too",
    )


def _probed_choice(ns: argparse.Namespace, plan, memory: int):
    """`--kv auto`'s choice for this budget and context, probed on --file."""
    from ..api import Model
    from ..autokv import choose

    path = Path(ns.file)
    if not path.is_file():
        raise TightKVError(f"{path}: no such text file")
    model = Model(ns.model, context_length=plan.context if plan.context <= plan.trained_context else None)
    return choose(model, path.read_text(encoding="utf-8", errors="replace"), memory, plan.context, text_name=path.name)


def run(ns: argparse.Namespace) -> int:
    import psutil

    from dataclasses import asdict

    from ..eval.engines import equivalents
    from ..eval.plan import PLAN_TYPES, format_plan, lever, make_plan, recommended
    from ..kv.spec import parse_kv
    from ..registry import resolve

    memory = parse_size(ns.mem, "--mem") if ns.mem else psutil.virtual_memory().total
    if ns.ctx is not None and ns.ctx < 0:
        raise TightKVError(f"-c/--ctx must be positive (or 0 for the model's context), got {ns.ctx}")
    kv_types = [k.strip() for k in ns.compare.split(",")] if ns.compare else PLAN_TYPES
    for k in kv_types:
        parse_kv(k)
    draft = resolve(ns.model_draft) if ns.model_draft else None
    plan = make_plan(resolve(ns.model), ns.ctx or None, memory, kv_types, model_label(ns.model), draft, ns.model_draft)
    choice = _probed_choice(ns, plan, memory) if ns.file else None
    print(format_plan(plan, choice))
    if ns.json:
        doc = {
            "model": plan.model,
            "file": plan.file,
            "context": plan.context,
            "memory": plan.memory,
            "weights": plan.weights,
            "working": plan.working,
            "recurrent": plan.recurrent,  # a hybrid model's recurrent state, its checkpoints included (in the fit)
            "recurrent_state": plan.recurrent_state,
            "draft": plan.draft,  # a draft model's weights, buffers and f16 KV (-md; in the fit)
            "read_per_token": plan.read.per_token,  # weight bytes a decoded token reads (the routed experts' share)
            "lever": lever(plan),
            "rows": plan.rows,
        }
        best = choice.kv if choice is not None else (recommended(plan) or {}).get("kv")
        if best is not None:
            doc["recommended"] = {
                "kv": best,
                "equivalents": [asdict(e) for e in equivalents(best, plan.layout, plan.context)],
                "kv_auto": choice.as_dict() if choice else None,
            }
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0
