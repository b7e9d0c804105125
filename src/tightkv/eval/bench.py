"""Prompt and generation speed, llama-bench style, optionally beside llama.cpp.

Tests: ``pp512`` (a 512-token prompt into an empty cache), ``pp512 @ dN`` (the
same prompt after N tokens of context, llama-bench's ``-d`` for pp), ``tg128 @ dN``
(128 decode steps after N tokens of context) and ``ttft N`` (a whole document of N
tokens into an empty cache, in the engine's own prompt chunks, and its first token
picked: the wait before a reply starts). Both engines get the same token
ids, the same threads and the same depths; no sampling is timed, as in
llama-bench. llama.cpp (llama-cpp-python) runs in a child process so that the
two engines' memory never mixes, and as its users run it: `LLAMA_SETTINGS`
(flash attention on, a window-sized cache for sliding-window layers: the
defaults of `llama-server` and `llama-cli`, not of llama-cpp-python).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..gguf.describe import read_per_token

LLAMA_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
LLAMA_SETTINGS = {"flash_attn": True, "swa_full": False}  # every llama.cpp row, f16 included
INSTALL_HINT = (
    "llama-cpp-python is not installed; install it with\n"
    '  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" pip install llama-cpp-python==0.3.36'
)

# A measurement is of the optimized kernels: a process that measures waits for their build
# rather than running the quick one a first run starts with (kernels.build, TIGHTKV_KERNEL_BUILD).
os.environ.setdefault("TIGHTKV_KERNEL_BUILD", "full")


@dataclass(frozen=True)
class Tests:
    """What each engine and KV type is timed on."""

    n_prompt: int = 512  # pp: prompt tokens (0: no pp test)
    n_gen: int = 128  # tg: decode steps
    depths: tuple[int, ...] = (16,)  # tg after this many tokens
    pp_depths: tuple[int, ...] = ()  # pp after this many tokens
    docs: tuple[int, ...] = ()  # ttft: documents of this many tokens

    def tokens(self) -> int:
        """The most tokens any test holds at once."""
        return max(
            [d + self.n_gen + 1 for d in self.depths]
            + [d + self.n_prompt for d in (0, *self.pp_depths) if self.n_prompt]
            + [*self.docs, 64]
        )


@dataclass
class Row:
    engine: str
    kv: str
    test: str
    depth: int
    tok_s: float
    tok_s_runs: list[float]
    kv_bytes: int = 0
    peak_rss: int = 0
    gb_s: float = 0.0
    build: str = ""  # llama.cpp rows: the instruction sets its library was built with
    seconds: float = 0.0  # pp and ttft rows: the median time of the timed part

    def summary(self) -> str:
        """One line, as llama-bench prints a row when it finishes."""
        return f"{self.engine} {self.kv} {self.test}: {self.tok_s:.2f} t/s"

    def as_dict(self) -> dict:
        return {
            "engine": self.engine,
            "kv": self.kv,
            "test": self.test,
            "depth": self.depth,
            "tok_s": round(self.tok_s, 2),
            "tok_s_runs": [round(x, 2) for x in self.tok_s_runs],
            "kv_bytes": self.kv_bytes,
            "peak_rss": self.peak_rss,
            "gb_s": round(self.gb_s, 2),
            **({"build": self.build} if self.build else {}),
            **({"seconds": round(self.seconds, 6)} if self.seconds else {}),
        }


def bench_tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    """Deterministic token ids, the same for both engines (past the first 1000
    ids, where the special tokens sit; past the first half in a tiny vocab)."""
    rng = np.random.default_rng(seed)
    low = 1000 if vocab > 2000 else vocab // 2
    return rng.integers(low, min(vocab, 200_000), size=n).tolist()


def test_name(kind: str, n: int, depth: int) -> str:
    return f"{kind}{n}" + (f" @ d{depth}" if depth else "")


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss, not inherited across exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def machine() -> dict:
    """The CPU and the kernels' instruction path, named beside every figure."""
    import platform

    from ..kernels import build

    cpu, info = platform.processor(), {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if sys.platform == "darwin":  # a Mac: "Apple M2 Pro"
        cpu = build.sysctl("machdep.cpu.brand_string") or cpu
    cpu = info.get("model name", cpu) or platform.machine()
    if "cpu family" in info:  # "AMD EPYC" alone does not say which generation
        cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    build.library()
    return {"cpu": cpu, "kernels": build.status()}


def write_json(path: str, script: str, **fields) -> None:
    """A benchmark script's JSON at `path`: the command that wrote it (`script` and this
    process's arguments), `fields`, the machine and the date."""
    import json
    import platform

    out = {
        "command": f"python {script} " + " ".join(sys.argv[1:]),
        **fields,
        "machine": {**machine(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
    }
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


# --- the tests, on either engine ---------------------------------------------------
@dataclass
class Measured:
    """One test's runs on one engine: tokens per second and seconds of each run."""

    kind: str  # pp, tg or ttft
    n: int  # prompt tokens, decode steps or document tokens
    depth: int
    tok_s: list[float]
    seconds: list[float]
    kv_bytes: int = 0


def measure(engine, tests: Tests, reps: int, on_test: Callable | None = None) -> list[Measured]:
    """Time `tests` on an engine (`_Ours` or `_Llama`, each with `vocab` and `bos`): reset(),
    eval(ids, label) (a prompt or a fill, in the engine's own chunks, a bar where labelled),
    step(id) (one decode step), first(ids, label) (eval, then the first token picked) and
    kv_bytes(); `on_test(Measured)` sees each test as it finishes."""
    vocab, bos, name = engine.vocab, engine.bos, engine.name
    out = []

    def run(kind: str, n: int, depth: int, fill: list[int], timed: Callable[[], object], warm=()) -> None:
        tok_s, seconds = [], []
        for _ in range(reps):
            engine.reset()
            if fill:
                engine.eval(fill, f"{name} filling d{depth}")
            for tok in warm:
                engine.step(tok)
            t = time.perf_counter()
            timed()
            seconds.append(time.perf_counter() - t)
            tok_s.append(n / seconds[-1])
        out.append(Measured(kind, n, depth, tok_s, seconds, engine.kv_bytes()))
        if on_test:
            on_test(out[-1])

    def context(depth: int) -> list[int]:
        return [bos] + bench_tokens(depth - 1, vocab, 2) if depth else []

    engine.reset()
    engine.eval([bos] + bench_tokens(63, vocab, 1))  # warm-up: kernels compiled, pages touched
    if tests.n_prompt:  # -p 0 skips the prompt tests, as in llama-bench
        for depth in (0, *tests.pp_depths):
            prompt = ([] if depth else [bos]) + bench_tokens(tests.n_prompt - (0 if depth else 1), vocab, 1)
            run("pp", tests.n_prompt, depth, context(depth), lambda: engine.eval(prompt))
    steps = bench_tokens(tests.n_gen + 1, vocab, 3)
    for depth in tests.depths:  # the first step warms the decode path, untimed
        run("tg", tests.n_gen, depth, context(depth), lambda: [engine.step(t) for t in steps[1:]], steps[:1])
    for n in tests.docs:
        doc = [bos] + bench_tokens(n - 1, vocab, 4)
        run("ttft", n, 0, [], lambda: engine.first(doc, f"{name} document of {n} tokens"))
    return out


class _Ours:
    """tightkv as `measure` drives it: the product's prefill and decode step on one KV type."""

    def __init__(self, model, kv: str):
        self.model, self.kv, self.name = model, kv, f"tightkv {kv}"  # the name labels its progress bars
        self.vocab, self.bos = model.args.vocab_size, model.tokenizer.bos_id
        self.cache: list = []

    def reset(self) -> None:
        self.cache = self.model.new_cache(self.kv)

    def eval(self, ids: list[int], label: str | None = None):
        from ..engine.generate import prefill

        bar = _fill_bar(label, len(ids)) if label else None
        return prefill(self.model.net, ids, self.cache, progress=bar)

    def step(self, tok: int) -> None:
        from ..engine.generate import decode_step

        decode_step(self.model.net, tok, self.cache)

    def first(self, ids: list[int], label: str) -> int:
        return int(self.eval(ids, label).argmax())

    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.cache)


def _fill_bar(what: str, total: int):
    """A progress callback for a fill or a document: a bar on stderr (tqdm on a terminal,
    plain lines elsewhere), closed with a summary line at the end unless the fill is one
    prefill piece (its row follows at once)."""
    from ..engine.generate import PREFILL_CHUNK
    from ..progress import Progress

    bar = Progress(what, total, unit="tok", stream=sys.stderr, summary=total > PREFILL_CHUNK)

    def update(done: int, _total: int) -> None:
        bar.advance_to(done)
        if done >= total:
            bar.close()

    return update


def _rows(engine: str, kv: str, measured: list[Measured], **fields) -> list[Row]:
    """Measured tests as table rows (the medians), with `fields` (peak RSS, build) on each."""
    return [
        Row(
            engine,
            kv,
            test_name(m.kind, m.n, m.depth) if m.kind != "ttft" else f"ttft {m.n}",
            m.depth,
            statistics.median(m.tok_s),
            m.tok_s,
            m.kv_bytes,
            seconds=statistics.median(m.seconds) if m.kind != "tg" else 0.0,
            **fields,
        )
        for m in measured
    ]


def run_tightkv(model, kv: str, tests: Tests, reps: int, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """tightkv's rows for one KV type; `on_row` sees each row as it finishes."""
    weight_bytes = read_per_token(model.gguf).per_token  # a mixture of experts: its routed experts' share

    def row(m: Measured) -> Row:
        (r,) = _rows("tightkv", kv, [m], peak_rss=peak_rss())
        if m.kind == "tg":
            r.gb_s = (weight_bytes + m.kv_bytes) * r.tok_s / 1e9
        return _report(r, on_row)

    rows = []
    measure(_Ours(model, kv), tests, reps, on_test=lambda m: rows.append(row(m)))
    return rows


def _report(row: Row, on_row: Callable[[Row], None] | None) -> Row:
    if on_row:
        on_row(row)
    return row


# --- llama.cpp (child process) --------------------------------------------------
class _Llama:
    """llama.cpp as `measure` drives it (llama-cpp-python's eval: its n_batch chunks)."""

    name = "llama.cpp"

    def __init__(self, m):
        self.m, self.vocab, self.bos = m, m.n_vocab(), m.token_bos()

    def reset(self) -> None:
        self.m.reset()

    def eval(self, ids: list[int], label: str | None = None) -> None:
        self.m.eval(ids)

    def step(self, tok: int) -> None:
        self.m.eval([tok])

    def first(self, ids: list[int], label: str) -> int:
        import llama_cpp

        self.m.eval(ids)  # keeps no logits without logits_all: the context's last row is read
        logits = llama_cpp.llama_get_logits_ith(self.m._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.vocab,))))

    def kv_bytes(self) -> int:
        return 0


