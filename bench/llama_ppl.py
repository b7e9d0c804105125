"""llama.cpp's KV caches scored on our perplexity protocol (#52, point 2): the same tokens and
scored positions as `tightkv ppl`, run through llama.cpp (llama-cpp-python 0.3.36, flash
attention on, `swa_full` off, as `llama-server` runs), once per cache type, each against
llama.cpp's own f16 cache: NLL, KLD over the full vocabulary and top-token agreement.

One model is loaded and one context is made per cache type (its own `type_k`/`type_v`); the
contexts run in lockstep, each fed the same batch, and the batch's scored rows are compared
with f16's right away (`tightkv.eval.ppl.compare_rows`), so no more than one batch of logits
per context is ever held. Each context also holds two n_batch x vocab float32 buffers of its
own (its graph's logits and its output): --group N runs at most N types beside f16 at a time
(f16 run again per group), for less memory at more time. llama.cpp rotates a quantized cache's K and V with a Hadamard
transform by default (`attn_rot_k`/`attn_rot_v`, when the head dim is a multiple of 64);
`rotate=False` (`--no-rotate`) sets `LLAMA_ATTN_ROT_DISABLE=1` while the contexts are made.

    python bench/llama_ppl.py [MODEL.gguf] [-f TEXT] -c 8192 --score-from 0.75 --kinds f16,q8_0,q4_0 \\
        [--chunks N] [--no-rotate] [--group N] [--batch 512] [--threads 2] [--json OUT]

The text is tokenized by our tokenizer and chunked as `tightkv.eval.ppl.chunks` does ([BOS] +
ctx-1 tokens); positions int(score_from*ctx) .. ctx-2 are scored. MODEL defaults to the
embedded Gemma 3 270M, TEXT to the essays. The long sweep beside our own types is
`bench/ppl_long.py`, which calls `score_llama`; `make_benchmarks.py --only llama-ppl` runs the
reference's protocol (../reference/gemma3-270m-ppl-essays-llamacpp.json: 6 chunks of 2,048).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from contextlib import contextmanager

import numpy as np
import torch

KINDS = ["f16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"]  # llama.cpp's cache types, f16 first
ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"
CTX_PAD = 256  # llama.cpp rounds a context's cells up to a multiple of this
ERROR, CONT = 4, 5  # ggml_log_level: an error, and a line that continues the previous one


def bytes_per_token(gguf, kind: str, ctx: int) -> float:
    """llama.cpp's KV bytes per token at `ctx` tokens with K and V of type `kind`: every
    attention layer's K and V, a sliding-window layer at its window (`swa_full` off)."""
    from tightkv.eval.engines import LLAMACPP_BITS, sequence_bytes
    from tightkv.gguf.reader import read_gguf
    from tightkv.models.base import header_layout

    _, layout = header_layout(read_gguf(gguf))
    return sequence_bytes(layout, ctx, LLAMACPP_BITS[kind], LLAMACPP_BITS[kind]) / ctx


class _Log:
    """llama.cpp's log silenced but for errors; the lines that say a cache's rotation are kept."""

    def __init__(self):
        import llama_cpp

        self.rot: list[str] = []
        self.level = 0
        self.callback = llama_cpp.llama_log_callback(self._on_line)  # held: llama.cpp keeps the pointer

    def _on_line(self, level: int, text: bytes, _user) -> None:
        line = text.decode("utf-8", errors="replace")
        self.level = self.level if level == CONT else level
        if "attn_rot_" in line:
            self.rot.append(line)
        if self.level == ERROR:
            sys.stderr.write(line)

    def rotation(self) -> dict[str, bool]:
        """Whether any cache made since the last call rotates its K and its V; then forgets."""
        said = {k: any(f"{k} = 1" in line for line in self.rot) for k in ("attn_rot_k", "attn_rot_v")}
        self.rot = []
        return said

    @contextmanager
    def installed(self):
        import llama_cpp
        from llama_cpp import _logger

        llama_cpp.llama_log_set(self.callback, ctypes.c_void_p(0))
        try:
            yield self
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


