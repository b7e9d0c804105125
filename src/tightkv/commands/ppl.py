"""`tightkv ppl`: perplexity and KLD against f16 (by default of the default cache,
kvarn4 or $TIGHTKV_KV_CACHE_TYPE; f16 is always run, as the baseline)."""

from __future__ import annotations

import argparse

from ..errors import TightKVError
from .flags import add_endpoint_flags, add_model_flags, int_list, measured_entries, model_label

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
    p.add_argument(
        "--score-from",
        type=float,
        default=0.5,
        metavar="F",
        help="score the positions past this fraction of each context (default 0.5, llama-perplexity's second "
        "half; 0.75 scores the last quarter, where the long-range attention is)",
    )
    add_model_flags(
        p,
        kv_default="kvarn4, or $TIGHTKV_KV_CACHE_TYPE, measured against f16",
        ctx_help="tokens per scored chunk (default 2048); several, comma-separated (8192,16384,32768), score "
        "the shorter ones on the prefixes of the longest one's chunks: one forward per type serves them all",
        ctx_type=str,
    )
    add_endpoint_flags(p)
    p.set_defaults(ctx="2048")


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
    from ..eval.ppl import format_table, perplexity_at, perplexity_targets

    path = Path(ns.file)
    if not path.is_file():
        raise TightKVError(f"{path}: no such text file")
    ctxs = sorted(set(int_list(ns.ctx, "--ctx")))
    if ctxs[0] < 16:
        raise TightKVError(f"--ctx must be at least 16, got {ctxs[0]}")
    if not 0 <= ns.score_from < 1 or int(ctxs[0] * ns.score_from) >= ctxs[0] - 1:
        raise TightKVError(f"--score-from must leave positions to score in a context of {ctxs[0]}, got {ns.score_from}")
    if ns.batch < 1:
        raise TightKVError(f"--batch must be at least 1, got {ns.batch}")
    named = bool(ns.endpoint or ns.compare or ns.kv or ns.cache_type_k or ns.cache_type_v)
    entries = measured_entries(ns) if named else default_entries()
    text = path.read_text(encoding="utf-8", errors="replace")
    if any(map(is_endpoint, entries)):
        tokens, targets = open_targets(
            entries, lambda: Model(ns.model, threads=ns.threads), ns.model is not None, ns.api_key, ns.served_model
        )
        if len(ctxs) > 1 or ns.score_from != 0.5:
            raise TightKVError("an endpoint is scored at one --ctx, from its middle: no --score-from, one context")
        by_ctx = {ctxs[0]: perplexity_targets(tokens, text, ctxs[0], ns.chunks, targets)}
        source = tokens.source
    else:
        model = Model(ns.model, threads=ns.threads, context_length=ctxs[-1])  # past the trained context: one line
        for kind in entries:
            model.new_cache(kind)  # a bad type name fails here, before any work
        by_ctx = perplexity_at(model, text, ctxs, ns.chunks, entries, ns.score_from, batch=ns.batch)
        source = str(model.path)
    for ctx, results in by_ctx.items():
        if len(by_ctx) > 1:
            print(f"\ncontext {ctx}, positions {int(ctx * ns.score_from)}..{ctx - 2} scored")
        print(format_table(results))
    base = next(iter(by_ctx[ctxs[-1]].values()))
    print(f"Final estimate: PPL = {base['ppl']:.4f} +/- {base['ppl_stderr']:.5f}")
    if any(map(is_endpoint, entries)) and len(entries) > 1:
        print(
            f"KLD over the baseline's top {TOP} tokens and the rest as one outcome (a lower bound of the full "
            f"KLD): an endpoint gives at most {TOP} alternatives per position"
        )
    if ns.json:
        doc = {"model": source, "text": path.name, "ctx": ctxs[-1], "chunks": ns.chunks}
        doc |= {"score_from": ns.score_from, "results": by_ctx[ctxs[-1]]}
        if len(ctxs) > 1:
            doc["by_ctx"] = {str(c): r for c, r in by_ctx.items()}
        if ns.model or not ns.endpoint:  # a local model: named as every verb names it (gemma3:270m)
            doc["model_name"] = model_label(ns.model)
        Path(ns.json).write_text(json.dumps(doc, indent=1))
    return 0
