"""Speculative decoding (#55): tokens per second with and without it, on three tasks at a
context of about 4K tokens, beside llama.cpp's own n-gram speculation on the same prompts.

    python bench/speculative.py [--models gemma,qwen] [--json docs/bench/speculative.json]

Tasks (each a document of about `--doc-tokens` tokens, then an instruction):
  qa    extractive: copy out, word for word, the paragraph of the essays that begins with ...
  edit  a code edit: one function of CPython's textwrap/shutil sources again, one name changed
  open  open generation: a short story on a theme the document does not touch

Each task runs greedily (`--n-gen` tokens) through our engine on its default KV cache
without speculation (`spec_type="none"`: lookup drafts are on by default) and with prompt
lookup (`--spec-type ngram-simple`), the two in turn `--repeat` times (the median of each),
and on Qwen's edit drafted by a Q2_K copy of Qwen made by llama.cpp's quantizer; then through
llama-server (built from the llama.cpp that llama-cpp-python 0.3.36 vendors:
bench/build_llama_server.sh) with flash attention, its f16 cache, 2 threads and one slot, once per `--llama-types` entry.
Both engines get the same prompt token ids. Decode speed is generated tokens over decode
seconds (the prompt excluded, as llama-server's `predicted_per_second`). The speculative
output is checked equal to the plain output (greedy: it must be, token for token).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from live_server import start

ROOT = Path(__file__).resolve().parents[1]
ESSAYS = ROOT.parent / "shared" / "data" / "essays.txt"
SERVER = Path.home() / ".cache/tightkv/llama-server/build/bin/llama-server"
LLAMA_TYPES = "none,ngram-simple,ngram-map-k,ngram-mod"
CODE = ["textwrap", "shutil"]
EDIT = ("wrap", "width", "line_width")  # the function, the name changed, its new name


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    isa = "AVX-512" if "avx512f" in info else "AVX2"
    return f"{cpu}, {isa}, {platform.machine()}"


def document(kind: str, tokenize, tokens: int) -> str:
    """About `tokens` tokens of the essays (prose) or of CPython's sources (code)."""
    if kind == "code":
        lib = Path(sysconfig.get_paths()["stdlib"])
        text = "".join((lib / f"{m}.py").read_text(encoding="utf-8") for m in CODE)
    else:
        text = ESSAYS.read_text(encoding="utf-8")
    lo, hi = 0, len(text)
    while hi - lo > 200:  # the longest prefix (at a line end) of about `tokens` tokens
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(tokenize(text[:mid])) <= tokens else (lo, mid)
    return text[: text.rfind("\n", 0, lo) + 1]