@contextmanager
def _rotation(rotate: bool):
    """LLAMA_ATTN_ROT_DISABLE=1 while a cache is made (llama.cpp reads it then), when not `rotate`."""
    before = os.environ.get(ROT_ENV)
    if not rotate:
        os.environ[ROT_ENV] = "1"
    elif before is not None:
        del os.environ[ROT_ENV]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ROT_ENV, None)
        else:
            os.environ[ROT_ENV] = before


def _context(model, kind: str, n_ctx: int, n_batch: int, threads: int, rotate: bool):
    """A llama.cpp context whose K and V cache are of type `kind`."""
    import llama_cpp

    p = llama_cpp.llama_context_default_params()
    p.n_ctx = -(-n_ctx // CTX_PAD) * CTX_PAD
    p.n_batch = p.n_ubatch = n_batch
    p.n_seq_max = 1
    p.n_threads = p.n_threads_batch = threads
    p.type_k = p.type_v = getattr(llama_cpp, f"GGML_TYPE_{kind.upper()}")
    p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    p.swa_full = False
    p.no_perf = True
    with _rotation(rotate):
        ctx = llama_cpp.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} tokens with a {kind} cache")
    return ctx


def _logits(ctx, rows: np.ndarray, vocab: int) -> torch.Tensor:
    """(len(rows), vocab) float32 logits of the batch's rows `rows` (each asked for)."""
    import llama_cpp

    out = np.empty((len(rows), vocab), dtype=np.float32)
    for j, i in enumerate(rows):
        out[j] = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, int(i)), shape=(vocab,))
    return torch.from_numpy(out)


def _fill(batch, ids: list[int], start: int, wanted: np.ndarray) -> None:
    """Batch of ids (positions start.. on sequence 0), logits asked where `wanted`."""
    for i, tok in enumerate(ids):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = bool(wanted[i])
    batch.n_tokens = len(ids)


def check_kinds(kinds: list[str]) -> None:
    """ValueError unless kinds is f16 and then some of llama.cpp's other cache types, once each."""
    if kinds[:1] != ["f16"] or len(set(kinds)) != len(kinds) or not set(kinds) <= set(KINDS):
        raise ValueError(f"kinds: f16 first, then some of {', '.join(KINDS[1:])} once each (got {','.join(kinds)})")


def _check(ids: list[int], positions, kinds: list[str]) -> np.ndarray:
    check_kinds(kinds)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size == 0 or np.any(np.diff(pos) <= 0) or pos[0] < 0 or pos[-1] >= len(ids) - 1:
        raise ValueError(f"positions: sorted, distinct, within 0..{len(ids) - 2}")
    return pos


def _score_rows(contexts: dict, idx: np.ndarray, tgt: torch.Tensor, vocab: int, out: dict) -> None:
    """Add the batch rows `idx` of every context but f16's (and f16's, when `out` has it) to
    `out`: each compared with f16's rows, whose float64 log-probabilities are taken once."""
    from tightkv.eval.ppl import compare_rows, log_softmax_rows

    base = log_softmax_rows(_logits(contexts["f16"], idx, vocab))
    if "f16" in out:  # against itself: KLD 0, the same top token
        out["f16"]["nll"] += (-base.gather(1, tgt[:, None])[:, 0]).tolist()
        out["f16"]["kld"] += [0.0] * len(idx)
        out["f16"]["same_top1"] += [True] * len(idx)
    for kind, ctx in contexts.items():
        if kind != "f16":
            kld, nll, same = compare_rows(base, _logits(ctx, idx, vocab), tgt, base_logp=True)
            out[kind]["nll"] += nll
            out[kind]["kld"] += kld
            out[kind]["same_top1"] += same


