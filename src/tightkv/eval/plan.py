"""Memory planning from the GGUF header alone: weights, KV per cache type, a hybrid model's
recurrent state, working buffers, what fits, and which lever (weights or KV cache) decides it.

A hybrid model (Qwen3.5's Gated DeltaNet layers) holds KV only in its full-attention layers;
each linear-attention layer keeps a float32 state of fixed size and, at prefill chunk ends,
up to `kv.recurrent.MAX_CHECKPOINTS` checkpoints of it: that much is taken from the budget
once, whatever the context. A mixture of experts holds all its experts but reads only its
routed ones per token (`gguf.describe.read_per_token`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

PLAN_TYPES = ["f32", "f16", "q8_0", "q4_0", "tq4", "tq3", "kivi4", "kvarn4", "progressive", "k8v4", "aggressive"]
# the types in order of measured quality (ΔPPL and KLD against f16, docs/benchmarks.md): what `plan`
# recommends is the first of them that fits
QUALITY_ORDER = ["f16", "q8_0", "k8v4", "kvarn4", "progressive", "tq4", "kivi4", "q4_0", "aggressive", "tq3"]
RUNTIME_BYTES = 350 * 2**20  # Python, torch and the engine's own state, measured resident after load
PREFILL_CHUNK = 512


# The weight lever (issue 19): llama.cpp file types, largest first, as (name, block type of the
# matrices, block type of the output layer), sized for a model's own tensor shapes by `weight_options`
WEIGHT_FILE_TYPES = [
    ("Q8_0", "Q8_0", "Q8_0"),
    ("Q6_K", "Q6_K", "Q6_K"),
    ("Q5_K_M", "Q5_K", "Q6_K"),
    ("Q4_K_M", "Q4_K", "Q6_K"),
    ("IQ4_XS", "IQ4_XS", "Q6_K"),
    ("Q3_K_M", "Q3_K", "Q6_K"),
    ("IQ3_S", "IQ3_S", "Q6_K"),
    ("IQ2_M", "IQ2_S", "Q5_K"),
    ("Q2_K", "Q2_K", "Q6_K"),
    ("TQ1_0", "TQ1_0", "Q6_K"),
    ("Q1_0", "Q1_0", "Q6_K"),
]
# Types for models trained that way (BitNet's ternary weights, Bonsai's 1-bit ones): a model trained
# in float and requantized to them is destroyed (docs/weight-types.md), so they are a lever only for
# a model whose own matrices already use them
TRAINED_ONLY = {"TQ1_0": "ternary", "TQ2_0": "ternary", "Q1_0": "1-bit"}  # type -> the weights it holds
# llama.cpp's type for a row that is not a whole number of blocks (llama-quant.cpp tensor_type_fallback)
FALLBACK = {
    "IQ1_S": "IQ4_NL",
    "IQ1_M": "IQ4_NL",
    "IQ2_XXS": "IQ4_NL",
    "IQ2_XS": "IQ4_NL",
    "IQ2_S": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL",
    "IQ3_S": "IQ4_NL",
    "IQ4_XS": "IQ4_NL",
    "Q2_0": "Q4_0",
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "TQ1_0": "Q4_0",
    "TQ2_0": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}
# AQLM-style additive codebooks: groups of 8 weights, M codebooks of 2^B entries (bits per weight = M*B/8)
AQLM_CONFIGS = [("1x16", 1, 16), ("2x12", 2, 12)]
AQLM_GROUP = 8
# tensors llama.cpp's quantize leaves as they are (llama-quant.cpp): the MoE router, the short convolution
KEPT_AS_STORED = ("ffn_gate_inp", "ssm_conv1d")


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
    weight_options: list = field(default_factory=list)  # {"type", "bytes"} per WEIGHT_FILE_TYPES
    matrices: list = field(default_factory=list)  # (rows, cols) of the model's matrices, output layer left out
    block_types: set = field(default_factory=set)  # the GGML types of the model's matrices
    recurrent: int = 0  # a hybrid model's recurrent state with its checkpoints at most (in what must fit)
    recurrent_state: int = 0  # one recurrent state (float32, every linear-attention layer)
    read: object = None  # gguf.describe.TokenRead: the weight bytes a decoded token reads
    draft: int = 0  # a draft model's weights, buffers and f16 KV at the context (`draft_bytes`)
    draft_name: str = ""

    @property
    def fixed(self) -> int:
        """What must fit whatever the KV: weights, working buffers, the recurrent state and a
        draft model."""
        return self.weights + self.working + self.recurrent + self.draft

    @property
    def weights_fit(self) -> bool:
        return self.fixed <= self.memory

    @property
    def kv_layers(self) -> int:
        from ..kv.spec import attention_layers

        return len(attention_layers(self.layout))

    def smaller_weights(self) -> list[dict]:
        """The weight options below the file's own size, largest first, that suit this model:
        a TRAINED_ONLY type only where the model's own matrices hold such weights."""
        return [o for o in self.weight_options if o["bytes"] < self.weights and self.suits(o["type"])]

    def suits(self, qtype: str) -> bool:
        own = {TRAINED_ONLY[t] for t in self.block_types if t in TRAINED_ONLY}
        return qtype not in TRAINED_ONLY or TRAINED_ONLY[qtype] in own