def _llama_child(path, kv, tests, reps, threads, gpu_layers, queue):
    try:
        queue.put(("ok", _llama_measure(path, kv, tests, reps, threads, gpu_layers)))
    except Exception as err:  # reported to the parent as one line
        queue.put(("error", f"{type(err).__name__}: {err}"))


def open_llama(path, n_ctx: int, kv: str, threads: int, gpu_layers: int = 0):
    """llama-cpp-python's `Llama` on a GGUF as every row of ours runs it: a `kv` cache
    (llama.cpp's type name), 512-token batches, `LLAMA_SETTINGS`, libgomp's own defaults
    (call in the child process that measures it)."""
    from .. import restore_openmp_env

    restore_openmp_env()  # llama.cpp as its users run it
    from llama_cpp import Llama

    return Llama(
        str(path),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        type_k=LLAMA_KV_TYPES[kv],
        type_v=LLAMA_KV_TYPES[kv],
        n_gpu_layers=gpu_layers,
        verbose=False,
        **LLAMA_SETTINGS,
    )


def _llama_measure(path, kv, tests: Tests, reps: int, threads: int, gpu_layers: int = 0):
    m = open_llama(path, tests.tokens() + 8, kv, threads, gpu_layers)
    import llama_cpp

    measured = measure(_Llama(m), tests, reps)
    build = llama_build(llama_cpp.llama_print_system_info().decode())
    return measured, peak_rss(), build + (f", {gpu_layers} layers offloaded" if gpu_layers else "")


