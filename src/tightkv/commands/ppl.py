"""`tightkv ppl`: perplexity and KLD against f16 (by default of the default cache,
kvarn4 or $TIGHTKV_KV_CACHE_TYPE; f16 is always run, as the baseline)."""

from __future__ import annotations

import argparse

from ..errors import TightKVError

from .flags import add_endpoint_flags, add_model_flags, measured_entries, model_label

NAME = "ppl"
HELP = "perplexity and KL divergence against the f16 cache (default: the default cache against f16)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="registry name or .gguf path (default: embedded)")
    p.add_argument("--file", "-f", required=True, help="text file to score")
    p.add_argument("--chunks", type=int, default=None, help="number of chunks (default: all)")
    p.add_argument(
        "--compare",
        default=None,
        help="comma-separated KV types or presets, e.g. f16,q8_0,tq4, or endpoint URLs; the first is the baseline "
        "(default: f16 and the default cache)",
    )
    p.add_argument("--json", default=None, help="write the results as JSON")
    p.add_argument("-b", "--batch", type=int, default=512, help="tokens per forward call within a chunk (default 512)")
    add_model_flags(
        p,
        kv_default="kvarn4, or $TIGHTKV_KV_CACHE_TYPE, measured against f16",
        ctx_help="tokens per scored chunk (default 2048)",
    )
    add_endpoint_flags(p)
    p.set_defaults(ctx=2048)


def default_entries() -> list[str]:
    """What `ppl` measures when no type is named: f16, the baseline, and the default cache
    (`kv.spec.resolve_kv`: $TIGHTKV_KV_CACHE_TYPE, else kvarn4), as its help promises."""
    import os

    from ..kv.spec import DEFAULT, ENV, is_auto, resolve_kv

    kind = DEFAULT if is_auto(os.environ.get(ENV)) else str(resolve_kv(None))  # auto: the built-in default
    return ["f16"] + ([kind] if kind != "f16" else [])


def run(ns: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..api import Model
    from ..eval.endpoint import TOP, is_endpoint, open_targets
    from ..eval.ppl import format_table, perplexity, perplexity_targets

    path = Path(ns.file)
    if not path.is_file():
        raise TightKVError(f"{path}: no such text file")
    if ns.ctx < 16:
        raise TightKVError(f"--ctx must be at least 16, got {ns.ctx}")
    if ns.batch < 1:
        raise TightKVError(f"--batch must be at least 1, got {ns.batch}")
    named = bool(ns.endpoint or ns.compare or ns.kv or ns.cache_type_k or ns.cache_type_v)
    entries = measured_entries(ns) if named else default_entries()
    text = path.read_text(encoding="utf-8", errors="replace")
    if any(map(is_endpoint, entries)):
        tokens, targets = open_targets(
            entries, lambda: Model(ns.model, threads=ns.threads), ns.model is not None, ns.api_key, ns.served_model
        )
        results, source = perplexity_targets(tokens, text, ns.ctx, ns.chunks, targets), tokens.source
    else:
        model = Model(ns.model, threads=ns.threads)
        for kind in entries:
            model.new_cache(kind)  # a bad type name fails here, before any work
        results, source = perplexity(model, text, ns.ctx, ns.chunks, entries, batch=ns.batch), str(model.path)
    print(format_table(results))
    base = next(iter(results.values()))
    print(f"Final estimate: PPL = {base['ppl']:.4f} +/- {base['ppl_stderr']:.5f}")
    if any(map(is_endpoint, entries)) and len(entries) > 1:
        print(
            f"KLD over the baseline's top {TOP} tokens and the rest as one outcome (a lower bound of the full "
            f"KLD): an endpoint gives at most {TOP} alternatives per position"
        )
    if ns.json:
        doc = {"model": source, "text": path.name, "ctx": ns.ctx, "chunks": ns.chunks, "results": results}
        if ns.model or not ns.endpoint:  # a local model: named as every verb names it (gemma3:270m)
            doc["model_name"] = model_label(ns.model)
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0