def working_bytes(args, context: int) -> int:
    """Runtime, prefill activations of one chunk and one chunk's logits (float32).

    The feed-forward's width is an expert's plus the shared expert's for a mixture of
    experts (a chunk runs one expert at a time over its rows, `models.moe`), with the
    router's scores; a linear-attention layer's own (its convolved q, k, v, the gate and
    a 64-token block's matrices per head, `models.deltanet`) is counted where it is wider
    than attention's."""
    T = min(PREFILL_CHUNK, context)
    ffn = 3 * args.intermediate_size
    if args.num_experts:
        ffn = 3 * (args.expert_ff + args.shared_ff) + 2 * args.num_experts
    mixer = 2 * args.num_heads * args.head_dim
    if any(args.recurrent(i) for i in range(args.num_layers)):
        L = args.recurrent_layout()
        mixer = max(mixer, 2 * L.conv_channels + 2 * L.heads * L.value_dim + L.heads * 64)
    acts = T * (4 * args.hidden_size + ffn + mixer) * 4
    scores = args.num_heads * T * min(context, 4096) * 4  # attention scores of one block
    logits = args.vocab_size * 4 * 2
    return RUNTIME_BYTES + acts + scores + logits


def largest_context(spec: str, layout, budget: int, limit: int) -> int:
    """The most tokens whose KV fits in budget bytes (binary search; 0 if none). The budget
    is what is left after the fixed bytes (`Plan.fixed`: a recurrent state is among them)."""
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


def footprint(path, context: int, kv: str) -> int:
    """Bytes a loaded model holds, as `plan` counts them: weights, working buffers less the
    runtime's own (counted once per server), a hybrid's recurrent state, and the KV cache
    at `context` tokens of type `kv`. "auto" is priced as its smallest candidate: it picks a
    type that fits the budget where one does (the type it then picks prices the model anew)."""
    from ..gguf.describe import read_per_token
    from ..gguf.reader import read_gguf
    from ..kv.recurrent import recurrent_bytes
    from ..kv.spec import is_auto, kv_bytes_per_token
    from ..models.base import header_layout

    g = read_gguf(path)
    args, layout = header_layout(g)
    kinds = QUALITY_ORDER if is_auto(kv) else [kv]
    kv_bytes = min(kv_bytes_per_token(k, layout, context)["total_bytes"] for k in kinds)
    return (
        read_per_token(g).weights + working_bytes(args, context) - RUNTIME_BYTES + recurrent_bytes(layout)[1] + kv_bytes
    )


def draft_bytes(path, context: int) -> int:
    """Bytes a draft model (`engine.speculative`, -md) holds beside its target: its weights and
    buffers and its f16 cache at the target's `context` (at most its own trained one), as
    `Model.draft_model` opens it; the runtime counted once, with the target."""
    from ..gguf.reader import read_gguf
    from ..models.base import header_layout

    trained = header_layout(read_gguf(path))[0].context_length
    return footprint(path, min(context, trained), "f16")


