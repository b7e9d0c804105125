"""The embedded Gemma 3 270M requantized by llama.cpp's own quantizer, for the weight-type tests.

`requantized("IQ4_XS")` returns the path of the embedded model rewritten by
`llama_cpp.llama_model_quantize` (llama-cpp-python) to that llama.cpp file type, built on
first use and cached under ``$TIGHTKV_HOME/requantized`` (keyed by the source file and the
llama-cpp-python version); nothing is downloaded. Only the file types asked for are built
(2-35 s each on 2 cores).

The file types whose block types llama.cpp will not write without an importance matrix
(IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M) get one made here: for every matrix, the
mean square of each input column over 1,024 tokens of the essays, as our engine computes
them (the statistic llama.cpp's `llama-imatrix` collects). IQ3_XXS takes it too, which
makes llama.cpp write IQ3_XXS blocks (without one it writes IQ3_S and Q3_K instead).

Used by tests/test_quants_files.py and bench/weight_types.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

IMATRIX_TYPES = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS"}
IMATRIX_TOKENS = 1024

_QUANTIZE = r"""
import ctypes, sys
import numpy as np
import llama_cpp
src, dst, ftype, imatrix = sys.argv[1:5]
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
p.allow_requantize = True
p.nthread = 2
if imatrix:
    m = np.load(imatrix)
    keep = [(n.encode(), np.ascontiguousarray(m[n], dtype=np.float32)) for n in m.files]
    arr = (llama_cpp.llama_model_imatrix_data * (len(keep) + 1))()
    for i, (name, data) in enumerate(keep):
        arr[i].name, arr[i].data, arr[i].size = name, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size
    p.imatrix = ctypes.cast(arr, type(p.imatrix))
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)))
"""


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version, or None where it is missing."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def cache_dir() -> Path:
    from tightkv.store import home

    return home() / "requantized"


def _source() -> Path:
    from tightkv.registry import embedded_path

    return Path(embedded_path())


def requantized(ftype: str) -> Path:
    """The embedded model as llama.cpp's quantizer writes file type `ftype` (e.g. "Q1_0")."""
    version = llama_cpp_version()
    if version is None:
        raise RuntimeError("llama-cpp-python is not installed")
    src = _source()
    key = f"{src.name.removeprefix('sha256-')[:12]}-llamacpp{version}"
    out = cache_dir() / f"gemma3-270m-{key}-{ftype}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    imatrix = str(_imatrix(src, key)) if ftype in IMATRIX_TYPES else ""
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run(
        [sys.executable, "-c", _QUANTIZE, str(src), str(tmp), ftype, imatrix], capture_output=True, text=True
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        why = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "failed" in line.lower()]
        raise RuntimeError(f"llama_model_quantize {ftype} failed: {' / '.join(why[-3:]) or proc.returncode}")
    os.replace(tmp, out)
    return out


def _imatrix(src: Path, key: str) -> Path:
    """Per-column mean squares of every matrix's input over the essays (cached .npz)."""
    out = cache_dir() / f"imatrix-{key}.npz"
    if not out.exists():
        tmp = out.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, **collect_imatrix(src, IMATRIX_TOKENS))
        os.replace(tmp, out)
    return out


def collect_imatrix(path: Path, n_tokens: int) -> dict[str, np.ndarray]:
    """{tensor name: (in_features,) float32 mean of x**2} for every QuantLinear of the model at
    `path` but the output layer, over `n_tokens` tokens of the essays in one chunked prefill."""
    import torch

    from tightkv import Model
    from tightkv.eval.corpus import essays
    from tightkv.kernels.qmatmul import QuantLinear

    model = Model(str(path), kv="f16", context_length=n_tokens + 16)
    names = {t.data.ctypes.data: name for name, t in model.gguf.tensors.items() if t.data.ndim == 2}
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    forward = QuantLinear.__call__

    def record(self, x):
        name = names.get(self._ptr)
        if name is not None and name not in ("token_embd.weight", "output.weight"):
            x2 = x.reshape(-1, x.shape[-1]).double()
            sums[name] = sums.get(name, 0) + (x2 * x2).sum(0)
            counts[name] = counts.get(name, 0) + x2.shape[0]
        return forward(self, x)

    ids = model.tokenize(essays()[: 20 * n_tokens])[:n_tokens]
    cache = model.new_cache()
    QuantLinear.__call__ = record
    try:
        with torch.inference_mode():
            for s in range(0, len(ids), 512):  # one chunked prefill; logits of the last position only
                part = torch.tensor(ids[s : s + 512])
                model.net(part, cache, logits_at=torch.tensor([part.numel() - 1]))
    finally:
        QuantLinear.__call__ = forward
        model.close()
    return {name: (sums[name] / counts[name]).float().numpy() for name in sums}


