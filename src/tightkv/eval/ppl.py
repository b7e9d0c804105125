"""Perplexity and KL divergence against the f16 cache, the llama-perplexity way.

Protocol (as ../reference/gemma3-270m-ppl-essays-llamacpp.json): tokenize the
whole text without BOS; chunk i is [BOS] + tokens[i*(C-1) : (i+1)*(C-1)]; the
logits at positions C/2 .. C-2 are scored against the next token.

Every cache type runs on the same chunk, one after the other (each cache dropped
once its final hidden states are kept), and the scoring streams: the output layer
turns OUTPUT_ROWS scored rows of the baseline and of one type at a time into
float32 logits; the baseline's float64 log-probabilities of those rows are kept
while each type's are taken ROW_SLICE rows at a time (`compare_rows`). The whole (tokens, vocab) logits of a run are never
held, let alone two runs' at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..engine.score import scored_hidden, scored_logits

BASELINE = "f16"
# scored rows turned into float32 logits per output-layer call, for the baseline and one other type at a time
# (Gemma's 262K vocab: 64 MiB each, and 128 MiB for the baseline's float64 log-probabilities of them)
OUTPUT_ROWS = 64
ROW_SLICE = 8  # rows taken to float64 log-probabilities at once (Gemma: 16 MiB per slice and run)


@dataclass
class PplResult:
    """Per cache type: negative log-likelihoods, KL divergences and top-1 agreement."""

    nll: list[float] = field(default_factory=list)
    kld: list[float] = field(default_factory=list)
    same_top1: list[bool] = field(default_factory=list)

    def summary(self) -> dict:
        nll = np.array(self.nll, dtype=np.float64)
        kld = np.array(self.kld, dtype=np.float64)
        ppl = float(np.exp(nll.mean()))
        return {
            "ppl": ppl,
            "ppl_stderr": float(ppl * nll.std() / math.sqrt(len(nll))),
            "kld_mean": float(kld.mean()),
            "kld_p99": float(np.percentile(kld, 99)),
            "kld_p999": float(np.percentile(kld, 99.9)),
            "same_top1": float(np.mean(self.same_top1)),
            "n_scored": int(len(nll)),
        }


def chunks(tokens: list[int], bos: int, ctx: int, n_chunks: int | None) -> list[list[int]]:
    """[BOS] + ctx-1 tokens per chunk; only whole chunks."""
    step = ctx - 1
    available = len(tokens) // step
    n = available if n_chunks is None else min(n_chunks, available)
    return [[bos] + tokens[i * step : (i + 1) * step] for i in range(n)]


@torch.inference_mode()
def log_softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """float64 log-probabilities of (n, vocab) float32 logits, ROW_SLICE rows at a time."""
    out = torch.empty(logits.shape, dtype=torch.float64)
    for a in range(0, logits.shape[0], ROW_SLICE):
        out[a : a + ROW_SLICE] = torch.log_softmax(logits[a : a + ROW_SLICE].double(), dim=-1)
    return out


@torch.inference_mode()
def compare_rows(
    base: torch.Tensor,
    other: torch.Tensor,
    targets: torch.Tensor | None = None,
    rows: int = ROW_SLICE,
    base_logp: bool = False,
) -> tuple[list[float], list[float], list[bool]]:
    """Row by row of two (n, vocab) logit blocks, the baseline's and another run's: KLD(base ||
    other), and with `targets` the other run's negative log-likelihood of them and whether
    its top token is the baseline's (empty lists without). Float64 log-probabilities `rows`
    rows at a time, so at most two such slices and a third in passing are held; with
    `base_logp`, `base` is already the baseline's float64 log-probabilities (taken once for
    every type compared with it)."""
    kld: list[float] = []
    nll: list[float] = []
    same: list[bool] = []
    for a in range(0, base.shape[0], rows):
        p = base[a : a + rows] if base_logp else torch.log_softmax(base[a : a + rows].double(), dim=-1)
        q = torch.log_softmax(other[a : a + rows].double(), dim=-1)
        if targets is not None:
            nll += (-q.gather(1, targets[a : a + rows, None])[:, 0]).tolist()
            same += (q.argmax(-1) == p.argmax(-1)).tolist()
        q.neg_().add_(p)  # log p - log q, in place
        # sum_v p_v (log p_v - log q_v) as a batched dot product: no third (rows, vocab) matrix
        probs = p.exp() if base_logp else p.exp_()  # the caller's log-probabilities stay as they are
        kld += torch.bmm(probs.unsqueeze(1), q.unsqueeze(2)).view(-1).clamp_min(0).tolist()
        del probs
        del p, q
    return kld, nll, same


def windows(ctxs: list[int], score_from: float) -> list[tuple[int, int]]:
    """The scored logit positions [start, end) of each context: a chunk of the largest
    holds the shorter ones as its prefixes (the model is causal, so a context of c
    tokens is the chunk's first c), each scored from score_from of its length to its
    second-last token."""
    return [(int(c * score_from), c - 1) for c in ctxs]


def scored_positions(spans: list[tuple[int, int]]) -> torch.Tensor:
    """The sorted union of the spans' positions."""
    return torch.unique(torch.cat([torch.arange(a, b) for a, b in spans]))


@torch.inference_mode()
def score_hidden(
    net, hidden: dict[str, torch.Tensor], ids: list[int], positions: torch.Tensor, spans, results, on_piece=None
) -> None:
    """Score each type's final hidden states at `positions` (rows of `hidden[name]`)
    against the baseline's, span by span: `results[span_index][name]` is a PplResult. The
    output layer runs OUTPUT_ROWS rows of a span of the baseline, then of each other type,
    per call (a span's rows are scored in the blocks its own run would score them in);
    `compare_rows` scores them."""
    targets = torch.tensor(ids)[positions + 1]
    for (a, b), results_w in zip(spans, results):
        rows = ((positions >= a) & (positions < b)).nonzero()[:, 0]
        for s in range(0, rows.numel(), OUTPUT_ROWS):
            block = rows[s : s + OUTPUT_ROWS]
            tgt, n = targets[block], block.numel()
            base = log_softmax_rows(scored_logits(net, hidden[BASELINE][block]))  # once for every type
            for name, h in hidden.items():
                r = results_w[name]
                if name == BASELINE:  # against itself: KLD 0, the same top token
                    r.nll += (-base.gather(1, tgt[:, None])[:, 0]).tolist()
                    r.kld += [0.0] * n
                    r.same_top1 += [True] * n
                else:
                    logits = scored_logits(net, h[block])
                    kld, nll, same = compare_rows(base, logits, tgt, base_logp=True)
                    del logits
                    r.nll += nll
                    r.kld += kld
                    r.same_top1 += same
                if on_piece:
                    on_piece(n)
            del base


@torch.inference_mode()
def score_chunk(net, ids: list[int], caches: dict[str, list], results, spans, sub: int = 512, on_piece=None) -> None:
    """Run one chunk through every cache type and add its scores over each span
    (`results[span_index][name]`); `on_piece(n)` is told after each forward call of n
    tokens and after n rows are scored for one type.

    Each cache (or a function that makes it) is taken out of `caches` while it runs and
    dropped after: only its final hidden states at the scored positions are kept."""
    positions = scored_positions(spans)
    hidden = {}
    for name in list(caches):
        cache = caches.pop(name)
        hidden[name] = scored_hidden(net, ids, cache() if callable(cache) else cache, positions, sub, on_piece)
        del cache
    score_hidden(net, hidden, ids, positions, spans, results, on_piece)


def perplexity(
    model, text: str, ctx: int, n_chunks: int | None, kv_types: list[str], progress: bool = True, batch: int = 512
) -> dict[str, dict]:
    """PPL, its standard error, and KLD against f16 for each KV type on text, llama-perplexity's
    protocol (the second half of each chunk scored); `perplexity_at` for one context."""
    return perplexity_at(model, text, [ctx], n_chunks, kv_types, progress=progress, batch=batch)[ctx]


def perplexity_at(
    model,
    text: str,
    ctxs: list[int],
    n_chunks: int | None,
    kv_types: list[str],
    score_from: float = 0.5,
    progress: bool = True,
    batch: int = 512,
) -> dict[int, dict[str, dict]]:
    """Context -> KV type -> PPL, its standard error, and KLD against f16 on text, scoring
    positions from score_from of each context on. Chunks are of the largest context, and
    every shorter one is scored on their prefixes (`windows`): one forward per type serves
    every context. Each chunk is fed `batch` tokens per forward call. Progress (stderr)
    counts the tokens run and the rows scored, for every type, so it moves with every
    forward call, not only per chunk."""
    from ..progress import Progress

    ctxs = sorted(set(ctxs))
    names = [BASELINE] + [k for k in kv_types if k != BASELINE]
    tokens = model.tokenize(text, add_bos=False)
    todo = chunks(tokens, model.tokenizer.bos_id, ctxs[-1], n_chunks)
    if not todo:
        from ..errors import TightKVError

        raise TightKVError(f"text has {len(tokens)} tokens: too short for one chunk of {ctxs[-1]}")
    spans = windows(ctxs, score_from)
    n_rows = sum(b - a for a, b in spans)
    results = [{name: PplResult() for name in names} for _ in spans]
    work = (ctxs[-1] + n_rows) * len(todo) * len(names)  # tokens run, rows scored
    with Progress("perplexity", work, enabled=progress) as bar:
        for i, ids in enumerate(todo):
            bar.describe(f"perplexity chunk {i + 1}/{len(todo)}")
            caches = {name: (lambda kind=name: model.new_cache(kind)) for name in names}  # made in turn
            score_chunk(model.net, ids, caches, results, spans, sub=batch, on_piece=bar.update)
            last = results[-1]
            bar.note(" ".join(f"{n} {math.exp(np.mean(r.nll)):.3f}" for n, r in last.items()))
        bar.detail = f"{len(todo)} chunk{'s' * (len(todo) > 1)} x {len(names)} KV type{'s' * (len(names) > 1)}"
    return {c: {name: r[name].summary() for name in names} for c, r in zip(ctxs, results)}


def perplexity_targets(
    tokens, text: str, ctx: int, n_chunks: int | None, targets: list, progress: bool = True
) -> dict[str, dict]:
    """`perplexity` over targets (`eval.endpoint`: local KV types and endpoints), the first
    the baseline: the same chunks and scored positions, each target's log-probabilities
    of them and its top alternatives, and KLD against the baseline over the baseline's
    top tokens (`topk_kld`), since an endpoint gives no more."""
    from ..errors import TightKVError
    from ..progress import Progress

    if n_chunks is not None:  # an endpoint tokenizes over HTTP: no more text than the chunks can use
        text = text[: ctx * n_chunks * 32]
    ids_all = tokens.tokenize(text)
    step = ctx - len(tokens.bos)
    n = len(ids_all) // step if n_chunks is None else min(n_chunks, len(ids_all) // step)
    if n == 0:
        raise TightKVError(f"text has {len(ids_all)} tokens: too short for one chunk of {ctx}")
    todo = [tokens.bos + ids_all[i * step : (i + 1) * step] for i in range(n)]
    results = {t.label: PplResult() for t in targets}
    with Progress("perplexity", sum(map(len, todo)) * len(targets), enabled=progress) as bar:
        for i, ids in enumerate(todo):
            bar.describe(f"perplexity chunk {i + 1}/{len(todo)}")
            base_top: list[dict] = []
            for t in targets:
                values, tops = t.score(ids, len(ids) // 2)
                r = results[t.label]
                r.nll += [-v for v in values]
                if not base_top:
                    base_top = tops
                r.kld += [topk_kld(b, o) for b, o in zip(base_top, tops)]
                r.same_top1 += [
                    bool(b) and bool(o) and max(b, key=b.get) == max(o, key=o.get) for b, o in zip(base_top, tops)
                ]
                bar.update(len(ids))
            bar.note(" ".join(f"{k} {math.exp(np.mean(r.nll)):.3f}" for k, r in results.items()))
    return {k: r.summary() for k, r in results.items()}


def topk_kld(base: dict[str, float], other: dict[str, float]) -> float:
    """KLD(base || other) over base's listed tokens and the rest as one outcome; a
    token other does not list gets its smallest listed log-probability (an upper
    bound of its own)."""
    if not base:
        return 0.0
    floor = min(other.values()) if other else -30.0
    p = {k: math.exp(v) for k, v in base.items()}
    q = {k: math.exp(other.get(k, floor)) for k in base}
    kld = sum(pk * (math.log(pk) - math.log(q[k])) for k, pk in p.items() if pk > 0)
    rest_p, rest_q = max(1.0 - sum(p.values()), 0.0), max(1.0 - sum(q.values()), 1e-12)
    if rest_p > 1e-12:
        kld += rest_p * (math.log(rest_p) - math.log(rest_q))
    return max(kld, 0.0)


def format_table(results: dict[str, dict]) -> str:
    """One row per KV type (or target), llama-perplexity's figures plus KLD against the
    first row, the baseline."""
    base = next(iter(results.values()))["ppl"]
    w = max(16, *map(len, results))
    lines = [
        f"{'kv':<{w}} {'PPL':>9} {'± se':>8} {'ΔPPL':>8} {'KLD mean':>9} {'KLD p99':>8} "
        f"{'KLD p99.9':>9} {'same top1':>9}"
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<{w}} {r['ppl']:9.4f} {r['ppl_stderr']:8.5f} {100 * (r['ppl'] / base - 1):+7.2f}% "
            f"{r['kld_mean']:9.5f} {r['kld_p99']:8.4f} {r['kld_p999']:9.4f} {100 * r['same_top1']:8.2f}%"
        )
    return "\n".join(lines)