def make_plan(
    path,
    context: int | None,
    memory: int,
    kv_types: list[str],
    name: str | None = None,
    draft=None,
    draft_name: str | None = None,
) -> Plan:
    """The memory plan of the GGUF at `path` (shown as `name`) at `context` tokens
    (default: its trained context) within `memory` bytes, for each KV type; `draft`: the GGUF
    of a draft model held beside it (`draft_bytes`), shown as `draft_name`."""
    from ..gguf.describe import read_per_token
    from ..gguf.reader import read_gguf
    from ..kv.recurrent import recurrent_bytes
    from ..kv.spec import kv_bytes_per_token
    from ..models.base import header_layout

    g = read_gguf(path)
    args, layout = header_layout(g)
    ctx = context or args.context_length
    read = read_per_token(g)
    weights = read.weights
    working = working_bytes(args, ctx)
    state, recurrent = recurrent_bytes(layout)
    drafted = draft_bytes(draft, ctx) if draft is not None else 0
    budget = memory - weights - working - recurrent - drafted
    rows = []
    for spec in kv_types:
        info = kv_bytes_per_token(spec, layout, ctx)
        rows.append(
            {
                "kv": spec,
                "kv_bytes": info["total_bytes"],
                "bytes_per_token": info["bytes_per_token"],
                "ratio_vs_f16": info["ratio_vs_f16"],
                "fits": info["total_bytes"] <= budget,
                "max_context": largest_context(spec, layout, budget, max(ctx, args.context_length)),
            }
        )
    return Plan(
        name or str(g.path),
        ctx,
        args.context_length,
        memory,
        weights,
        working,
        rows,
        str(g.path),
        layout,
        weight_options(g),
        _matrices(g),
        {t.qtype for t in g.tensors.values() if len(t.shape) in (2, 3)},
        recurrent=recurrent,
        recurrent_state=state,
        read=read,
        draft=drafted,
        draft_name=draft_name or (str(draft) if draft is not None else ""),
    )


def _block_type(qtype: str, cols: int) -> str:
    """`qtype`, or llama.cpp's fallback for it when `cols` is not a whole number of its blocks."""
    from ..gguf.quants import BLOCK_SIZES

    while cols % BLOCK_SIZES[qtype][0]:
        qtype = FALLBACK.get(qtype, "F16")
    return qtype