def run_llamacpp(
    path,
    kv: str,
    tests: Tests,
    reps: int,
    threads: int,
    on_row: Callable[[Row], None] | None = None,
    gpu_layers: int = 0,
) -> list[Row]:
    """Measure llama.cpp in a child process; raises TightKVError if it is not installed.
    gpu_layers: layers llama.cpp offloads to its GPU backend (Metal on a Mac; -1 all of them,
    0 its CPU alone)."""
    import importlib.util

    from ..errors import TightKVError

    if importlib.util.find_spec("llama_cpp") is None:
        raise TightKVError(INSTALL_HINT.replace("\n", " "))
    if kv not in LLAMA_KV_TYPES:
        return []
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_llama_child, args=(str(path), kv, tests, reps, threads, gpu_layers, queue))
    proc.start()
    status, payload = queue.get()
    proc.join()
    if status != "ok":
        raise TightKVError(f"llama.cpp failed: {payload}")
    measured, rss, build = payload
    return [_report(r, on_row) for r in _rows("llama.cpp", kv, measured, peak_rss=rss, build=build)]


def llama_build(info: str) -> str:
    """The instruction sets in llama.cpp's system info ("CPU : SSE3 = 1 | AVX2 = 1 | ..."; on ARM
    "NEON = 1 | DOTPROD = 1 | MATMUL_INT8 = 1 ..."), as "AVX2 FMA F16C AVX512 ..." (those set
    to 1), so a table says which build ran."""
    flags = []
    for part in info.replace("|", " | ").split("|"):
        name, _, value = part.partition("=")
        name = name.split(":")[-1].strip()
        if value.strip() == "1" and name and name not in flags:
            flags.append(name)
    return " ".join(flags)


