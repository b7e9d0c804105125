"""Serving benchmark: prefix reuse across requests and restarts, and concurrent streams,
against a real `tightkv serve` on loopback through the official `openai` client.

    python bench/bench_serving.py                          # embedded Gemma, then Qwen if present
    python bench/bench_serving.py --models gemma3:270m --doc-tokens 8192 --json docs/bench/serving.json

prefix: a question about a document of --doc-tokens tokens (the essays), asked cold,
then with another question in the same server, then after a restart (the prompt
files on disk), then the first question again: time to first token of each, and
the cached tokens the server reports.

streams: N concurrent streaming chats (short prompts, --gen tokens each, greedy or at
--temperature) at N = 1, 2, 4, 8, after one untimed chat: aggregate decode rate, p50/p95 time to first token and
inter-token latency; slots of SLOT_CTX tokens, each server with its prompt cache as it
comes (ours: the prefix store; llama-server: its slots' and host-memory prompt caches).

llama-server: the same streams against llama.cpp's own server (-np 8, the same GGUF,
threads and context per slot; bench/build_llama_server.sh builds it).

memory: 8 concurrent conversations of 4,096 tokens: the server's peak KV bytes
(/metrics) and peak RSS, beside the computed bytes of the same slots in f16.

llamacpp-kv: the f16 KV llama.cpp (llama-cpp-python) allocates for the same 8 slots,
from its own log (flash attention on, swa_full off).

Each server runs under a private TIGHTKV_HOME (the real one's models and kernels
linked in), so the disk store starts empty.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOT_CTX = 4096  # context per slot in the streams sections (tightkv serve's default)
QWEN = (
    Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")
    / "models"
    / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_home(root: Path) -> Path:
    """A fresh TIGHTKV_HOME sharing the real one's kernels, blobs and manifests."""
    real = Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    for sub in ("kernels", "blobs", "manifests", "models"):
        if (real / sub).is_dir():
            (home / sub).symlink_to(real / sub, target_is_directory=True)
    return home


class Server:
    """`tightkv serve` on loopback, under a private TIGHTKV_HOME."""

    def __init__(self, model: str, home: Path, *args: str):
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "tightkv.cli",
            "serve",
            model,
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *args,
        ]
        self._start(cmd, {**os.environ, "TIGHTKV_HOME": str(home)})

    def _start(self, cmd: list[str], env: dict) -> None:
        """Run cmd and wait until GET /health answers 200 (5 minutes at most)."""
        import urllib.request

        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="bench-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(Path(self.log.name).read_text())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:  # refused, or 503 while the model loads
                time.sleep(0.3)
        raise RuntimeError("server did not start")

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=3600)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        Path(self.log.name).unlink(missing_ok=True)


class LlamaServer(Server):
    """llama.cpp's own `llama-server` (bench/build_llama_server.sh) on loopback, as its users
    run it (its defaults: flash attention auto, f16 KV, prompt cache and continuous
    batching on), with `parallel` slots of `ctx` tokens each and `threads` threads."""

    def __init__(self, binary: str, model_path: str, parallel: int, ctx: int, threads: int):
        self.port = free_port()
        self._start(
            [
                binary,
                "-m",
                model_path,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-np",
                str(parallel),
                "-c",
                str(ctx * parallel),
                "-t",
                str(threads),
                "--no-webui",
            ],
            dict(os.environ),
        )


def timed_chat(client, model: str, content: str, max_tokens: int, temperature: float = 0.0) -> dict:
    """One streamed chat: time to first token, inter-token gaps, usage."""
    t0 = time.perf_counter()
    first, stamps, usage, text = None, [], None, ""
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        temperature=temperature,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            stamps.append(now)
            text += chunk.choices[0].delta.content
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "ttft_s": round((first or time.perf_counter()) - t0, 3),
        "gaps": gaps,
        "text": text,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0,
        "completion_tokens": usage.completion_tokens if usage else 0,
    }


