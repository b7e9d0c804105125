"""Long-context perplexity and KLD against f16, ours and llama.cpp's caches side by side (#52).

One chunk of the longest context per text, [BOS] + 32,767 tokens by default; the shorter
contexts (8K, 16K) are its prefixes (the model is causal), so one forward per cache type
serves all three. Positions past --score-from of each context are scored (0.75: the last
quarter, where the long-range attention is) against the next token; KLD is against the same
engine's f16 over the whole vocabulary.

Ours: each type's final hidden states at the scored positions are saved (under the cache
folder, so a stopped sweep resumes at the next type), then all types of a text are scored
together through the output layer, the f16 rows once. llama.cpp: `llama_ppl.score_llama`
(llama-cpp-python 0.3.36, flash attention on, its rotated quantized caches as its users get
them, and the types in --llama-unrotated once more with LLAMA_ATTN_ROT_DISABLE=1) on the same
token ids and positions. The JSON is rewritten after every cell and a cell already in it is
skipped: run the same command again to fill in what a stopped run left.

    python bench/ppl_long.py gemma3:270m --texts essays,code,korean --json docs/bench/ppl_long_gemma3-270m.json
    python bench/ppl_long.py qwen --texts essays --kinds f16,q8_0,kvarn4,tq3 --llama-kinds f16,q8_0,q4_0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = "f16,q8_0,k8v4,kvarn4,progressive,kvarn3,tq3,aggressive,kvarn2,tq2,kivi2"
LLAMA_KINDS = "f16,q8_0,q5_0,q4_1,iq4_nl,q4_0"
LLAMA_UNROTATED = "q4_0"
CTXS = "8192,16384,32768"
RICH = "rich==13.9.4"  # source code: a pinned package's Python sources from PyPI, concatenated


def package_code(spec: str = RICH) -> str:
    """The .py files of a pinned wheel from PyPI (fetched once into the cache, never installed),
    in path order."""
    import subprocess

    from tightkv.store import home

    cache = home() / "bench" / "wheels"
    name, version = spec.split("==")
    wheel = next(iter(cache.glob(f"{name}-{version}-*.whl")), None)
    if wheel is None:
        cache.mkdir(parents=True, exist_ok=True)
        print(f"fetching {spec} from PyPI for its source...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), spec], check=True)
        wheel = next(cache.glob(f"{name}-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        return "".join(z.read(n).decode("utf-8") for n in sorted(z.namelist()) if n.endswith(".py"))


def long_texts() -> dict[str, tuple[str, str]]:
    """Name -> (what it is, a function returning the text)."""
    import texts

    from tightkv.eval.corpus import essays_path

    essays = essays_path()
    return {
        "essays": ("the essays (English prose), from the start", lambda: essays.read_text(encoding="utf-8")),
        "code": (f"{RICH}'s Python sources from PyPI, in path order", package_code),
        "korean": ("konlpy 0.6.0's Korean constitution and bills (public records), from PyPI", texts.korean),
    }


def open_model(name: str, ctx: int, threads: int | None):
    from tightkv.api import Model

    if name == "qwen":
        import qwen_model

        name = str(qwen_model.qwen_path())
    return Model(name, threads=threads, context_length=ctx)


def hidden_path(model, text: str, kind: str, ctx: int, score_from: float) -> Path:
    from tightkv.store import home

    folder = home() / "bench" / "ppl_long"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{Path(model.path).stem}-{text}-{ctx}-{score_from:g}-{kind.replace(':', '_')}.pt"


def our_hidden(model, ids, positions, kind: str, path: Path):
    """The type's final hidden states at the scored positions, from disk if a run saved them."""
    import torch

    from tightkv.engine.score import scored_hidden
    from tightkv.progress import Progress

    if path.exists():
        return torch.load(path), None
    t0 = time.perf_counter()
    with Progress(f"{kind} forward", len(ids)) as bar:
        h = scored_hidden(model.net, ids, model.new_cache(kind), positions, 512, bar.update)
    torch.save(h, path)
    return h, time.perf_counter() - t0


def run_ours(model, ids, spans, kinds, cell, ctx, score_from, save) -> None:
    """Every missing type's forward, then all of the text's types scored together."""
    from tightkv.eval.ppl import PplResult, score_hidden, scored_positions
    from tightkv.kv.spec import kv_bytes_per_token
    from tightkv.progress import Progress

    todo = [k for k in kinds if k not in cell]
    if not todo:
        return
    positions = scored_positions(spans)
    names = ["f16"] + [k for k in todo if k != "f16"]
    hidden, seconds = {}, {}
    for kind in names:
        hidden[kind], seconds[kind] = our_hidden(
            model, ids, positions, kind, hidden_path(model, cell["text"], kind, ctx, score_from)
        )
    results = [{k: PplResult() for k in names} for _ in spans]
    t0 = time.perf_counter()
    with Progress("scoring", len(positions) * len(names)) as bar:
        score_hidden(model.net, hidden, ids, positions, spans, results, bar.update)
    scoring = time.perf_counter() - t0
    layout = model.net.cache_layout()
    for kind in todo:
        cell[kind] = {
            "by_ctx": {str(c): r[kind].summary() for c, r in zip(cell["ctxs"], results)},
            "bytes_per_token": {str(c): kv_bytes_per_token(kind, layout, c)["total_bytes"] / c for c in cell["ctxs"]},
            "forward_s": seconds[kind],
            "scoring_s": scoring / len(names),
        }
        save()
    for kind in todo:  # f16's stay, for the types a later run adds
        if kind != "f16":
            hidden_path(model, cell["text"], kind, ctx, score_from).unlink(missing_ok=True)