def tasks(tokenize, tokens: int) -> dict[str, tuple[str, str, str]]:
    """task -> (document, instruction for a chat model, how a base model's continuation starts)."""
    prose, code = document("prose", tokenize, tokens), document("code", tokenize, tokens)
    paras = [p for p in prose.split("\n\n") if len(p) > 400]
    para = paras[len(paras) // 2]
    opening = " ".join(para.split()[:10])
    fn, old, new = EDIT
    return {
        "qa": (
            prose,
            f'Copy out, word for word, the whole paragraph of the text above that begins with "{opening}".',
            f'The paragraph above that begins with "{opening}" reads, word for word:\n\n{opening}',
        ),
        "edit": (
            code,
            (
                f"Rewrite the function `{fn}` of the code above with one change: rename its parameter `{old}` "
                f"to `{new}` everywhere. Output only the whole function."
            ),
            f"# The function `{fn}` above again, with its parameter `{old}` renamed to `{new}`:\ndef {fn}(",
        ),
        "open": (
            prose,
            "Now write a long short story about a lighthouse keeper who finds a message in a bottle.",
            (
                "Now for something different. Here is a long story about a lighthouse keeper who finds a message "
                "in a bottle.\n\nChapter 1\n\n"
            ),
        ),
    }


def prompt_ids(model, doc: str, instruction: str, base_start: str) -> list[int]:
    if model.chat_template:
        return model.chat_ids([{"role": "user", "content": f"{doc}\n\n{instruction}"}])
    return model.tokenizer.encode(f"{doc}\n\n{base_start}", add_bos=True)


def ours(model, ids: list[int], n_gen: int, **spec) -> dict:
    r = model.generate(ids, max_tokens=n_gen, temperature=0.0, **spec)
    s = r.stats
    return {
        "tokens": s.generated_tokens,
        "decode_tps": round(s.generation_tps, 2),
        "draft_n": s.draft_n,
        "draft_n_accepted": s.draft_n_accepted,
        "ids": list(s.ids),
    }


def alternated(runs: list, repeat: int) -> list[dict]:
    """Each run `repeat` times, in turn (a busy machine slows them alike): the run with the
    median speed of each, its output checked the same every time."""
    results: list[list[dict]] = [[] for _ in runs]
    for _ in range(repeat):
        for run, out in zip(runs, results):
            out.append(run())
            assert out[-1]["ids"] == out[0]["ids"], "a greedy run gave another output"
    return [sorted(r, key=lambda x: x["decode_tps"])[len(r) // 2] for r in results]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama(server: Path, gguf: Path, spec_type: str, prompts: dict[str, list[int]], n_gen: int) -> dict:
    """One llama-server per speculation type; each task's prompt twice: one token first (the prompt read
    into the cache), then the timed reply. (ngram-mod's table outlives a request: a full first
    reply would be drafted from memory the second time.)"""
    port = free_port()
    cmd = [str(server), "-m", str(gguf), "--port", str(port), "-c", "8192", "-t", "2", "-tb", "2", "-np", "1"]
    cmd += ["-fa", "on", "--no-webui", "--spec-type", spec_type]
    proc = start(cmd, port, timeout=300)
    out = {}
    try:
        for task, ids in prompts.items():
            body = {"prompt": ids, "n_predict": n_gen, "temperature": 0.0, "top_k": 1, "cache_prompt": True}
            body["return_tokens"] = True
            for n_predict in (1, n_gen):  # the prompt read, then the timed reply
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/completion",
                    json.dumps(body | {"n_predict": n_predict}).encode(),
                    {"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=1200) as r:
                    res = json.load(r)
            t = res["timings"]
            out[task] = {
                "tokens": t["predicted_n"],
                "decode_tps": round(t["predicted_per_second"], 2),
                "draft_n": t.get("draft_n", 0),
                "draft_n_accepted": t.get("draft_n_accepted", 0),
                "ids": res.get("tokens", []),
            }
            print(f"  llama.cpp {spec_type:13s} {task:5s} {out[task]['decode_tps']:7.2f} tok/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def model_paths(name: str) -> tuple[Path, Path | None]:
    """(target GGUF, draft GGUF or None) of a model name."""
    from tightkv.registry import embedded_path

    if name == "gemma":
        return Path(embedded_path()), None
    import qwen_model

    target = Path(qwen_model.qwen_path())
    return target, requantized(target, "Q2_K")


def requantized(src: Path, ftype: str) -> Path:
    """`src` rewritten by llama.cpp's quantizer to `ftype` (cached beside it)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from requantized import _QUANTIZE

    out = src.with_name(f"{src.stem}-{ftype}.gguf")
    if not out.exists():
        subprocess.run(
            [sys.executable, "-c", _QUANTIZE, str(src), str(out), ftype, ""], check=True, capture_output=True
        )
    return out


def run_model(name: str, args) -> dict:
    from tightkv import Model

    target, draft = model_paths(name)
    model = Model(str(target), threads=2, context_length=8192)
    print(f"{name}: {target.name}, KV {model.kv}", flush=True)
    model.generate([model.tokenizer.bos_id or 0], max_tokens=2)  # kernels compiled and warm
    prompts, rows, tok = {}, {}, model.tokenizer
    for task, (doc, instruction, base) in tasks(lambda t: tok.encode(t, add_bos=False), args.doc_tokens).items():
        if task not in args.tasks:
            continue
        ids = prompt_ids(model, doc, instruction, base)
        prompts[task] = ids
        plain, spec = alternated(
            [
                lambda: ours(model, ids, args.n_gen, spec_type="none"),  # lookup drafts are on by default
                lambda: ours(model, ids, args.n_gen, spec_type="ngram-simple"),
            ],
            args.repeat,
        )
        row = {"prompt_tokens": len(ids), "plain": plain, "ngram-simple": spec}
        if draft is not None and task == "edit":
            row["draft"] = ours(model, ids, args.n_gen, spec_type="draft", model_draft=str(draft))
        for k in ("ngram-simple", "draft"):
            if k in row:
                row[k]["same_output"] = row[k]["ids"] == plain["ids"]
                row[k]["speedup"] = round(row[k]["decode_tps"] / plain["decode_tps"], 3)
        rows[task] = row
        print(
            f"  ours {task:5s} plain {plain['decode_tps']:7.2f} tok/s, ngram-simple {spec['decode_tps']:7.2f} "
            f"({spec['draft_n_accepted']}/{spec['draft_n']} accepted, same output: {spec['same_output']})",
            flush=True,
        )
    del model
    if args.server.exists():
        for t in args.llama_types.split(","):
            for task, res in llama(args.server, target, t, prompts, args.n_gen).items():
                rows[task].setdefault("llama.cpp", {})[t] = res
    for row in rows.values():
        ll = row.get("llama.cpp", {})
        best = max((v["decode_tps"] for k, v in ll.items() if k != "none"), default=None)
        if best:
            row["vs_llama_best_ngram"] = round(row["ngram-simple"]["decode_tps"] / best, 3)
        if "none" in ll:
            row["vs_llama_plain"] = round(row["plain"]["decode_tps"] / ll["none"]["decode_tps"], 3)
    return {"target": target.name, "draft": draft.name if draft else None, "tasks": rows}


def table(doc: dict) -> str:
    lines = [
        "| model | task | ours plain tok/s | ours ngram tok/s | speedup | accepted | draft model | llama.cpp best n-gram | ours/llama |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in doc["models"].items():
        for task, r in m["tasks"].items():
            s = r["ngram-simple"]
            ll = {k: v for k, v in r.get("llama.cpp", {}).items() if k != "none"}
            best = max(ll.items(), key=lambda kv: kv[1]["decode_tps"], default=None)
            d = r.get("draft")
            drafted = f"{d['decode_tps']} ({d['speedup']}x)" if d else "-"
            theirs = f"{best[1]['decode_tps']} ({best[0]})" if best else "-"
            lines.append(
                f"| {name} | {task} | {r['plain']['decode_tps']} | {s['decode_tps']} | {s['speedup']}x | "
                f"{s['draft_n_accepted']}/{s['draft_n']} | {drafted} | {theirs} | {r.get('vs_llama_best_ngram', '-')} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma,qwen")
    ap.add_argument("--tasks", default="qa,edit,open")
    ap.add_argument("--doc-tokens", type=int, default=3800)
    ap.add_argument("--n-gen", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=3, help="our plain and lookup runs, in turn: the median of each")
    ap.add_argument("--server", type=Path, default=SERVER)
    ap.add_argument("--llama-types", default=LLAMA_TYPES)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.tasks = args.tasks.split(",")
    if not args.server.exists():
        print(f"no llama-server at {args.server} (bench/build_llama_server.sh): ours only", file=sys.stderr)
    t0 = time.time()
    doc = {"machine": machine(), "threads": 2, "n_gen": args.n_gen, "models": {}}
    for name in args.models.split(","):
        doc["models"][name] = run_model(name, args)
    doc["seconds"] = round(time.time() - t0)
    print(table(doc))
    if args.json:
        for m in doc["models"].values():  # ids only as far as needed to compare, not in the JSON
            for r in m["tasks"].values():
                for v in [r["plain"], r["ngram-simple"], r.get("draft") or {}, *r.get("llama.cpp", {}).values()]:
                    v.pop("ids", None)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