def document(model_path: str, tokens: int) -> str:
    """The essays cut to about `tokens` tokens of this model."""
    from tightkv import Model
    from tightkv.eval.corpus import essays

    m = Model(model_path)
    text = essays()[: tokens * 6]
    ids = m.tokenize(text, add_bos=False)[:tokens]
    return m.tokenizer.decode(ids)


def prefix_section(model: str, name: str, home: Path, doc_tokens: int, ctx: int, threads: int) -> dict:
    doc = document(model, doc_tokens)
    asks = {
        "cold": "What is the first essay about?",
        "warm (another question)": "Who wrote these essays?",
        "after restart (another question)": "What advice do the essays give?",
        "after restart (the first question)": "What is the first essay about?",
    }
    rows = []
    args = ("--ctx", str(ctx), "--threads", str(threads), "--parallel", "1")
    for labels in (list(asks)[:2], list(asks)[2:]):  # one server, then a restarted one over the same store
        srv = Server(model, home, *args)
        try:
            for label in labels:
                r = timed_chat(srv.client(), name, f"{doc}\n\nQuestion: {asks[label]}\nAnswer:", 16)
                rows.append({"request": label, **{k: v for k, v in r.items() if k not in ("gaps", "text")}})
                print(
                    f"  {label:<36} ttft {r['ttft_s']:7.2f}s  cached {r['cached_tokens']}/{r['prompt_tokens']}",
                    flush=True,
                )
        finally:
            srv.stop()
    cold = rows[0]["ttft_s"]
    for r in rows:
        r["ttft_vs_cold"] = round(r["ttft_s"] / cold, 4)
    return {"doc_tokens": doc_tokens, "ctx": ctx, "rows": rows}


def streams_section(
    model: str, name: str, home: Path, counts: list[int], gen: int, threads: int, temperature: float
) -> list[dict]:
    srv = Server(model, home, "--threads", str(threads), "--parallel", str(max(counts)), "--ctx", str(SLOT_CTX))
    try:
        return run_streams(srv, name, counts, gen, temperature)
    finally:
        srv.stop()


def llama_server_section(
    binary: str, model: str, name: str, counts: list[int], gen: int, threads: int, temperature: float
) -> list[dict]:
    """The streams of `streams_section`, against llama-server on the same GGUF, threads and
    context per slot."""
    from tightkv import registry

    path = str(registry.resolve(model, quiet=True)) if not model.endswith(".gguf") else model
    srv = LlamaServer(binary, path, max(counts), SLOT_CTX, threads)
    try:
        return run_streams(srv, name, counts, gen, temperature)
    finally:
        srv.stop()


def run_streams(srv, name: str, counts: list[int], gen: int, temperature: float) -> list[dict]:
    """N concurrent streaming chats for each N in counts: aggregate tokens per second of
    wall time, p50/p95 time to first token and inter-token latency. One untimed chat first:
    a server's first request pays its warm-up (allocations, template compilation)."""
    timed_chat(srv.client(), name, "Say hello.", 4)
    out = []
    for n in counts:
        results: list[dict] = [None] * n  # type: ignore[list-item]
        prompts = [f"Write a short story about a lighthouse keeper number {i}." for i in range(n)]

        def run(i: int) -> None:
            results[i] = timed_chat(srv.client(), name, prompts[i], gen, temperature)

        t0 = time.perf_counter()
        threads_ = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        wall = time.perf_counter() - t0
        ttft = sorted(r["ttft_s"] for r in results)
        gaps = sorted(g for r in results for g in r["gaps"])
        tokens = sum(r["completion_tokens"] for r in results)
        row = {
            "streams": n,
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "aggregate_tok_s": round(tokens / wall, 2),
            "ttft_p50_s": round(_pct(ttft, 50), 3),
            "ttft_p95_s": round(_pct(ttft, 95), 3),
            "itl_p50_ms": round(1e3 * _pct(gaps, 50), 1) if gaps else None,
            "itl_p95_ms": round(1e3 * _pct(gaps, 95), 1) if gaps else None,
        }
        out.append(row)
        print(
            f"  {n} streams: {row['aggregate_tok_s']:6.1f} tok/s aggregate, ttft p50 {row['ttft_p50_s']}s "
            f"p95 {row['ttft_p95_s']}s, itl p50 {row['itl_p50_ms']} ms p95 {row['itl_p95_ms']} ms",
            flush=True,
        )
    return out