def run_llama(model, ids, spans, kinds, unrotated, cell, threads, save) -> None:
    """llama.cpp's caches, rotated (its default) and the `unrotated` ones without."""
    from llama_ppl import bytes_per_token, score_llama
    from tightkv.eval.ppl import PplResult, scored_positions

    positions = scored_positions(spans).numpy()
    for rotate, names in ((True, kinds), (False, unrotated)):
        todo = [k for k in names if (k if rotate else f"{k} unrotated") not in cell]
        if not todo:
            continue
        t0 = time.perf_counter()
        got = score_llama(str(model.path), ids, positions, ["f16", *[k for k in todo if k != "f16"]], rotate, threads)
        seconds = time.perf_counter() - t0
        for kind in todo:
            a = got[kind]
            by_ctx = {}
            for c, (lo, hi) in zip(cell["ctxs"], spans):
                inside = (a["pos"] >= lo) & (a["pos"] < hi)
                r = PplResult(a["nll"][inside].tolist(), a["kld"][inside].tolist(), a["same_top1"][inside].tolist())
                by_ctx[str(c)] = r.summary()
            cell[kind if rotate else f"{kind} unrotated"] = {
                "by_ctx": by_ctx,
                "bytes_per_token": {str(c): bytes_per_token(str(model.path), kind, c) for c in cell["ctxs"]},
                "seconds": seconds / len(todo),
                "rotated": rotate,
            }
        save()


def table(doc: dict) -> str:
    """Per model, text and context: each engine's types, ΔPPL and KLD against its own f16."""
    lines = []
    for text, engines in doc["texts"].items():
        for engine in ("tightkv", "llama.cpp"):
            cell = engines.get(engine, {})
            kinds = [k for k in cell if isinstance(cell[k], dict) and "by_ctx" in cell[k]]
            if not kinds or "f16" not in cell:
                continue
            for c in cell["ctxs"]:
                base = cell["f16"]["by_ctx"][str(c)]["ppl"]
                lines.append(f"\n{doc['model_name']} {text} {engine} context {c} (f16 PPL {base:.4f})")
                lines.append(f"{'kv':<18} {'B/token':>8} {'ΔPPL':>8} {'KLD':>8} {'p99.9':>7} {'top1':>7}")
                for k in kinds:
                    r, b = cell[k]["by_ctx"][str(c)], cell[k]["bytes_per_token"][str(c)]
                    lines.append(
                        f"{k:<18} {b:8.0f} {100 * (r['ppl'] / base - 1):+7.2f}% {r['kld_mean']:8.4f} "
                        f"{r['kld_p999']:7.3f} {100 * r['same_top1']:6.2f}%"
                    )
    return "\n".join(lines)


def main(argv=None) -> int:
    from tightkv.eval.bench import machine
    from tightkv.eval.ppl import chunks, windows

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="registry name or .gguf path, or 'qwen' (Qwen2.5-Coder-0.5B from PyPI)")
    p.add_argument("--texts", default="essays,code,korean")
    p.add_argument("--kinds", default=KINDS, help="our cache types (f16 is always the baseline)")
    p.add_argument("--llama-kinds", default=LLAMA_KINDS, help="llama.cpp's, rotated as its default ('' for none)")
    p.add_argument("--llama-unrotated", default=LLAMA_UNROTATED, help="llama.cpp's types once more, unrotated")
    p.add_argument("--ctxs", default=CTXS, help="contexts, each scored on the longest one's chunk")
    p.add_argument("--score-from", type=float, default=0.75)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)

    ctxs = sorted(int(c) for c in ns.ctxs.split(","))
    model = open_model(ns.model, ctxs[-1], ns.threads)
    out = Path(ns.json) if ns.json else None
    doc = json.loads(out.read_text()) if out and out.exists() else {}
    doc |= {"model": Path(model.path).name, "model_name": ns.model, "machine": machine(), "threads": ns.threads}
    doc |= {"score_from": ns.score_from, "chunks": 1}
    doc.setdefault("texts", {})
    sources = long_texts()

    def save() -> None:
        if out:
            out.write_text(json.dumps(doc, indent=1))

    spans = windows(ctxs, ns.score_from)
    t_start = time.perf_counter()
    for text in ns.texts.split(","):
        what, read = sources[text]
        tokens = model.tokenize(read(), add_bos=False)
        todo = chunks(tokens, model.tokenizer.bos_id, ctxs[-1], 1)
        if not todo:
            print(f"{text}: {len(tokens)} tokens, too short for a chunk of {ctxs[-1]}", file=sys.stderr)
            continue
        ids = todo[0]
        engines = doc["texts"].setdefault(text, {"source": what, "tokens": len(tokens)})
        for engine in ("tightkv", "llama.cpp"):
            cell = engines.setdefault(engine, {})
            cell |= {"text": text, "ctxs": ctxs, "spans": spans}
        kinds = [k for k in ns.kinds.split(",") if k]
        run_ours(
            model, ids, spans, list(dict.fromkeys(["f16", *kinds])), engines["tightkv"], ctxs[-1], ns.score_from, save
        )
        llama_kinds = [k for k in ns.llama_kinds.split(",") if k]
        if llama_kinds:
            unrotated = [k for k in ns.llama_unrotated.split(",") if k]
            run_llama(
                model,
                ids,
                spans,
                list(dict.fromkeys(["f16", *llama_kinds])),
                unrotated,
                engines["llama.cpp"],
                ns.threads or 2,
                save,
            )
        save()
    doc["wall_s_last_run"] = time.perf_counter() - t_start
    save()
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