def _lockstep(model, ids: list[int], wanted: np.ndarray, kinds: list[str], out: dict, run: dict, bar, log) -> None:
    """One context per type of `kinds` (f16 first), all fed the same batches of ids up to the
    last wanted row; each batch's wanted rows scored into `out` before the next batch.
    `run`: n_batch, threads, rotate and the `rotation` dict to fill (or None)."""
    import llama_cpp

    from tightkv.eval.ppl import OUTPUT_ROWS

    n_batch, vocab = run["n_batch"], llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    contexts, batch = {}, llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        for kind in kinds:
            contexts[kind] = _context(model, kind, len(ids), n_batch, run["threads"], run["rotate"])
            said = log.rotation()
            if run["rotation"] is not None:
                run["rotation"][kind] = said
        targets = torch.tensor(ids, dtype=torch.int64)
        for a in range(0, len(wanted), n_batch):
            n = min(n_batch, len(wanted) - a)
            _fill(batch, ids[a : a + n], a, wanted[a : a + n])
            for kind, ctx in contexts.items():
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise RuntimeError(f"llama_decode failed on the {kind} cache at token {a}")
                bar.update(n)
            rows = np.flatnonzero(wanted[a : a + n])
            for s in range(0, len(rows), OUTPUT_ROWS):
                idx = rows[s : s + OUTPUT_ROWS]
                _score_rows(contexts, idx, targets[torch.from_numpy(a + idx + 1)], vocab, out)
            if rows.size:
                bar.note(" ".join(f"{k} {np.exp(np.mean(v['nll'])):.3f}" for k, v in out.items() if v["nll"]))
    finally:
        llama_cpp.llama_batch_free(batch)
        for ctx in contexts.values():
            llama_cpp.llama_free(ctx)


