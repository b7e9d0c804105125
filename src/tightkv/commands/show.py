"""`tightkv show NAME`: what a model is, what a token reads of its weights (a mixture of
experts reads its routed experts' share), and what its KV cache costs per token (a hybrid
model's attention layers; its linear-attention layers keep a fixed recurrent state)."""

from __future__ import annotations

import argparse

NAME = "show"
HELP = "show a model's architecture, size, context, template and KV bytes per token"

# The cache types `show` prices: dense, llama.cpp's, ours, and the presets.
KV_TYPES = [
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "tq4",
    "tq3",
    "tq2",
    "kvarn4",
    "kvarn3",
    "kvarn2",
    "kivi4",
    "kivi2",
    "q8_0:tq4",
    "progressive",
    "aggressive",
    "k8v4",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .flags import one_line_errors

    p.add_argument(
        "model", nargs="?", default=None, help="a registry name (pulled) or a .gguf path (default: the embedded model)"
    )
    p.add_argument("--template", action="store_true", help="print only the chat template")
    p.add_argument("--metadata", action="store_true", help="also print every GGUF metadata key")
    p.add_argument(
        "-c",
        "--ctx",
        type=int,
        default=None,
        help="context for the KV table (default, or 0: the model's trained context)",
    )
    one_line_errors(p)


def cache_layout(g) -> list:
    """Per-layer (kv heads, key dim, value dim, sliding window) from the model family (a
    linear-attention layer's `kv.recurrent.RecurrentLayout` instead), or from the generic
    metadata when tightkv does not run this architecture yet."""
    from ..errors import GGUFError
    from ..models.base import header_layout

    try:
        return header_layout(g)[1]
    except GGUFError:
        m, arch = g.metadata, g.architecture
        heads = int(m.get(f"{arch}.attention.head_count", 1))
        kv_heads = int(m.get(f"{arch}.attention.head_count_kv", heads))
        hidden = int(m.get(f"{arch}.embedding_length", heads))
        dk = int(m.get(f"{arch}.attention.key_length", hidden // heads))
        dv = int(m.get(f"{arch}.attention.value_length", dk))
        return [(kv_heads, dk, dv, None)] * int(m.get(f"{arch}.block_count", 1))


def kv_table(g, context: int) -> list[tuple[str, float, int, float]]:
    """(type, bytes per token, total bytes, x smaller than f16) at `context` tokens."""
    from ..kv.spec import kv_bytes_per_token

    layout = cache_layout(g)
    rows = []
    for name in KV_TYPES:
        try:
            r = kv_bytes_per_token(name, layout, context)
        except Exception:
            continue
        rows.append((name, r["bytes_per_token"], r["total_bytes"], r["ratio_vs_f16"]))
    return rows


def recurrent_line(layout, human_bytes) -> str | None:
    """What a hybrid model's linear-attention layers keep, whatever the context; None
    when every layer is attention."""
    from ..kv.recurrent import MAX_CHECKPOINTS, RecurrentLayout, recurrent_bytes

    n = sum(isinstance(L, RecurrentLayout) for L in layout)
    if not n:
        return None
    state, most = recurrent_bytes(layout)
    return (
        f"    recurrent state  {human_bytes(state)} ({n} linear-attention layer{'s' * (n > 1)}, float32, fixed "
        f"whatever the context; with up to {MAX_CHECKPOINTS} prefill checkpoints: {human_bytes(most)})"
    )


def run(ns: argparse.Namespace) -> int:
    from ..errors import TightKVError
    from ..gguf.describe import describe, format_pairs, read_per_token
    from ..gguf.reader import read_gguf
    from ..hub import human_binary_bytes as human_bytes
    from ..kernels import build
    from ..kv.shared import SharedLayout
    from ..kv.spec import attention_layers
    from ..registry import looks_like_path, resolve
    from .flags import model_label

    path = resolve(ns.model, pull=False)
    g = read_gguf(path)
    template = g.metadata.get("tokenizer.chat_template")
    if ns.template:
        print(template or "(no chat template: the model runs as plain text completion)")
        return 0
    name = ns.model if ns.model and looks_like_path(ns.model) else model_label(ns.model)
    if ns.ctx is not None and ns.ctx < 0:
        raise TightKVError(f"-c/--ctx must be positive (or 0 for the model's context), got {ns.ctx}")
    context = ns.ctx or int(g.metadata.get(f"{g.architecture}.context_length", 0) or 4096)
    read = read_per_token(g)
    moe = [("read per token", f"{human_bytes(read.per_token)} ({read.parts(human_bytes)})")] if read.moe else []
    print("  Model")
    print(
        format_pairs(
            [
                ("name", name),
                *describe(g),
                ("file", path),
                ("size", human_bytes(path.stat().st_size)),
                *moe,
                ("cpu kernels", build.summary()),
            ]
        )
    )
    print()
    print("  Chat template")
    if template:
        print("\n".join("    " + line for line in template.splitlines()))
    else:
        print("    (none: the model runs as plain text completion)")
    print()
    layout = cache_layout(g)
    kv_layers = len(attention_layers(layout))
    print(f"  KV cache at {context} tokens of context (exact sink and recent windows included)")
    shared = sum(isinstance(L, SharedLayout) for L in layout)
    if kv_layers + shared < len(layout):
        print(
            f"    only the {kv_layers} full-attention layer{'s' * (kv_layers != 1)} of {len(layout)} hold KV; "
            f"the {len(layout) - kv_layers - shared} linear-attention layers keep a recurrent state (below)"
        )
    if shared:
        print(f"    {shared} layers read the KV of earlier layers and hold none of their own (counted once)")
    rows = kv_table(g, context)
    width = max(len(r[0]) for r in rows) + 4
    print(f"    {'type':<{width}}{'bytes/token':>12}  {'total':>10}  {'vs f16':>7}")
    for kind, per_token, total, ratio in rows:
        print(f"    {kind:<{width}}{per_token:>12,.0f}  {human_bytes(total):>10}  {ratio:>6.2f}x")
    if (line := recurrent_line(layout, human_bytes)) is not None:
        print(line)
    from ..autokv import ProbeCache

    probes = ProbeCache().of_model(path.name)
    if probes:
        print()
        print("  --kv auto probes kept (KLD vs f16; the bar is 0.01)")
        for kind, klds in probes.items():
            print(f"    {kind:<{width}}{max(klds):>12.5f}  (worst of {len(klds)} text{'s' * (len(klds) > 1)})")
    if ns.metadata:
        print()
        print("  Metadata")
        for key, value in g.metadata.items():
            if hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 8:
                value = f"[{len(value)} values]"
            print(f"    {key}  {value}")
    return 0
