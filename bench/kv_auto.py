"""What `--kv auto` chooses on two texts at five memory budgets, and whether the choice
holds the quality bar there (ΔPPL within +0.5% of f16, measured by perplexity on
the same text), plus the probe's cost beside a cold load of a 32K-token document.

    python bench/kv_auto.py --brief DIR [--json docs/bench/kv_auto.json]

Gemma 3 270M at a 32K context. The budgets sit between the KV sizes of neighbouring
types (weights and working buffers included), so each admits a known set: `q8_0`
(f16 does not fit), `kvarn4` (k8v4 does not), `progressive` (q4_0 and kivi4 do not),
`aggressive` (progressive does not) and `tq3` (only it fits). The texts are the
later essays (prose) and the brief's Markdown, where tq4 misses the bar. ΔPPL is
measured on 2 chunks of 2048 tokens for every chosen type (resumable: types already
in --json are kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from texts import held_out_texts  # noqa: E402

CTX = 32768
TIERS = [
    ("q8_0", "f16"),
    ("kvarn4", "k8v4"),
    ("progressive", "q4_0"),
    ("aggressive", "progressive"),
    ("tq3", "aggressive"),
]  # (largest type that fits, smallest that does not)
PPL_CHUNKS = 2


def budgets(plan) -> dict[str, int]:
    kv = {r["kv"]: r["kv_bytes"] for r in plan.rows}
    return {small: plan.weights + plan.working + (kv[small] + kv[large]) // 2 for small, large in TIERS}


def cold_load_seconds(model, ids: list[int], kv: str) -> float:
    """Seconds to prefill ids into a fresh cache of `kv`, 512 tokens per call."""
    import torch

    cache, t0 = model.new_cache(kv), time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(ids), 512):
            model.net(torch.tensor(ids[s : s + 512]), cache, logits_at=torch.tensor([], dtype=torch.long))
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--brief",
        type=Path,
        required=True,
        help="the project brief's docs/ folder (the Markdown text; given, never assumed)",
    )
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    from tightkv import Model
    from tightkv.errors import TightKVError
    from tightkv.eval.corpus import essays_path
    from tightkv.eval.plan import QUALITY_ORDER, make_plan
    from tightkv.eval.ppl import perplexity
    from tightkv.autokv import probe_ids, probe_kld
    from tightkv.kv.spec import DEFAULT

    model = Model(context_length=CTX, threads=2)
    texts = {k: v for k, v in held_out_texts(essays_path(), ns.brief).items() if k in ("essays-late", "shared-docs")}
    out = Path(ns.json) if ns.json else None
    doc = json.loads(out.read_text()) if out and out.exists() else {}
    doc.update({"model": "gemma3:270m", "context": CTX, "tiers": [t for t, _ in TIERS], "ppl_chunks": PPL_CHUNKS})
    plan = make_plan(model.path, CTX, 1 << 40, QUALITY_ORDER)
    doc["budgets"] = budgets(plan)

    def save() -> None:
        if out:
            out.write_text(json.dumps(doc, indent=1))

    if "cost" not in doc:  # the probe's cost (f16 and one type, cold) beside a cold 32K load of the default
        ids, _ = probe_ids(model, texts["essays-late"])
        t0 = time.perf_counter()
        probe_kld(model, ids, DEFAULT)
        probe_s = time.perf_counter() - t0
        long_ids = model.tokenize(texts["essays-late"])[: CTX - 512]
        load_s = cold_load_seconds(model, long_ids, DEFAULT)
        doc["cost"] = {
            "probe_s": round(probe_s, 2),
            "probe_tokens": len(ids),
            "cold_load_s": round(load_s, 2),
            "cold_load_tokens": len(long_ids),
            "kv": DEFAULT,
            "ratio": round(probe_s / load_s, 4),
        }
        print(f"probe {probe_s:.1f}s, cold load of {len(long_ids)} tokens {load_s:.1f}s", flush=True)
        save()
    choices = doc.setdefault("choices", {})
    ppl = doc.setdefault("ppl", {})
    for name, text in texts.items():
        for tier, memory in doc["budgets"].items():
            key = f"{name}|{tier}"
            if key not in choices:
                try:
                    c = model.choose_kv(text, memory=memory, context=CTX, text_name=name)
                    choices[key] = c.as_dict()
                except TightKVError as err:
                    choices[key] = {"kv": None, "error": str(err)}
                save()
        # every type chosen on this text, measured in one run beside f16
        todo = sorted(
            {c["kv"] for k, c in choices.items() if k.startswith(name + "|") and c["kv"]}
            - {k.split("|")[1] for k in ppl if k.startswith(name + "|")}
        )
        if todo:
            r = perplexity(model, text, 2048, PPL_CHUNKS, ["f16", *todo])
            for kv in todo:
                ppl[f"{name}|{kv}"] = {
                    "dppl": r[kv]["ppl"] / r["f16"]["ppl"] - 1,
                    "kld": r[kv]["kld_mean"],
                    "ppl": r[kv]["ppl"],
                    "f16_ppl": r["f16"]["ppl"],
                }
            save()
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    lines = [
        "| text | budget admits | auto chose | probed KLD | ΔPPL there (2 chunks) | KLD there | meets +0.5% |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for key, c in doc["choices"].items():
        name, tier = key.split("|")
        if not c.get("kv"):
            lines.append(f"| {name} | {tier} | none: {c['error'][:90]} | | | | |")
            continue
        p = doc["ppl"].get(f"{name}|{c['kv']}", {})
        dppl = f"{100 * p['dppl']:+.2f}%" if p else ""
        lines.append(
            f"| {name} | {tier} | {c['kv']} | {c['kld']:.5f} | {dppl} | {p.get('kld', 0):.5f} | "
            f"{'yes' if p and p['dppl'] <= 0.005 else 'no' if p else ''} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