def memory_section(model: str, name: str, home: Path, n: int, tokens: int, threads: int) -> dict:
    """`n` concurrent conversations of about `tokens` tokens each: the KV bytes the server
    holds at its peak (/metrics) and its peak RSS, beside what the same slots take in f16.
    Each answers up to 128 tokens, so that the first still decodes when the last prompt
    is in: all `n` caches are held at once."""
    import psutil
    import urllib.request

    doc = document(model, tokens - 64)
    srv = Server(
        model, home, "--threads", str(threads), "--parallel", str(n), "--ctx", str(tokens + 256), "--cache-ram", "0"
    )
    peak = {"kv": 0, "rss": 0}
    stop = threading.Event()

    def watch() -> None:
        proc = psutil.Process(srv.proc.pid)
        while not stop.is_set():
            with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("tightkv:kv_cache_bytes "):
                        peak["kv"] = max(peak["kv"], int(float(line.split()[1])))
            peak["rss"] = max(peak["rss"], proc.memory_info().rss)
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        jobs = [
            threading.Thread(
                target=timed_chat, args=(srv.client(), name, f"{doc}\n\nConversation {i}: what is this about?", 128)
            )
            for i in range(n)
        ]
        for t in jobs:
            t.start()
        for t in jobs:
            t.join()
    finally:
        stop.set()
        watcher.join(5)
        srv.stop()
    from tightkv import Model

    m = Model(model, context_length=tokens + 256)
    ours = {kv: n * sum(c.bytes_at(tokens) for c in m.new_cache(kv)) for kv in ("progressive", "f16")}
    row = {
        "conversations": n,
        "tokens_each": tokens,
        "peak_kv_bytes": peak["kv"],
        "peak_rss_bytes": peak["rss"],
        "computed_kv_bytes": ours,
    }
    print(
        f"  {n} x {tokens} tokens: peak KV {peak['kv'] / 2**20:.1f} MiB (computed {ours['progressive'] / 2**20:.1f}; "
        f"f16 {ours['f16'] / 2**20:.1f}), peak RSS {peak['rss'] / 2**20:.0f} MiB",
        flush=True,
    )
    return row


def llamacpp_kv(model: str, n: int, tokens: int) -> dict:
    """The f16 KV bytes llama.cpp (llama-cpp-python) allocates for one slot of `tokens`
    tokens with flash attention and swa_full off, from its own log, times `n` slots
    (llama-server -np n -c n*tokens gives each slot that many cells)."""
    import re

    from tightkv import registry

    path = str(registry.resolve(model, quiet=True)) if not model.endswith(".gguf") else model
    code = (
        "import sys; from llama_cpp import Llama; Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), "
        "flash_attn=True, swa_full=False, verbose=True, n_threads=1)"
    )
    r = subprocess.run([sys.executable, "-c", code, path, str(tokens)], capture_output=True, text=True, timeout=300)
    sizes = [float(x) for x in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", r.stderr)]
    if r.returncode or not sizes:
        return {"error": "llama-cpp-python did not report its KV cache"}
    slot = sum(sizes) * 2**20
    return {"slot_kv_bytes": int(slot), "kv_bytes": int(n * slot), "log_sizes_mib": sizes}


def _pct(xs: list[float], p: float) -> float:
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1]


def machine() -> dict:
    from tightkv.eval.bench import machine as cpu_and_kernels  # the CPU's name with its family and model

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {
        "cpu": cpu_and_kernels()["cpu"],
        "cores": os.cpu_count(),
        "avx512": " avx512f" in flags,
        "avx2": " avx2" in flags,
        "python": platform.python_version(),
    }