# -- llama.cpp as the oracle ---------------------------------------------------------------

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
]
N_GEN = 24


def ggml_dequantize(qtype: str, raw: np.ndarray) -> np.ndarray:
    """llama.cpp's own C dequantizer (libggml-base's dequantize_row_<type>) on (n, type_size)
    uint8 blocks -> (n * block_size,) float32."""
    import ctypes

    from tightkv.gguf.quants import BLOCK_SIZES

    fn = getattr(_ggml_base(), f"dequantize_row_{qtype.lower()}")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(raw.size // BLOCK_SIZES[qtype][1] * BLOCK_SIZES[qtype][0], dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, out.size)
    return out


def _ggml_base():
    import ctypes

    import llama_cpp

    return ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))


GGML_TYPE_IDS = {
    "IQ2_XXS": 16,
    "IQ2_XS": 17,
    "IQ3_XXS": 18,
    "IQ1_S": 19,
    "IQ4_NL": 20,
    "IQ3_S": 21,
    "IQ2_S": 22,
    "IQ4_XS": 23,
    "IQ1_M": 29,
    "TQ1_0": 34,
    "TQ2_0": 35,
    "MXFP4": 39,
    "NVFP4": 40,
    "Q1_0": 41,
    "Q2_0": 42,
}


def ggml_block_dot(qtype: str, raw: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's own CPU block dot (ggml-cpu's type traits: `from_float` rounds x to its
    activation type, Q8_0 or Q8_K, then `vec_dot` per row) of rows `raw` (rows, row bytes)
    with x (K,) float32 -> (its results (rows,), x as it rounded it (K,))."""
    import ctypes

    import llama_cpp

    class Traits(ctypes.Structure):
        _fields_ = [
            ("from_float", ctypes.c_void_p),
            ("vec_dot", ctypes.c_void_p),
            ("vec_dot_type", ctypes.c_int),
            ("nrows", ctypes.c_int64),
        ]

    cpu = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"))
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    cpu.ggml_cpu_init()
    traits = cpu.ggml_get_type_traits_cpu(GGML_TYPE_IDS[qtype]).contents
    act = cpu.ggml_get_type_traits_cpu(traits.vec_dot_type).contents
    block, size = {8: (32, 34), 15: (256, 292)}[traits.vec_dot_type]  # Q8_0 or Q8_K
    x = np.ascontiguousarray(x, dtype=np.float32)
    xq = np.zeros(x.size // block * size, dtype=np.uint8)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(act.from_float)(
        x.ctypes.data, xq.ctypes.data, x.size
    )
    vec_dot = ctypes.CFUNCTYPE(
        None,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
    )(traits.vec_dot)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out, s = np.empty(raw.shape[0], dtype=np.float32), ctypes.c_float()
    for r in range(raw.shape[0]):
        vec_dot(x.size, ctypes.byref(s), 0, raw[r].ctypes.data, 0, xq.ctypes.data, 0, 1)
        out[r] = s.value
    b = xq.reshape(-1, size)
    if size == 34:  # Q8_0: fp16 d, 32 int8
        xd = b[:, :2].copy().view(np.float16).astype(np.float32) * b[:, 2:].view(np.int8).astype(np.float32)
    else:  # Q8_K: float32 d, 256 int8, 16 int16 sums
        xd = b[:, :4].copy().view(np.float32) * b[:, 4:260].view(np.int8).astype(np.float32)
    return out, xd.reshape(-1)


def llamacpp_reference(path: Path, prompts: list[str] = PROMPTS, n_gen: int = N_GEN) -> dict:
    """llama.cpp on the GGUF at `path` (llama-cpp-python, 2 threads, f16 KV cache): for each
    prompt, its tokens, `n_gen` greedy tokens with the top-2 margin at each step, the top-20
    logits after the prompt, and the same logits with the prompt fed one token at a time
    (llama.cpp's batch and single-token kernels differ: its own spread). Cached as JSON
    beside the file."""
    import json

    cache = path.with_suffix(f".ref{len(prompts)}x{n_gen}b.json")
    if cache.exists():
        return json.loads(cache.read_text())
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from requantized import _run_llamacpp; "
        "print(json.dumps(_run_llamacpp(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(path), json.dumps(prompts), str(n_gen)],
        capture_output=True,
        text=True,
        check=True,
    )
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    cache.write_text(json.dumps(ref))
    return ref


def _run_llamacpp(path: str, prompts: list[str], n_gen: int) -> dict:
    from llama_cpp import Llama

    m = Llama(path, n_ctx=512, n_threads=2, n_batch=512, verbose=False, logits_all=True, seed=0)
    cases = []
    for prompt in prompts:
        ids = m.tokenize(prompt.encode(), add_bos=True)
        m.reset()
        m.eval(ids)
        gen, margins, top20 = [], [], None
        for _ in range(n_gen):
            logits = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits)
            if top20 is None:
                top20 = {"ids": [int(t) for t in order[:20]], "logits": [float(logits[t]) for t in order[:20]]}
            gen.append(int(order[0]))
            margins.append(float(logits[order[0]] - logits[order[1]]))
            m.eval([gen[-1]])
        m.reset()  # the prompt again, one token at a time: llama.cpp's own spread across its kernels
        for t in ids:
            m.eval([t])
        again = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)[top20["ids"]]
        cases.append(
            {
                "prompt": prompt,
                "ids": ids,
                "generated_ids": gen,
                "top2_margins": margins,
                "top20_ids": top20["ids"],
                "top20_logits": top20["logits"],
                "top20_logits_token_by_token": [float(v) for v in again],
            }
        )
    return {"engine": "llama.cpp (llama-cpp-python), CPU, 2 threads, f16 KV", "cases": cases}


def compare(model, ref: dict, near_tie: float = 0.5) -> dict:
    """Our engine (`model`, a tightkv.Model on the same GGUF) against `llamacpp_reference`:
    per prompt, the first greedy step that differs (None if none) and whether llama.cpp's
    margin there was a near tie; the top-20 logit differences' max and mean; top-1 agreement
    where llama.cpp's top-2 margin is at least `near_tie`; llama.cpp's own spread (its logits
    from the batched prompt against those from one token at a time)."""
    rows, diffs = [], []
    for case in ref["cases"]:
        assert model.tokenize(case["prompt"]) == case["ids"], case["prompt"]
        ours = model.generate(case["ids"], max_tokens=len(case["generated_ids"]), temperature=0).ids
        first = next((i for i, (a, b) in enumerate(zip(ours, case["generated_ids"])) if a != b), None)
        logits = model.logits(case["ids"])[-1]
        diff = np.abs(logits[case["top20_ids"]] - np.array(case["top20_logits"]))
        diffs.append(diff)
        clear = case["top20_logits"][0] - case["top20_logits"][1] >= near_tie
        rows.append(
            {
                "prompt": case["prompt"],
                "first_difference": first,
                "near_tie_there": None if first is None else case["top2_margins"][first] < near_tie,
                "top1_agrees": int(np.argmax(logits)) == case["top20_ids"][0] or not clear,
                "top20_max": float(diff.max()),
                "text": model.detokenize(ours),
            }
        )
    all_diffs = np.concatenate(diffs)
    spread = np.concatenate(
        [np.abs(np.array(c["top20_logits"]) - c["top20_logits_token_by_token"]) for c in ref["cases"]]
    )
    return {
        "cases": rows,
        "top20_max": float(all_diffs.max()),
        "top20_mean": float(all_diffs.mean()),
        "llamacpp_self_max": float(spread.max()),
        "llamacpp_self_mean": float(spread.mean()),
        "greedy_ok": all(r["first_difference"] is None or r["near_tie_there"] for r in rows),
        "top1_ok": all(r["top1_agrees"] for r in rows),
    }


def llamacpp_ppl(path: Path, text_file: Path, ctx: int, n_chunks: int) -> dict:
    """llama.cpp's perplexity on `text_file` by tests/reference/mkppl.py's protocol (llama-perplexity's:
    chunks of [BOS] + ctx-1 tokens, the second half of each scored), f16 KV, 2 threads. Cached beside
    the file."""
    import json

    cache = path.with_suffix(f".ppl-{text_file.stem}-{ctx}x{n_chunks}.json")
    if cache.exists():
        return json.loads(cache.read_text())
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from requantized import _run_llamacpp_ppl; "
        "print(json.dumps(_run_llamacpp_ppl(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(path), str(text_file), str(ctx), str(n_chunks)],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    cache.write_text(json.dumps(out))
    return out


def _run_llamacpp_ppl(path: str, text_file: str, ctx: int, n_chunks: int) -> dict:
    import math

    from llama_cpp import Llama

    m = Llama(path, n_ctx=ctx, n_threads=2, n_batch=512, verbose=False, logits_all=True)
    toks = m.tokenize(Path(text_file).read_text().encode(), add_bos=False)
    nll = []
    for i in range(n_chunks):
        ids = [m.token_bos()] + toks[i * (ctx - 1) : (i + 1) * (ctx - 1)]
        m.reset()
        m.eval(ids)
        scores = np.array(m.scores[: len(ids)], dtype=np.float64)
        for j in range(ctx // 2, len(ids) - 1):
            row = scores[j]
            top = row.max()
            nll.append(top + math.log(np.exp(row - top).sum()) - row[ids[j + 1]])
    nll = np.array(nll)
    ppl = float(np.exp(nll.mean()))
    return {"ppl": ppl, "stderr": float(ppl * nll.std() / math.sqrt(len(nll))), "n_scored": len(nll)}