def merge_runs(rows: list[Row]) -> list[Row]:
    """One row per engine, KV type and test from rows measured in separate rounds: the runs
    pooled, their median the figure (bandwidth and seconds scaled with it), in first-seen order."""
    merged: dict[tuple, Row] = {}
    for r in rows:
        key = (r.engine, r.kv, r.test)
        if key not in merged:
            merged[key] = Row(**{**r.__dict__, "tok_s_runs": list(r.tok_s_runs)})
            continue
        m = merged[key]
        m.tok_s_runs += r.tok_s_runs
        m.kv_bytes, m.peak_rss = r.kv_bytes or m.kv_bytes, max(m.peak_rss, r.peak_rss)
    for m in merged.values():
        tps = statistics.median(m.tok_s_runs)
        m.gb_s = m.gb_s / m.tok_s * tps if m.tok_s else 0.0
        m.seconds = m.seconds * m.tok_s / tps if tps else 0.0  # a run's tokens are fixed: time scales inversely
        m.tok_s = tps
    return list(merged.values())


def format_table(rows: list[Row], bandwidth: float | None = None) -> str:
    """A llama-bench-like table: tokens per second, the seconds a pp or ttft run took (a
    ttft ratio of 1.25x is a wait of 0.8x llama.cpp's), the ratio to llama.cpp's same test and KV type, the KV
    cache's bytes, the bandwidth achieved, and the peak RSS of the engine's process so far
    (tightkv runs every KV type in one process, llama.cpp each in its own); above it,
    llama.cpp's settings when llama.cpp rows are among them."""
    theirs = {(r.test, r.kv): r.tok_s for r in rows if r.engine == "llama.cpp"}
    w = max([6] + [len(r.kv) for r in rows])
    settings = f"llama.cpp rows: flash_attn={LLAMA_SETTINGS['flash_attn']}, swa_full={LLAMA_SETTINGS['swa_full']}"
    lines = [settings] if theirs else []  # llama.cpp's settings only where llama.cpp ran
    lines += [
        f"| engine    | {'kv':<{w}} | test            |      t/s |       s | vs llama.cpp f16 | vs same kv | KV MiB "
        "| GB/s | peak RSS MiB |",
        f"|-----------|{'-' * (w + 2)}|-----------------|---------:|--------:|---------:|---------:|-------:"
        "|-----:|-------------:|",
    ]
    for r in rows:
        f16 = theirs.get((r.test, "f16"))
        same = theirs.get((r.test, r.kv))
        ratio = f"{r.tok_s / f16:.2f}x" if f16 and r.engine == "tightkv" else ""
        ratio_same = f"{r.tok_s / same:.2f}x" if same and r.engine == "tightkv" else ""
        kv_mib = f"{r.kv_bytes / 2**20:.1f}" if r.kv_bytes else ""
        gbs = f"{r.gb_s:.1f}" if r.gb_s else ""
        secs = f"{r.seconds:.2f}" if r.seconds else ""
        rss = f"{r.peak_rss / 2**20:.0f}" if r.peak_rss else ""
        lines.append(
            f"| {r.engine:<9} | {r.kv:<{w}} | {r.test:<15} | {r.tok_s:8.2f} | {secs:>7} | {ratio:>8} | {ratio_same:>8} "
            f"| {kv_mib:>6} | {gbs:>4} | {rss:>12} |"
        )
    return "\n".join(lines)