@torch.inference_mode()
def score_llama(
    gguf: str,
    ids: list[int],
    positions,
    kinds: list[str],
    rotate: bool = True,
    threads: int = 2,
    n_batch: int = 512,
    progress: bool = True,
    group: int | None = None,
    rotation: dict | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Run llama.cpp (llama-cpp-python, flash attention on, swa_full off) over one chunk `ids`
    (the exact token ids, BOS included as ids[0]; never re-tokenized) once per cache type in
    `kinds` (kinds[0] == 'f16' is the baseline; others among q8_0, q5_0, q5_1, q4_1, iq4_nl, q4_0,
    K and V of the same type), and for each scored position p in `positions` (sorted ints,
    p < len(ids)-1: the logits at p predict ids[p+1]) return arrays 'pos', 'nll' (float64,
    -log p(ids[p+1])), 'kld' (KLD(f16 || type) over the full vocabulary, float64; 0 for f16)
    and 'same_top1' (bool: argmax equal to f16's).

    One model is loaded; the types' contexts run in lockstep, `n_batch` tokens per decode
    (n_ubatch the same), up to the last scored position, and each batch's scored rows are
    compared with f16's before the next batch. Each context holds, besides its cache, two
    n_batch x vocab float32 buffers (llama.cpp's logits in its graph and its output), so
    `group` caps the types run beside f16 at once (f16 run again per group; None: all at
    once). `rotate=False` turns llama.cpp's Hadamard rotation of quantized caches off.
    `rotation`, when given, is filled with what llama.cpp's log says of each type's cache:
    {kind: {"attn_rot_k": bool, "attn_rot_v": bool}}."""
    import llama_cpp

    from tightkv.progress import Progress

    pos = _check(ids, positions, kinds)
    wanted = np.zeros(int(pos[-1]) + 1, dtype=bool)  # tokens run: up to the last scored position
    wanted[pos] = True
    others = kinds[1:]
    step = group or max(len(others), 1)
    passes = [["f16", *others[g : g + step]] for g in range(0, max(len(others), 1), step)]
    out = {k: {"nll": [], "kld": [], "same_top1": []} for k in kinds}
    run = {"n_batch": n_batch, "threads": threads, "rotate": rotate, "rotation": rotation}
    log = _Log()
    llama_cpp.llama_backend_init()
    with log.installed(), Progress("llama.cpp", len(wanted) * sum(map(len, passes)), enabled=progress) as bar:
        bar.detail = f"{len(kinds)} cache types in {len(passes)} pass{'es' * (len(passes) > 1)}"
        model = llama_cpp.llama_model_load_from_file(os.fsencode(gguf), llama_cpp.llama_model_default_params())
        if not model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        try:
            for i, part in enumerate(passes):
                scores = {k: out[k] for k in part if k != "f16" or i == 0}  # f16 kept from the first pass
                _lockstep(model, ids, wanted, part, scores, run, bar, log)
        finally:
            llama_cpp.llama_model_free(model)
    return {
        k: {
            "pos": pos.copy(),
            "nll": np.array(v["nll"], dtype=np.float64),
            "kld": np.array(v["kld"], dtype=np.float64),
            "same_top1": np.array(v["same_top1"], dtype=bool),
        }
        for k, v in out.items()
    }


def _chunks(model: str | None, text: str, ctx: int, n: int):
    """The GGUF's path, its model's name and n chunks of [BOS] + ctx-1 tokens of the text, by our tokenizer."""
    from tightkv.api import Model
    from tightkv.errors import TightKVError
    from tightkv.eval.ppl import chunks

    m = Model(model, context_length=ctx)  # a context past the trained one: TightKVError, one line
    with open(text, encoding="utf-8") as f:
        tokens = m.tokenize(f.read(), add_bos=False)
    todo = chunks(tokens, m.tokenizer.bos_id, ctx, n)
    if len(todo) < n:
        raise TightKVError(f"the text has {len(tokens)} tokens: {len(todo)} chunks of {ctx}, not {n}")
    return m.path, m.gguf.metadata.get("general.name", m.path.name), todo


def _table(summary: dict, per_token: dict, rotation: dict) -> str:
    """`tightkv.eval.ppl.format_table` with llama.cpp's KV bytes per token and its rotation beside each type."""
    from tightkv.eval.ppl import format_table

    lines = format_table(summary).splitlines()
    out = [lines[0] + f" {'B/token':>8} rotated"]
    for line, k in zip(lines[1:], summary):
        rot = ",".join(n[-1] for n, on in rotation[k].items() if on) or "no"
        out.append(line + f" {per_token[k]:8.1f} {rot}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", nargs="?", help="GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("-f", "--file", help="text to score (default: the essays, tightkv.eval.corpus)")
    ap.add_argument("-c", "--ctx", type=int, default=8192, help="tokens per chunk, BOS included")
    ap.add_argument("--chunks", type=int, default=1, help="chunks scored (default 1)")
    ap.add_argument("--score-from", type=float, default=0.5, help="first scored position as a fraction of ctx")
    ap.add_argument("--kinds", default=",".join(KINDS), help="llama.cpp cache types, f16 first")
    ap.add_argument("--no-rotate", action="store_true", help="LLAMA_ATTN_ROT_DISABLE=1: no Hadamard rotation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512, help="tokens per decode (n_batch = n_ubatch)")
    ap.add_argument("--group", type=int, help="at most this many types beside f16 at once (less memory)")
    ap.add_argument("--json", help="write the summaries here")
    args = ap.parse_args(argv)

    from tightkv.errors import TightKVError
    from tightkv.eval.ppl import PplResult

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    try:
        check_kinds(kinds)
        if not 0 <= args.score_from < 1:
            raise ValueError("--score-from is a fraction in [0, 1)")
        if args.file is None:
            from tightkv.eval.corpus import essays_path

            args.file = str(essays_path())
        path, name, todo = _chunks(args.model, args.file, args.ctx, args.chunks)
    except (ValueError, OSError, TightKVError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    positions = list(range(int(args.score_from * args.ctx), args.ctx - 1))
    results = {k: PplResult() for k in kinds}
    rotation: dict = {}
    start = time.monotonic()
    for i, ids in enumerate(todo):
        print(f"chunk {i + 1}/{len(todo)}", file=sys.stderr)
        scored = score_llama(
            str(path), ids, positions, kinds, not args.no_rotate, args.threads, args.batch,
            group=args.group, rotation=rotation,
        )  # fmt: skip
        for k, r in scored.items():
            results[k].nll += r["nll"].tolist()
            results[k].kld += r["kld"].tolist()
            results[k].same_top1 += r["same_top1"].tolist()
    seconds = time.monotonic() - start
    summary = {k: r.summary() for k, r in results.items()}
    per_token = {k: bytes_per_token(path, k, args.ctx) for k in kinds}
    print(_table(summary, per_token, rotation))
    print(f"{len(todo)} chunk(s) of {args.ctx}, positions {positions[0]}..{positions[-1]}, {seconds:.0f} s")
    if args.json:
        import llama_cpp

        doc = {
            "model": name,
            "text": os.path.basename(args.file),
            **{k: getattr(args, k) for k in ("ctx", "chunks", "score_from", "threads", "batch", "group")},
            "rotate": not args.no_rotate,
            "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, flash attention on, swa_full off",
            "seconds": seconds,
            "results": {k: {**summary[k], "bytes_per_token": per_token[k], **rotation[k]} for k in kinds},
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