def _tensor_bytes(qtype: str, rows: int, cols: int) -> int:
    from ..gguf.quants import BLOCK_SIZES

    block, size = BLOCK_SIZES[_block_type(qtype, cols)]
    return rows * (cols // block) * size


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers whose attn_v and ffn_down a _M mix keeps at a higher type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def weight_bytes(g, base: str, output: str, mix: bool = False) -> int:
    """Bytes of the GGUF `g`'s tensors requantized with matrices of type `base` and the
    output layer (the embedding when tied) of type `output`; vectors as stored; a 3-D expert
    tensor as its experts' matrices; the router and a short convolution as stored (llama.cpp
    leaves them unquantized); with `mix` (llama.cpp's Q4_K_M/Q5_K_M), attn_v and ffn_down
    (an expert's too) at Q6_K in `_use_more_bits` layers. llama.cpp's other per-tensor
    choices are left out (an estimate: see tests/test_plan.py)."""
    from ..gguf.quants import BLOCK_SIZES

    n_layers = 1 + max((int(n.split(".")[1]) for n in g.tensors if n.startswith("blk.")), default=-1)
    tied = "output.weight" not in g.tensors
    total = 0
    for name, t in g.tensors.items():
        if len(t.shape) not in (2, 3) or any(k in name for k in KEPT_AS_STORED):
            total += int(t.data.nbytes)
            continue
        *lead, cols = t.shape
        rows = prod(lead)
        qtype = base
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            qtype = "Q8_0" if cols % BLOCK_SIZES[base][0] else output  # llama.cpp's rule for the output layer
        elif (
            mix
            and (name.endswith("attn_v.weight") or ".ffn_down" in name)
            and _use_more_bits(int(name.split(".")[1]), n_layers)
        ):
            qtype = "Q6_K"
        total += _tensor_bytes(qtype, rows, cols)
    return total


def weight_options(g) -> list[dict]:
    """The size of each of WEIGHT_FILE_TYPES for this model's tensor shapes."""
    return [
        {"type": name, "bytes": weight_bytes(g, base, out, mix=name.endswith("_K_M") and name != "Q3_K_M")}
        for name, base, out in WEIGHT_FILE_TYPES
    ]


def _matrices(g) -> list[tuple[int, int]]:
    """(rows, cols) of the model's matrices (an expert tensor's: one expert's), output layer left out."""
    skip = ("token_embd.weight", "output.weight")
    return [tuple(t.shape[-2:]) for n, t in g.tensors.items() if len(t.shape) in (2, 3) and n not in skip]


def aqlm_rho(plan: Plan) -> list[dict]:
    """The representational ratio rho = N / K^M of AQLM-style codebooks (N groups of 8
    weights in a matrix, M codebooks of K entries) for the model's largest and smallest
    matrices, per AQLM_CONFIGS. Above 1 the codebooks' initialisation decides quality
    (our source report: 18 at 2 bits); well below 1 it is forgiving (0.07 at 3 bits)."""
    if not plan.matrices:
        return []
    sizes = sorted(r * c for r, c in plan.matrices)
    out = []
    for name, m, b in AQLM_CONFIGS:
        k = 2**b
        out.append(
            {
                "config": name,
                "bits_per_weight": m * b / AQLM_GROUP,
                "codebook_entries": k,
                "rho_largest": sizes[-1] / AQLM_GROUP / k**m,
                "rho_smallest": sizes[0] / AQLM_GROUP / k**m,
            }
        )
    return out


def weight_lever(plan: Plan) -> str | None:
    """One sentence when the weights are the lever (the file's weights with any KV type do
    not hold the context): the largest weight type that, with the best-quality KV type
    that then fits, holds it; None when the file's own weights do."""
    if plan.weights_fit and any(r["fits"] for r in plan.rows):
        return None
    rank = {k: i for i, k in enumerate(QUALITY_ORDER)}
    rows = sorted(plan.rows, key=lambda r: rank.get(r["kv"], len(rank)))

    def best_kv(opt: dict) -> dict | None:  # the best-quality KV row that fits beside these weights
        budget = plan.memory - opt["bytes"] - plan.working - plan.recurrent
        return next((r for r in rows if r["kv_bytes"] <= budget), None) if budget > 0 else None

    where = f"{plan.context:,} tokens in {plan.memory / 2**30:.2f} GiB"
    for opt in plan.smaller_weights():
        if (kv := best_kv(opt)) is not None:
            return f"weights are the lever: {opt['type']} ({opt['bytes'] / 2**30:.2f} GiB) with {kv['kv']} fits {where}"
    unsuited = [o["type"] for o in plan.weight_options if not plan.suits(o["type"]) and best_kv(o) is not None]
    but = (
        (
            f" ({unsuited[0]} would, but it suits only models trained with {TRAINED_ONLY[unsuited[0]]} weights: "
            f"requantizing this one to it destroys it)"
        )
        if unsuited
        else ""
    )
    return f"no weight type of this model holds {where} with any KV type{but}: a smaller model or a shorter context"


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
        plus = " and the recurrent state" if plan.recurrent else ""
        return (
            f"the weights ({plan.weights / 2**30:.2f} GiB) plus working buffers{plus} do not fit in "
            f"{plan.memory / 2**30:.2f} GiB: the lever is the weights (a smaller quantization or model)"
        )
    if not any(r["fits"] for r in plan.rows):
        return (
            "the weights load, but no KV type holds this context: the lever is the KV cache "
            "(a shorter context or a smaller KV type)"
        )
    if not plan.rows[0]["fits"] or not all(r["fits"] for r in plan.rows):
        return f"the weights load; long context is decided by the KV cache (e.g. --kv {recommended(plan)['kv']} fits)"
    return "everything fits"


def format_plan(plan: Plan, choice=None) -> str:
    """The plan as `tightkv plan` prints it: the sizes, one row per KV type, the lever,
    the recommended type (`choice`, a probed `autokv.KVChoice`, when given) with
    llama.cpp's and vLLM's settings for it, and a warning when the context exceeds
    the trained one."""
    from ..hub import human_binary_bytes as human

    gib, mib = 2**30, 2**20
    lines = [
        f"model     {plan.model}",
        f"context   {plan.context} tokens (trained {plan.trained_context})",
        f"memory    {plan.memory / gib:.2f} GiB",
        f"weights   {plan.weights / gib:.3f} GiB (stay quantized)",
    ]
    if plan.read is not None and plan.read.moe:
        lines.append(f"          {human(plan.read.per_token)} read per token ({plan.read.parts(human)})")
    if plan.recurrent:
        from ..kv.recurrent import MAX_CHECKPOINTS

        lines.append(
            f"recurrent {human(plan.recurrent)} (the float32 state of {len(plan.layout) - plan.kv_layers} "
            f"linear-attention layers, {human(plan.recurrent_state)}, and up to {MAX_CHECKPOINTS} prefill "
            "checkpoints of it; fixed, whatever the context)"
        )
    lines.append(f"working   {plan.working / gib:.3f} GiB (runtime, one prefill chunk, logits)")
    if plan.draft:
        lines.append(
            f"draft     {plan.draft / gib:.3f} GiB ({plan.draft_name}: weights, buffers and its f16 KV, for -md)"
        )
    if plan.recurrent:
        lines.append(f"kv        in the {plan.kv_layers} full-attention layers of {len(plan.layout)}")
    lines += [
        "",
        f"{'kv':<14} {'KV total':>13} {'per token':>11} {'vs f16':>7} {'fits':>5} {'max context':>12} {'in all':>10}",
    ]
    for r in plan.rows:
        lines.append(
            f"{r['kv']:<14} {r['kv_bytes'] / mib:9.1f} MiB {r['bytes_per_token'] / 1024:7.2f} KiB "
            f"{r['ratio_vs_f16']:6.2f}x {'yes' if r['fits'] else 'no':>5} {r['max_context']:>12} "
            f"{(plan.fixed + r['kv_bytes']) / gib:6.2f} GiB"
        )
    what = "weights, working buffers" + (", recurrent state" if plan.recurrent else "")
    what += (", draft model" if plan.draft else "") + " and KV"
    lines.append(f"(in all: {what})")
    lines += ["", lever(plan)]
    if weight_lever(plan):
        lines.append(weight_lever(plan))
    best = choice.kv if choice is not None else (recommended(plan) or {}).get("kv")
    if best is not None:
        from .engines import equivalents, format_equivalents

        why = choice.line() if choice is not None else "the best-quality type that fits"
        lines.append(f"recommended: --kv {best} ({why}); elsewhere:")
        lines += format_equivalents(best, equivalents(best, plan.layout, plan.context), plan.context)
    lines += _format_weights(plan)
    if plan.context > plan.trained_context:
        factor = -(-plan.context // plan.trained_context)
        lines.append(
            f"warning: {plan.context} tokens exceed the model's trained context of {plan.trained_context}; "
            f"running it needs --rope-scale {factor} (linear RoPE scaling, at some loss of quality)"
        )
    return "\n".join(lines)


def _format_weights(plan: Plan) -> list[str]:
    """The weight lever's table: each file type's size for this model, and AQLM's rho."""
    if not plan.weight_options:
        return []
    gib = 2**30
    cells = [f"{o['type']} {o['bytes'] / gib:.3f}" for o in plan.weight_options]
    lines = [
        "",
        f"weights as other llama.cpp file types (GiB, for this model's shapes; this file {plan.weights / gib:.3f}):",
    ]
    lines += ["  " + "  ".join(cells[i : i + 6]) for i in range(0, len(cells), 6)]
    rho = aqlm_rho(plan)
    if rho:
        parts = [
            f"{r['config']} ({r['bits_per_weight']:g} bits) {r['rho_largest']:.3g} to {r['rho_smallest']:.3g}"
            for r in rho
        ]
        lines.append(
            f"AQLM-style codebooks (groups of {AQLM_GROUP}): rho = N / K^M, largest to smallest matrix: "
            + "; ".join(parts)
            + " (above 1 the codebook initialisation decides quality)"
        )
    return lines
