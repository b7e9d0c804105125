"""Our checks against llama.cpp's own server: `tightkv niah`, `docqa` and `ppl --endpoint`
on llama-server (built by bench/build_llama_server.sh from the llama.cpp source that
llama-cpp-python 0.3.36 vendors) with its f16 and q8_0 caches, on the embedded model,
beside the same commands run locally on the same types.

    python bench/endpoint_llamaserver.py [--server PATH] [--json docs/bench/endpoint_llamaserver.json]

llama-server runs with flash attention (`-fa on`, which its quantized V cache needs),
`-c 8448`, one slot and 2 threads; the needle grid is 1K-8K x 5 depths, docqa the
report set (10 company reports, 70 questions) in full and rag modes. llama-server
gives no prompt logprobs, so `ppl --endpoint` there is expected to stop with the
one-line message that says so; the local perplexity rows come from the same command
run locally. Each step's output is kept in the JSON, and a rerun skips the steps
already there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from live_server import start  # noqa: E402

DEFAULT_SERVER = Path.home() / ".cache/tightkv/llama-server/build/bin/llama-server"
NIAH = ["--lengths", "1024,2048,4096,8192", "--depths", "0,25,50,75,100"]
DOCQA = ["--sets", "report", "--reports", "10", "--modes", "full,rag"]
PPL_CTX, PPL_CHUNKS = "2048", "2"


def tightkv(*args: str) -> subprocess.CompletedProcess:
    print("$ tightkv " + " ".join(args), flush=True)
    return subprocess.run([sys.executable, "-m", "tightkv.cli", *args], capture_output=True, text=True)


def niah(where: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = tightkv("niah", *NIAH, *where, "--json", f.name)
        if r.returncode:
            raise SystemExit(r.stderr)
        results = json.loads(Path(f.name).read_text())["results"]
    return {
        k: {
            "passed": sum(c["passed"] for c in v["cells"]),
            "cells": len(v["cells"]),
            "failed": [c for c in v["cells"] if not c["passed"]],
        }
        for k, v in results.items()
    }


def docqa(where: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = tightkv("docqa", *DOCQA, *where, "--json", f.name, "--fresh")
        if r.returncode:
            raise SystemExit(r.stderr)
        runs = json.loads(Path(f.name).read_text())["runs"]
    return {k: {x: v[x] for x in ("correct", "n", "accuracy", "ci95", "sec_per_q")} for k, v in runs.items()}


def ppl(where: list[str], essays: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = tightkv("ppl", "-f", essays, "-c", PPL_CTX, "--chunks", PPL_CHUNKS, *where, "--json", f.name)
        if r.returncode:
            return {"error": r.stderr.strip().splitlines()[-1]}
        return json.loads(Path(f.name).read_text())["results"]


def llama_server(binary: Path, model: str, kv: str, port: int):
    cmd = [
        str(binary),
        "-m",
        model,
        "-c",
        "8448",
        "-fa",
        "on",
        "-ctk",
        kv,
        "-ctv",
        kv,
        "-np",
        "1",
        "-t",
        "2",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--no-webui",
    ]
    return start(cmd, port, timeout=300)


def table(doc: dict) -> str:
    lines = [
        "| engine | kv | needles (1K-8K x 5) | docqa full | s/question | docqa rag | s/question | "
        "PPL (essays, 2048 x 2) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kv in doc["types"]:
        for engine in ("tightkv", "llama-server"):
            row = doc["runs"].get(f"{engine}|{kv}", {})
            n = next(iter(row.get("niah", {}).values()), {})
            d = row.get("docqa", {})
            full = next((v for k, v in d.items() if "|full|" in k), None)
            rag = next((v for k, v in d.items() if "|rag|" in k), None)
            p = row.get("ppl", {})
            ptext = "no prompt logprobs" if "error" in p else (f"{p[kv]['ppl']:.4f}" if kv in p else "")
            acc = lambda r: f"{r['correct']}/{r['n']}" if r else ""  # noqa: E731
            sec = lambda r: f"{r['sec_per_q']:.2f}" if r else ""  # noqa: E731
            lines.append(
                f"| {engine} | {kv} | {n.get('passed', '')}/{n.get('cells', '')} | {acc(full)} | {sec(full)} | "
                f"{acc(rag)} | {sec(rag)} | {ptext} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=str(DEFAULT_SERVER), help="the llama-server binary")
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--port", type=int, default=8091)
    ap.add_argument("--json", default=None, help="results file (resumed if it exists)")
    ns = ap.parse_args()
    binary = Path(ns.server)
    if not binary.is_file():
        raise SystemExit(f"{binary}: no llama-server (build it: bash bench/build_llama_server.sh)")
    from tightkv.eval.corpus import essays_path
    from tightkv.registry import resolve

    model, essays = str(resolve(None)), str(essays_path())
    types = ns.types.split(",")
    out = Path(ns.json) if ns.json else None
    doc = json.loads(out.read_text()) if out and out.exists() else {}
    doc.update(
        {
            "model": "gemma3:270m",
            "types": types,
            "server": binary.name,
            "llama_server_flags": "-c 8448 -fa on -ctk T -ctv T -np 1 -t 2",
            "niah": NIAH,
            "docqa": DOCQA,
            "ppl": ["-c", PPL_CTX, "--chunks", PPL_CHUNKS],
        }
    )
    runs = doc.setdefault("runs", {})

    def save() -> None:
        if out:
            out.write_text(json.dumps(doc, indent=1))

    for kv in types:
        key = f"tightkv|{kv}"
        if key not in runs:
            runs[key] = {
                "niah": niah(["--kv", kv]),
                "docqa": docqa(["--compare", kv]),
                "ppl": ppl(["--kv", kv], essays),
            }
            save()
        key = f"llama-server|{kv}"
        if key not in runs:
            proc = llama_server(binary, model, kv, ns.port)
            url = f"http://127.0.0.1:{ns.port}/v1"
            try:
                runs[key] = {
                    "niah": niah(["--endpoint", url]),
                    "docqa": docqa(["--endpoint", url]),
                    "ppl": ppl(["--endpoint", url], essays),
                }
            finally:
                proc.terminate()
                proc.wait(30)
            save()
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
