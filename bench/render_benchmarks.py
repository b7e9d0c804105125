"""docs/benchmarks.md from the JSON in docs/bench/ (`make_benchmarks.py --render` calls it)."""

from __future__ import annotations

import json

from sections import (
    DOCQA_ARGS,
    DOCQA_TYPES,
    LATE_ESSAYS,
    NIAH_RERUN_TYPES,
    NIAH_TYPES,
    OFF,
    OUT,
    POLICY_GRID,
    PPL_REFERENCE,
    PPL_TYPES,
    USER_NEEDLES,
    USER_NEEDLE_TYPES,
    policy_specs,
)


def render_texts(d: dict | None) -> list[str]:
    """ΔPPL and KLD per type on each held-out text, a table per model."""
    if not d or "models" not in d:
        return []
    runs = d["models"]
    lines = [
        "## Perplexity on other texts and the second model",
        "",
        f"`python bench/make_benchmarks.py --only ppl-texts --brief DIR`: the ppl protocol (ctx {d['ctx']}) "
        "on texts the defaults were not chosen on "
        f"(`bench/texts.py`): `essays-late`, the essays from character {LATE_ESSAYS:,} on (prose); "
        "`shared-docs`, this project's brief (technical Markdown with tables and code); `python-code`, "
        "CPython's standard-library sources; `korean`, the Korean constitution and bills of konlpy's corpus. "
        "Cells are ΔPPL vs f16 / mean KLD; the bar is +0.5% and 0.01.",
        "",
    ]
    for model, run in runs.items():
        texts = run["texts"]
        names = list(texts)
        if not names:
            continue
        lines += [
            f"**{model}** ({run['chunks']} chunks, `--compare {run['types']}`)",
            "",
            "| kv | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        for kv in texts[names[0]]:
            cells = []
            for name in names:
                r, base = texts[name][kv], texts[name]["f16"]["ppl"]
                cells.append(f"{100 * (r['ppl'] / base - 1):+.2f}% / {r['kld_mean']:.4f}")
            lines.append(f"| {kv} | " + " | ".join(cells) + " |")
        lines += ["| f16 PPL | " + " | ".join(f"{texts[n]['f16']['ppl']:.3f}" for n in names) + " |", ""]
    return lines


def render_ppl_long(d: dict) -> list[str]:
    """Long contexts (#52): ΔPPL and KLD against each engine's own f16 at each context, our
    types and llama.cpp's side by side, a table per text, bytes per token at the longest."""
    first_text = next(iter(d["texts"].values()))
    cell = first_text.get("tightkv") or first_text["llama.cpp"]
    ctxs, longest = [str(c) for c in cell["ctxs"]], str(cell["ctxs"][-1])
    parts = [
        f"## Long contexts: {d['model_name']}",
        "",
        f"`python bench/ppl_long.py {d['model_name']}` ({d['machine']['cpu']}, kernels {d['machine']['kernels']}): "
        f"one chunk of {longest} tokens per text, the shorter contexts its prefixes, positions past "
        f"{d['score_from']:g} of each context scored; KLD against the same engine's f16 over the whole vocabulary. "
        "llama.cpp: llama-cpp-python 0.3.36 with flash attention, its quantized caches rotated (its default) unless "
        "marked unrotated. Rows by bytes per token; the default in bold.",
        "",
    ]
    head = " | ".join(f"ΔPPL {c} | KLD {c}" for c in ctxs)
    for text, engines in d["texts"].items():
        rows = []
        for engine in ("tightkv", "llama.cpp"):
            cell = engines.get(engine, {})
            if "f16" in cell:
                rows += _ppl_long_rows(engine, cell, ctxs, longest)
        if rows:
            parts += [
                f"**{text}**: {engines['source']} ({engines['tokens']:,} tokens)",
                "",
                f"| engine | kv | KV B/token at {longest} | {head} | same top-1 at {longest} |",
                "|---|---|---:|" + "---:|---:|" * len(ctxs) + "---:|",
                *rows,
                "",
            ]
    return parts


def render_ruler(d: dict, name: str) -> list[str]:
    """RULER-style tasks (#52): each type's mean score per task and length with its 95% Wilson
    interval, the mean over the lengths measured, the last type's difference from the first, and
    how many of the same prompts it scored below and above the first."""
    types = d["types"].split(",")
    parts = [
        f"## RULER-style tasks: {d['model']}",
        "",
        f"`python bench/ruler.py {d['model']}` ({d['machine']['cpu']}, kernels {d['machine']['kernels']}; "
        f"[{name}](bench/{name})): {d['samples']} samples per task and length on the essays, seed {d['seed']}, "
        f"scored by exact containment; {d['seconds'] / 3600:.1f} hours of wall time so far.",
        "",
        f"The last column counts the samples (the same prompts) that {types[-1]} scored below and above {types[0]}.",
        "",
        "| task | length | " + " | ".join(types) + f" | {types[-1]} - {types[0]} (points) | samples lower / higher |",
        "|---|---:|" + "---:|" * (len(types) + 2),
    ]
    for task, run in d["tasks"].items():
        res = run["results"]
        lengths = sorted(res[types[0]]["cells"], key=int)
        for length in [*lengths, "mean"] if len(lengths) > 1 else lengths:
            base = {x["id"]: x["score"] for x in res[types[0]]["samples"] if length in ("mean", str(x["length"]))}
            last = {x["id"]: x["score"] for x in res[types[-1]]["samples"] if x["id"] in base}
            moved = f"{sum(last[i] < base[i] for i in last)} / {sum(last[i] > base[i] for i in last)}"
            means, cols = [], []
            for t in types:
                if length == "mean":
                    scores = [x["score"] for x in res[t]["samples"]]
                    means.append(sum(scores) / len(scores))
                    cols.append(f"{100 * means[-1]:.1f}%")
                else:
                    c = res[t]["cells"][length]
                    means.append(c["mean"])
                    cols.append(f"{100 * c['mean']:.1f}% [{100 * c['lo']:.0f}-{100 * c['hi']:.0f}]")
            label = f"**mean of {len(lengths)}**" if length == "mean" else length
            parts.append(
                f"| {task} | {label} | " + " | ".join(cols) + f" | {100 * (means[-1] - means[0]):+.1f} | {moved} |"
            )
    return parts + [""]


def _ppl_long_rows(engine: str, cell: dict, ctxs: list[str], longest: str) -> list[str]:
    kinds = [k for k, r in cell.items() if isinstance(r, dict) and "by_ctx" in r]
    rows = []
    for kind in sorted(kinds, key=lambda k: -cell[k]["bytes_per_token"][longest]):
        r = cell[kind]
        cols = []
        for c in ctxs:
            base, got = cell["f16"]["by_ctx"][c], r["by_ctx"][c]
            cols.append(f"{100 * (got['ppl'] / base['ppl'] - 1):+.2f}% | {got['kld_mean']:.4f}")
        name = f"**{kind}**" if (engine, kind) == ("tightkv", "kvarn4") else kind  # the default
        top1 = 100 * r["by_ctx"][longest]["same_top1"]
        rows.append(f"| {engine} | {name} | {r['bytes_per_token'][longest]:.0f} | {' | '.join(cols)} | {top1:.1f}% |")
    return rows


def render_policy(d: dict | None) -> list[str]:
    """ΔPPL and KLD of each type over exact sink and window sizes (defaults in bold)."""
    if not d:
        return []
    res, base = d["results"], d["results"]["f16"]["ppl"]
    lines = [
        "## Exact sink and window sizes",
        "",
        f"`python bench/make_benchmarks.py --only kv-policy` (= `tightkv ppl --file essays.txt --ctx 2048 "
        f"--chunks {d['chunks']} --compare f16,tq4,sink=0,window=128,...`, every point below). Each compressed "
        "type keeps its first `sink` and last `window` tokens exact, at 16 bits per element instead of 3-4. "
        "The window trades memory for quality; the defaults (bold) are the smallest windows that meet the KV "
        "issue's bar (ΔPPL +0.5% and KLD 0.01 at 4 bits, +1% and 0.02 at 3 bits) in this sweep: at 4 bits "
        "64 tokens sit at the edge and 128 meet it; at 3 bits 128 miss the KLD bar and 256 meet it. "
        "A 512-token window keeps Gemma 3's 15 sliding-window layers (512 tokens) wholly exact, so those rows "
        "say little about long documents. The sink is a fixed cost of a few tokens per layer: 0 is clearly "
        "worse, and between 4, 16 and 64 the differences are near this run's noise. Two chunks (2,046 scored "
        "tokens): ΔPPL moves by about ±0.3% with noise; KLD is the steadier figure.",
        "",
        "| type | sink | window | ΔPPL vs f16 | KLD mean | same top-1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    defaults = {kind: (sink, window) for kind, sink, window, *_ in POLICY_GRID}
    for kind, s, w, spec in policy_specs():
        r = res.get(spec)
        if r is None:
            continue
        bold = "**" if defaults[kind] == (s, w) else ""
        lines.append(
            f"| {kind} | {bold}{s}{bold} | {bold}{w}{bold} | {100 * (r['ppl'] / base - 1):+.2f}% | "
            f"{r['kld_mean']:.5f} | {100 * r['same_top1']:.2f}% |"
        )
    return lines + [""]


def _load(name: str) -> dict | None:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    text = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def contents(parts: list[str]) -> list[str]:
    """A list of links to the page's sections."""
    return [f"- [{h[3:]}](#{slug(h[3:])})" for h in parts if h.startswith("## ")] + [""]


def render() -> str:
    head = [
        "# Benchmarks",
        "",
        "Produced by `python bench/make_benchmarks.py` (`--only SECTION` reruns one, `--dry-run` prints the "
        "commands, `--render` rebuilds this page); the raw JSON is in `docs/bench/`. What the figures mean, "
        "beside the figures of the other sections of `make_benchmarks.py`: [kv-cache.md](kv-cache.md) "
        "(quality), [speed.md](speed.md) (speed against llama.cpp), [documents.md](documents.md) (document "
        "QA), [server.md](server.md) (serving) and [weight-types.md](weight-types.md).",
        "",
    ]
    parts = []
    m = _load("machine")
    if m:
        parts += [
            "## Machine",
            "",
            f"{m['cpu']}, {m['cores']} cores ({m['threads']} threads), {m['memory_gb']} GB RAM, "
            f"measured read bandwidth {m['read_gb_s_2_threads']} GB/s with 2 threads; "
            f"Python {m['python']}, torch {m['torch']}; measured {m['date']}. "
            "Absolute times on this shared machine are noisy; compare ratios from one run. "
            "The speed, prefill and memory tables each name the machine they ran on, all 2-core: `AMD EPYC` with kernels "
            "`avx512+vnni` an EPYC with AVX-512 VNNI, `AMD EPYC` with `avx2` a Zen 3 EPYC without AVX-512, and "
            "`AMD EPYC (family 23, model 49)` a Zen 2 EPYC (AVX2).",
            "",
        ]
    mem = _load("memory")
    if mem:
        parts += [
            "## Load memory",
            "",
            "`python bench/load_memory.py`",
            "",
            f"Loading the embedded model raises resident memory by {mem['rise_bytes'] / 1e6:.1f} MB over the "
            f"RSS after `import torch`; the bound is 1.3 x {mem['gguf_bytes'] / 1e6:.1f} MB + 100 MB = "
            f"{mem['bound_bytes'] / 1e6:.1f} MB ({'within' if mem['ok'] else 'OVER'}).",
            "",
        ]
    ppl = _load("ppl")
    if ppl:
        base = ppl["results"]["f16"]["ppl"]
        parts += [
            "## Perplexity and KLD against f16",
            "",
            f"`tightkv ppl --file essays.txt --ctx {ppl['ctx']} --chunks {ppl['chunks']} --compare {PPL_TYPES}`",
            "",
            "Every row's attention ran in the fused kernel.",
            "",
            "llama.cpp on the same protocol: f16 16.467, q8_0 16.470 (+0.02%), q4_0 17.990 (+9.2%).",
            "",
            "Each type runs with its default exact sink and recent window; the last two columns are "
            f"the same type with both turned off (`{OFF.lstrip(',')}`; progressive is tq4 with its window).",
            "",
            "| kv | PPL | ± | ΔPPL vs f16 | KLD mean | KLD p99 | KLD p99.9 | same top-1 | ΔPPL off | KLD off |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        res = ppl["results"]
        for kv, r in res.items():
            if kv.endswith(OFF):
                continue
            off = res.get(kv + OFF)
            off_cols = f"{100 * (off['ppl'] / base - 1):+.2f}% | {off['kld_mean']:.4f}" if off else " | "
            parts.append(
                f"| {kv} | {r['ppl']:.4f} | {r['ppl_stderr']:.4f} | {100 * (r['ppl'] / base - 1):+.2f}% | "
                f"{r['kld_mean']:.5f} | {r['kld_p99']:.4f} | {r['kld_p999']:.4f} | {100 * r['same_top1']:.2f}% | "
                f"{off_cols} |"
            )
        parts.append("")
        parts += render_reference(ppl, _load("ppl_reference"))
    parts += render_texts(_load("ppl_texts"))
    parts += render_policy(_load("kv_policy"))
    for path in sorted(OUT.glob("ppl_long_*.json")):
        parts += render_ppl_long(json.loads(path.read_text()))
    for path in sorted(OUT.glob("ruler_*.json")):
        if not path.name.endswith(".part.json"):  # a sweep's task in progress
            parts += render_ruler(json.loads(path.read_text()), path.name)
    niah = _load("niah")
    if niah:
        parts += [
            "## Needle in a haystack",
            "",
            f"`tightkv niah --lengths {','.join(map(str, niah['lengths']))} --depths "
            f"{','.join(f'{d:g}' for d in niah['depths'])} --haystack essays.txt --compare {NIAH_TYPES}`; "
            f"rows rerun later (after the kernel change, for the default's choice) by `python "
            f"bench/make_benchmarks.py --only niah-rerun` (now NIAH_RERUN_TYPES = {NIAH_RERUN_TYPES}).",
            "",
            "| kv | passed | failed cells (length @ depth) |",
            "|---|---:|---|",
        ]
        for kv, r in niah["results"].items():
            fails = [f"{c['length']}@{c['depth']:g}%" for c in r["cells"] if not c["passed"]]
            parts.append(f"| {kv} | {sum(c['passed'] for c in r['cells'])}/{len(r['cells'])} | {', '.join(fails)} |")
        parts += ["", "![needle heatmap](niah.png)", ""]
    parts += render_user_needles(_load("niah_needles"))
    for path in sorted(OUT.glob("speed*.json")):
        parts += render_speed(json.loads(path.read_text()), path.name, m)
    parts += render_synthetic(_load("synthetic_llama"))
    parts += render_decode_memory(_load("decode_memory"))
    for path in sorted(OUT.glob("prefill_cost*.json")):
        parts += render_prefill_cost(json.loads(path.read_text()))
    parts += render_docqa(_load("docqa"))
    return "\n".join(head + contents(parts) + parts)


def render_reference(ppl: dict, ref: dict | None) -> list[str]:
    """The fused kernel's rows beside the same types' last run on the torch reference path."""
    if not ref:
        return []
    lines = [
        "### Fused kernel against the reference path",
        "",
        f"The rows of {', '.join(PPL_REFERENCE)} (and their `{OFF.lstrip(',')}` variants) beside the same "
        "command's previous run (`docs/bench/ppl_reference.json`), when their attention ran on the torch "
        "reference path. ΔPPL is in points of the percentage, KLD in absolute terms.",
        "",
        "| kv | ΔPPL reference -> kernel | change | KLD reference -> kernel | change |",
        "|---|---:|---:|---:|---:|",
    ]
    base, rbase = ppl["results"]["f16"]["ppl"], ref["results"]["f16"]["ppl"]
    for kv in [t for t in PPL_REFERENCE] + [t + OFF for t in PPL_REFERENCE]:
        a, b = ref["results"].get(kv), ppl["results"].get(kv)
        if not (a and b):
            continue
        da, db = 100 * (a["ppl"] / rbase - 1), 100 * (b["ppl"] / base - 1)
        lines.append(
            f"| {kv} | {da:+.2f}% -> {db:+.2f}% | {db - da:+.2f} | {a['kld_mean']:.5f} -> {b['kld_mean']:.5f} "
            f"| {b['kld_mean'] - a['kld_mean']:+.5f} |"
        )
    return lines + [""]


def render_speed(speed: dict, name: str, m: dict | None) -> list[str]:
    """One speed table; the machine and llama.cpp's settings as the run recorded them."""
    mach = speed.get("machine")
    where = (
        f"on {mach['cpu']}, tightkv kernels {mach['kernels']}"
        if mach
        else "on the AVX-512 VNNI machine of the Machine section, before llama.cpp ran with flash attention "
        "(llama-cpp-python's defaults: flash_attn off for f16, a full-size sliding-window cache)"
    )
    llama = speed.get("llama_settings")
    llama_s = f"llama.cpp with {', '.join(f'{k}={v}' for k, v in llama.items())}. " if llama else ""
    model = speed.get("model_name", "gemma3:270m")
    bw = (m or {}).get("read_gb_s_2_threads") if not mach else None
    types = ",".join(dict.fromkeys(r["kv"] for r in speed["rows"] if r["engine"] == "tightkv"))
    command = speed.get("command") or (
        f"tightkv bench {'' if model == 'gemma3:270m' else model + ' '}--depths "
        f"16,2048,8192 --n-gen 64 -r 3 -p 512 -c 8448 --compare {types} --vs-llamacpp"
    )
    forced = (
        f" with TIGHTKV_SIMD={speed['simd_forced']}, llama.cpp from `bench/build_llama_avx2.sh` on PYTHONPATH "
        f"(built with {speed.get('llama_build', '?')})"
        if speed.get("simd_forced")
        else ""
    )
    parts = [
        f"## Speed beside llama.cpp: {model} ({name})",
        "",
        f"`{command}` ({speed['threads']} threads, medians of "
        f"{speed['reps']} runs, same GGUF and token ids), {where}{forced}. {llama_s}"
        "GB/s counts weights plus the KV cache read per token" + (f", against the measured {bw} GB/s." if bw else "."),
        "",
        "| engine | kv | test | t/s | vs llama.cpp f16 | vs llama.cpp q8_0 | GB/s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    theirs = {(r["test"], r["kv"]): r["tok_s"] for r in speed["rows"] if r["engine"] == "llama.cpp"}
    for r in speed["rows"]:
        f16, q8 = theirs.get((r["test"], "f16")), theirs.get((r["test"], "q8_0"))
        ours = r["engine"] == "tightkv"
        vs16 = f"{r['tok_s'] / f16:.2f}x" if ours and f16 else ""
        vs8 = f"{r['tok_s'] / q8:.2f}x" if ours and q8 else ""
        gbs = f"{r['gb_s']} ({100 * r['gb_s'] / bw:.0f}%)" if r["gb_s"] and bw else (r["gb_s"] or "")
        parts.append(f"| {r['engine']} | {r['kv']} | {r['test']} | {r['tok_s']:.2f} | {vs16} | {vs8} | {gbs} |")
    parts.append("")
    return parts


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def render_user_needles(d: dict | None) -> list[str]:
    """The needle grid with needles given as a user would (plain question, key fact)."""
    if not d:
        return []
    lines = [
        "### Needles given as a user would",
        "",
        "`python bench/make_benchmarks.py --only niah-needles`: the same grid and haystack with `--compare "
        f"{USER_NEEDLE_TYPES}` and two needles of `--needle TEXT --question TEXT --answer TEXT` (each "
        "length and depth runs once per needle; a plain question is asked as `Question: ...` / `Answer:`, "
        "and the key fact must appear in the answer, ignoring case):",
        "",
    ]
    lines += [f'- "{n}" / "{q}" / `{a}`' for n, q, a in USER_NEEDLES]
    lines += ["", "| kv | passed | failed cells (length @ depth: answer) |", "|---|---:|---|"]
    for kv, r in d["results"].items():
        fails = [
            f'{c["length"]}@{c["depth"]:g}% needle {c["needle"] + 1}: "{_cell(c["answer"][:40])}"'
            for c in r["cells"]
            if not c["passed"]
        ]
        lines.append(f"| {kv} | {sum(c['passed'] for c in r['cells'])}/{len(r['cells'])} | {'; '.join(fails)} |")
    return lines + ["", "![needles given as a user would](niah_needles.png)", ""]


def render_decode_memory(d: dict | None) -> list[str]:
    """Peak RSS of decode steps at a long context against the load RSS plus the cache's bytes."""
    if not d:
        return []
    mib = 2**20
    lines = [
        "## Memory of a decode step at a long context",
        "",
        f"`python bench/decode_memory.py -n {d['tokens']} --compare {','.join(r['kv'] for r in d['rows'])}` "
        f"(Gemma 3 270M, {d['machine']['cpu']}): each type in its own process fills {d['tokens']:,} tokens, "
        f"resets the peak-RSS counter and decodes {d['steps']} tokens. The bar: the decode's peak RSS within 5% "
        "of the load RSS plus the cache's own bytes (nothing that grows with the context is allocated per "
        "step). The RSS after the fill includes what the allocator kept from the prefill.",
        "",
        "| kv | load RSS MiB | cache MiB | RSS after fill MiB | decode peak RSS MiB | peak / (load + cache) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        lines.append(
            f"| {r['kv']} | {r['load_rss'] / mib:.0f} | {r['cache_bytes'] / mib:.1f} | "
            f"{r['filled_rss'] / mib:.0f} | {r['decode_peak_rss'] / mib:.0f} | {r['ratio']:.3f} |"
        )
    return lines + [""]


def render_prefill_cost(d: dict) -> list[str]:
    """An 8K prefill into each cache type against the first type's (f16)."""
    base = d["rows"][0]["kv"]
    lines = [
        "## Prefill cost of the compressed types",
        "",
        f"`{d['command']}` ({d['model']}, {d['machine']['cpu']}, kernels {d['machine']['kernels']}, "
        f"{d['date']}): {d['tokens']:,} tokens into each type, the types taking turns, medians of "
        f"{d['rounds']} rounds. The bar: at most 1.3x the f16 time.",
        "",
        f"| kv | tok/s | time vs {base} |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r['kv']} | {r['tok_s']:.1f} | {r['vs_first']:.2f}x |" for r in d["rows"]]
    return lines + [""]


def render_synthetic(d: dict | None) -> list[str]:
    """Decode speed and peak RSS of the KV-dominated synthetic Llama at 16K tokens."""
    if not d:
        return []
    rows = d["rows"]
    base = {r["kv"]: r["tg_tok_s"] for r in rows if r["engine"] == "llama.cpp"}
    c = d["config"]
    out = [
        "## Synthetic Llama at 16K tokens",
        "",
        "`python bench/synthetic_llama.py --depth 16384 --n-gen 32 --ours f16,progressive --llamacpp f16`: "
        f"{c['layers']} layers, {c['kv_heads']} KV heads of {c['head_dim']}, hidden {c['hidden']}, Q4_0 weights "
        f"(random), {d['threads']} threads; each row is a fresh process, so its peak RSS is the model plus "
        "its KV cache plus working memory.",
        "",
        "| engine | kv | tg t/s | vs llama.cpp f16 | vs llama.cpp q8_0 | pp t/s | KV MiB (computed) | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ours = r["engine"] == "tightkv"
        vs16 = f"{r['tg_tok_s'] / base['f16']:.2f}x" if ours and "f16" in base else ""
        vs8 = f"{r['tg_tok_s'] / base['q8_0']:.2f}x" if ours and "q8_0" in base else ""
        kv = f"{r['kv_bytes'] / 2**20:.0f}" if r["kv_bytes"] else ""
        out.append(
            f"| {r['engine']} | {r['kv']} | {r['tg_tok_s']:.2f} | {vs16} | {vs8} | {r['pp_tok_s']:.1f} | {kv} | "
            f"{r['peak_rss'] / 2**20:.0f} |"
        )
    ours = {r["kv"]: r for r in rows if r["engine"] == "tightkv"}
    small = next((k for k in ours if k != "f16"), None)
    if "f16" in ours and small:
        kv_diff = ours["f16"]["kv_bytes"] - ours[small]["kv_bytes"]
        rss_diff = ours["f16"]["peak_rss"] - ours[small]["peak_rss"]
        out += [
            "",
            f"Peak RSS of {small} is {rss_diff / 2**20:.0f} MiB below f16's; the computed KV difference is "
            f"{kv_diff / 2**20:.0f} MiB, so {100 * rss_diff / kv_diff:.0f}% of it shows up as real memory "
            "(the KV issue asks for at least 70%).",
        ]
    return out + [""]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _docqa_rows(d: dict) -> list[tuple[str, dict]]:
    """The runs in table order: by set, then mode, then KV type (a resumed run appends)."""
    sets, modes, kvs = (
        list(d.get("sets", {})),
        ["full", "full-plain", "rag", "rlv", "rlv-plain"],
        DOCQA_TYPES.split(","),
    )

    def order(item):
        name, mode, kv = item[0].split("|")
        return tuple(x.index(v) if v in x else len(x) for x, v in ((sets, name), (modes, mode), (kvs, kv)))

    return sorted(d["runs"].items(), key=order)


def _docqa_agreement(d: dict) -> list[str]:
    """Per set and mode, how the compressed cache's answers compare with f16's, question
    by question: the same text, right with one only, and f16's smallest answer margin there."""
    base, *others = DOCQA_TYPES.split(",")
    parts = []
    for key, r in _docqa_rows(d):
        name, mode, kv = key.split("|")
        for other in others if kv == base else []:
            o = d["runs"].get(f"{name}|{mode}|{other}")
            if not o or len(o["items"]) != len(r["items"]):
                continue
            pairs = list(zip(r["items"], o["items"]))
            same = sum(a["answer"] == b["answer"] for a, b in pairs)
            ours = sum(a["correct"] and not b["correct"] for a, b in pairs)
            theirs = sum(b["correct"] and not a["correct"] for a, b in pairs)
            margins = sorted(
                a["min_margin"] for a, b in pairs if a["correct"] != b["correct"] and a.get("min_margin") is not None
            )
            text = f"{name} {mode}: same answer {same}/{len(pairs)}, right with {base} only {ours}, with {other} only {theirs}"
            if margins:
                text += f" ({base} smallest answer margins there: {', '.join(f'{m:.2f}' for m in margins)})"
            parts.append(text)
    if not parts:
        return []
    return [f"{', '.join(others)} against {base}, question by question: " + "; ".join(parts) + ".", ""]


def render_docqa(d: dict | None) -> list[str]:
    """The whole-document QA section: accuracy with n and a 95% Wilson interval per
    set, mode and KV type, time per question, cold and warm time to first token."""
    if not d or not d.get("runs"):
        return []
    sets = d.get("sets", {})
    wm = d.get("working_memory") or {}
    used = d.get("working_memory_used") or {}
    out = [
        "## Whole-document QA",
        "",
        f"`tightkv docqa --compare {DOCQA_TYPES} {' '.join(DOCQA_ARGS)}` on {d.get('model', '')} "
        f"(seed {d.get('seed', 0)}, {d.get('threads', '?')} threads). Answers are greedy, one line, scored by "
        "containment of the expected answer (no LLM judge); what the numbers mean is discussed in "
        "[documents.md](documents.md#results). `full` and `rlv` quote the question's 5 best-matching "
        "sentences before it; `full-plain` and `rlv-plain` are the same modes without them. Sets:",
        "",
    ]
    for name, s in sets.items():
        kinds = {}
        for q in s["questions"]:
            kinds[q["kind"]] = kinds.get(q["kind"], 0) + 1
        desc = {
            "report": f"{s.get('docs', 1)} synthetic company reports (seeds "
            f"{', '.join(str(m.get('seed')) for m in s['meta'])}), 5 sections each"
            if isinstance(s.get("meta"), list)
            else "synthetic company report, 5 sections",
            "long": "essays with planted facts, beyond the 32K context",
            "long-prefix": "the longest prefix of `long` that full mode reads",
        }.get(name, name)
        size = f"{s['tokens']:,} tokens" + (" in all" if s.get("docs", 1) > 1 else "")
        out.append(f"- `{name}`: {desc}; {size}; " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + " questions")
    out.append("")
    if wm.get("rows"):
        rows = ", ".join(f"{r['doc_tokens']:,} tokens {r['correct']}/{r['n']}" for r in wm["rows"])
        out += [
            f"Working memory (`--measure-wm`, f16, planted facts asked with the whole text in context): {rows}. "
            "Working memory = the longest length before the first whose accuracy falls below "
            f"{_pct(wm['pass_rate'])} of the peak ({_pct(wm.get('peak', 1.0))}): **{wm['tokens']:,} tokens**. "
            "`auto` mode reads a document whole up to this length and uses RLV beyond it; every RLV call stays "
            "below it.",
            "",
        ]
    elif used:
        out += [f"Working memory used: {used.get('tokens')} tokens ({used.get('source')}).", ""]
    out += [
        "| set | mode | kv | accuracy | n | 95% CI | single | multi | s / question | cold TTFT | warm TTFT |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key, r in _docqa_rows(d):
        name, mode, kv = key.split("|")
        lo, hi = r["ci95"]
        single = _pct(r["accuracy_single"]) if "accuracy_single" in r else ""
        multi = _pct(r["accuracy_multi"]) if "accuracy_multi" in r else ""
        cold = f"{r['cold_ttft_s']:.2f}s" if "cold_ttft_s" in r else ""
        warm = f"{r['warm_ttft_s']:.2f}s" if "warm_ttft_s" in r else ""
        out.append(
            f"| {name} | {mode} | {kv} | {_pct(r['accuracy'])} | {r['n']} | {_pct(lo)}-{_pct(hi)} | {single} | "
            f"{multi} | {r['sec_per_q']:.1f}s | {cold} | {warm} |"
        )
    out.append("")
    prefix_ids = {q["id"] for q in sets.get("long-prefix", {}).get("questions", [])}
    if prefix_ids:
        cmp = []
        for key, r in _docqa_rows(d):
            name, mode, kv = key.split("|")
            if name in ("long", "long-prefix"):
                sub = [i for i in r["items"] if i["id"] in prefix_ids]
                cmp.append(f"{mode}/{kv} {sum(i['correct'] for i in sub)}/{len(sub)}")
        out += ["On the questions whose facts lie inside the prefix full mode can hold: " + ", ".join(cmp) + ".", ""]
    out += _docqa_agreement(d)
    reads = [(k, r["reads"]) for k, r in _docqa_rows(d) if r.get("reads")]
    if reads:
        out += [
            "RLV's checks over all reads (answers of single reads, right or wrong): "
            + "; ".join(
                f"{k.replace('|', ' ')}: {x['correct']}/{x['n']} right, yes/no margin AUC "
                f"{x['margin_auc'] if x['margin_auc'] is not None else 'n/a'}, verified "
                f"{x['verified_correct']}/{x['verified']} right"
                for k, x in reads
            )
            + ".",
            "",
        ]
    cold = [(k, r) for k, r in _docqa_rows(d) if "cold_ttft_s" in r and "warm_ttft_s" in r]
    if cold:
        out += [
            "Cold TTFT: a new session prefills the document and saves it (the model already loaded); warm TTFT: "
            "a new session loads the saved cache from disk; both include the question's own prefill. "
            "`s / question` is the time per question once the document is in the cache (full) or per retrieval "
            "and read (rag, rlv). "
            + "; ".join(
                f"{k.replace('|', ' ')}: {r['cold_ttft_s'] / max(r['warm_ttft_s'], 1e-9):.0f}x faster warm, "
                f"KV {r['kv_bytes'] / 1e6:.1f} MB"
                for k, r in cold
            )
            + ".",
            "",
        ]
    return out