def _machine_text(m: dict) -> str:
    return f"{m['cpu']}, {m['cores']} cores, {'AVX-512' if m['avx512'] else 'AVX2, no AVX-512'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated (default: gemma3:270m, and Qwen2.5-Coder-0.5B when bench/qwen_model.py has assembled it)",
    )
    ap.add_argument("--doc-tokens", type=int, default=8192, help="document length in tokens (default 8192)")
    ap.add_argument("--streams", default="1,2,4,8", help="concurrent stream counts (default 1,2,4,8)")
    ap.add_argument("--gen", type=int, default=64, help="tokens per stream (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="server threads (default 2)")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the streams' sampling temperature (default 0, greedy; its rows go under streams_tT)",
    )
    ap.add_argument(
        "--sections",
        default="prefix,streams,memory,llamacpp-kv",
        help="any of prefix, streams, memory, llamacpp-kv, llama-server (default: all but llama-server)",
    )
    ap.add_argument(
        "--llama-server",
        default=str(Path.home() / ".cache/tightkv/llama-server/build/bin/llama-server"),
        help="llama-server binary for the llama-server section (bench/build_llama_server.sh)",
    )
    ap.add_argument("--json", default=None, metavar="FILE", help="write the results here")
    ns = ap.parse_args()
    models = ns.models.split(",") if ns.models else ["gemma3:270m"] + ([str(QWEN)] if QWEN.exists() else [])
    sections = ns.sections.split(",")
    if ns.temperature < 0:
        ap.error(f"--temperature must be >= 0, got {ns.temperature}")
    tag = f"_t{ns.temperature:g}" if ns.temperature else ""
    if "llama-server" in sections and not os.access(ns.llama_server, os.X_OK):
        ap.error(f"no llama-server at {ns.llama_server}: bash bench/build_llama_server.sh DIR builds it")
    old = json.loads(Path(ns.json).read_text()) if ns.json and Path(ns.json).exists() else {}
    command = "python bench/bench_serving.py " + " ".join(sys.argv[1:])
    result = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "commands": [c for c in old.get("commands", []) if c != command] + [command],
        "models": dict(old.get("models", {})),
    }
    for model in models:
        name = Path(model).stem if model.endswith(".gguf") else model
        print(f"{name}:", flush=True)
        entry: dict = {}
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
            home = private_home(Path(tmp))
            if "prefix" in sections:
                entry["prefix"] = prefix_section(model, name, home, ns.doc_tokens, ns.doc_tokens + 512, ns.threads)
            if "memory" in sections:
                entry["memory"] = memory_section(model, name, home, 8, 4096, ns.threads)
            if "llamacpp-kv" in sections:
                entry["llamacpp_f16_kv"] = llamacpp_kv(model, 8, 4096)
                print(f"  llama.cpp f16, 8 x 4096 tokens: {entry['llamacpp_f16_kv']}", flush=True)
            if "streams" in sections:
                counts = [int(x) for x in ns.streams.split(",")]
                entry["streams" + tag] = streams_section(model, name, home, counts, ns.gen, ns.threads, ns.temperature)
            if "llama-server" in sections:
                print("  llama-server:", flush=True)
                counts = [int(x) for x in ns.streams.split(",")]
                entry["llama_server_streams" + tag] = llama_server_section(
                    ns.llama_server, model, name, counts, ns.gen, ns.threads, ns.temperature
                )
            shutil.rmtree(home / "documents", ignore_errors=True)
        before = old.get("models", {}).get(name, {})
        entry["measured_on"] = {
            **{k: _machine_text(old["machine"]) for k in before if k != "measured_on"},
            **before.get("measured_on", {}),
            **{k: _machine_text(result["machine"]) for k in entry},
        }
        result["models"][name] = {**before, **entry}  # sections not rerun stay, with the machine they ran on
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {ns.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
