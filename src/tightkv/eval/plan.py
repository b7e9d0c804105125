"""Memory planning from the GGUF header alone: weights, KV per cache type, working
buffers, what fits, and which lever (weights or KV cache) decides it."""
from __future__ import annotations

from dataclasses import dataclass, field

PLAN_TYPES = ["f32", "f16", "q8_0", "q4_0", "tq4", "tq3", "kivi4", "kvarn4", "progressive", "k8v4", "aggressive"]
# the types in order of measured quality (ΔPPL and KLD against f16, docs/benchmarks.md): what `plan`
# recommends is the first of them that fits
QUALITY_ORDER = ["f16", "q8_0", "k8v4", "kvarn4", "progressive", "tq4", "kivi4", "q4_0", "aggressive", "tq3"]
RUNTIME_BYTES = 350 * 2**20  # Python, torch and the engine's own state, measured resident after load
PREFILL_CHUNK = 512


@dataclass
class Plan:
    model: str
    context: int
    trained_context: int
    memory: int
    weights: int
    working: int
    rows: list[dict]
    file: str = ""
    layout: list = field(default_factory=list)

    @property
    def weights_fit(self) -> bool:
        return self.weights + self.working <= self.memory


def working_bytes(args, context: int) -> int:
    """Runtime, prefill activations of one chunk and one chunk's logits (float32)."""
    T = min(PREFILL_CHUNK, context)
    acts = T * (4 * args.hidden_size + 3 * args.intermediate_size + 2 * args.num_heads * args.head_dim) * 4
    scores = args.num_heads * T * min(context, 4096) * 4  # attention scores of one block
    logits = args.vocab_size * 4 * 2
    return RUNTIME_BYTES + acts + scores + logits


def largest_context(spec: str, layout, budget: int, limit: int) -> int:
    """The most tokens whose KV fits in budget bytes (binary search; 0 if none)."""
    from ..kv.spec import kv_bytes_per_token

    if budget <= 0:
        return 0
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv_bytes_per_token(spec, layout, mid)["total_bytes"] <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def make_plan(path, context: int | None, memory: int, kv_types: list[str], name: str | None = None) -> Plan:
    """The memory plan of the GGUF at `path` (shown as `name`) at `context` tokens
    (default: its trained context) within `memory` bytes, for each KV type."""
    from ..gguf.reader import read_gguf
    from ..kv.spec import kv_bytes_per_token
    from ..models.base import header_layout

    g = read_gguf(path)
    args, layout = header_layout(g)
    ctx = context or args.context_length
    weights = sum(int(t.data.nbytes) for t in g.tensors.values())
    working = working_bytes(args, ctx)
    budget = memory - weights - working
    rows = []
    for spec in kv_types:
        info = kv_bytes_per_token(spec, layout, ctx)
        rows.append({"kv": spec, "kv_bytes": info["total_bytes"], "bytes_per_token": info["bytes_per_token"],
                     "ratio_vs_f16": info["ratio_vs_f16"], "fits": info["total_bytes"] <= budget,
                     "max_context": largest_context(spec, layout, budget, max(ctx, args.context_length))})
    return Plan(name or str(g.path), ctx, args.context_length, memory, weights, working, rows, str(g.path), layout)


def recommended(plan: Plan) -> dict | None:
    """The row of the best-quality type that fits (QUALITY_ORDER, then the plan's
    other types in order); None when none fits or the weights do not."""
    if not plan.weights_fit:
        return None
    rank = {k: i for i, k in enumerate(QUALITY_ORDER)}
    fitting = [r for r in plan.rows if r["fits"]]
    return min(fitting, key=lambda r: rank.get(r["kv"], len(rank) + plan.rows.index(r)), default=None)


def lever(plan: Plan) -> str:
    """One sentence naming what decides the fit."""
    if not plan.weights_fit:
        return (f"the weights ({plan.weights / 2**30:.2f} GiB) plus working buffers do not fit in "
                f"{plan.memory / 2**30:.2f} GiB: the lever is the weights (a smaller quantization or model)")
    if not any(r["fits"] for r in plan.rows):
        return ("the weights load, but no KV type holds this context: the lever is the KV cache "
                "(a shorter context or a smaller KV type)")
    if not plan.rows[0]["fits"] or not all(r["fits"] for r in plan.rows):
        return f"the weights load; long context is decided by the KV cache (e.g. --kv {recommended(plan)['kv']} fits)"
    return "everything fits"


def format_plan(plan: Plan, choice=None) -> str:
    """The plan as `tightkv plan` prints it: the sizes, one row per KV type, the lever,
    the recommended type (`choice`, a probed `eval.auto.KVChoice`, when given) with
    llama.cpp's and vLLM's settings for it, and a warning when the context exceeds
    the trained one."""
    gib = 2**30
    lines = [f"model     {plan.model}",
             f"context   {plan.context} tokens (trained {plan.trained_context})",
             f"memory    {plan.memory / gib:.2f} GiB",
             f"weights   {plan.weights / gib:.3f} GiB (stay quantized)",
             f"working   {plan.working / gib:.3f} GiB (runtime, one prefill chunk, logits)",
             "",
             f"{'kv':<14} {'KV total':>13} {'per token':>11} {'vs f16':>7} {'fits':>5} {'max context':>12}"]
    for r in plan.rows:
        lines.append(f"{r['kv']:<14} {r['kv_bytes'] / 2**20:9.1f} MiB {r['bytes_per_token'] / 1024:7.2f} KiB "
                     f"{r['ratio_vs_f16']:6.2f}x {'yes' if r['fits'] else 'no':>5} {r['max_context']:>12}")
    lines += ["", lever(plan)]
    best = choice.kv if choice is not None else (recommended(plan) or {}).get("kv")
    if best is not None:
        from .engines import equivalents, format_equivalents

        why = choice.line() if choice is not None else "the best-quality type that fits"
        lines.append(f"recommended: --kv {best} ({why}); elsewhere:")
        lines += format_equivalents(best, equivalents(best, plan.layout, plan.context), plan.context)
    if plan.context > plan.trained_context:
        factor = -(-plan.context // plan.trained_context)
        lines.append(f"warning: {plan.context} tokens exceed the model's trained context of {plan.trained_context}; "
                     f"running it needs --rope-scale {factor} (linear RoPE scaling, at some loss of quality)")
    return "\n".join(lines)
