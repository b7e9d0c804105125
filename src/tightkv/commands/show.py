"""`tightkv show NAME`: what a model is, and what its KV cache costs per token."""
from __future__ import annotations

import argparse
from math import prod

NAME = "show"
HELP = "show a model's architecture, size, context, template and KV bytes per token"

# The cache types `show` prices: dense, llama.cpp's, ours, and the presets.
KV_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "tq4", "tq3", "tq2", "kvarn4", "kvarn3", "kvarn2",
            "kivi4", "kivi2", "q8_0:tq4", "progressive", "aggressive", "k8v4"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .run import one_line_errors

    p.add_argument("model", nargs="?", default=None,
                   help="a registry name (pulled) or a .gguf path (default: the embedded model)")
    p.add_argument("--template", action="store_true", help="print only the chat template")
    p.add_argument("--metadata", action="store_true", help="also print every GGUF metadata key")
    p.add_argument("-c", "--ctx", type=int, default=None,
                   help="context for the KV table (default, or 0: the model's trained context)")
    one_line_errors(p)


def human_number(n: int) -> str:
    """Ollama's HumanNumber: 268.10M, 1.2B, 3B."""
    for unit, size, digits in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 1)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.{digits}f}{unit}"
    return str(n)


def quantization(g) -> str:
    """The file type as llama.cpp names it (Q4_K_M, Q8_0, F16 ...)."""
    ft = g.metadata.get("general.file_type")
    if ft is not None:
        try:
            import gguf

            return gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except (ValueError, ImportError):
            pass
    sizes: dict[str, int] = {}
    for t in g.tensors.values():
        sizes[t.qtype] = sizes.get(t.qtype, 0) + int(t.data.nbytes)
    return max(sizes, key=sizes.get) if sizes else "?"


def describe(g) -> list[tuple[str, object]]:
    """(label, value) pairs for a parsed GGUF, as Ollama's `show` lists them."""
    m, arch = g.metadata, g.architecture
    params = sum(prod(t.shape) for t in g.tensors.values())
    pairs: list[tuple[str, object]] = [("architecture", arch), ("parameters", human_number(params))]
    for label, key in (("context length", "context_length"), ("embedding length", "embedding_length"),
                       ("layers", "block_count"), ("attention heads", "attention.head_count"),
                       ("kv heads", "attention.head_count_kv"), ("sliding window", "attention.sliding_window")):
        if f"{arch}.{key}" in m:
            pairs.append((label, m[f"{arch}.{key}"]))
    if m.get(f"{arch}.rope.scaling.type"):
        pairs.append(("rope scaling", f"{m[f'{arch}.rope.scaling.type']} x{m.get(f'{arch}.rope.scaling.factor', 1):g}"))
    pairs.append(("quantization", quantization(g)))
    return pairs


def format_pairs(pairs: list[tuple[str, object]], indent: int = 4) -> str:
    width = max((len(k) for k, _ in pairs), default=0) + 4
    return "\n".join(f"{' ' * indent}{k:<{width}}{v}" for k, v in pairs)


def cache_layout(g) -> list[tuple[int, int, int, int | None]]:
    """Per-layer (kv heads, key dim, value dim, sliding window) from the model family,
    or from the generic metadata when tightkv does not run this architecture yet."""
    try:
        from ..models.base import load_family

        family = load_family(g)
        args = family.ModelArgs.from_gguf(g)
        try:
            from types import SimpleNamespace

            return family.Model.cache_layout(SimpleNamespace(args=args))
        except Exception:
            from ..models.base import build_model

            return build_model(g).cache_layout()
    except Exception:
        m, arch = g.metadata, g.architecture
        heads = int(m.get(f"{arch}.attention.head_count", 1))
        kv_heads = int(m.get(f"{arch}.attention.head_count_kv", heads))
        hidden = int(m.get(f"{arch}.embedding_length", heads))
        dk = int(m.get(f"{arch}.attention.key_length", hidden // heads))
        dv = int(m.get(f"{arch}.attention.value_length", dk))
        return [(kv_heads, dk, dv, None)] * int(m.get(f"{arch}.block_count", 1))


def kv_table(g, context: int) -> list[tuple[str, float, int, float]]:
    """(type, bytes per token, total bytes, x smaller than f16) at `context` tokens."""
    layout = cache_layout(g)
    try:
        from ..kv.spec import kv_bytes_per_token
    except ImportError:  # dense types only
        rows = []
        for name, size in (("f32", 4), ("f16", 2), ("bf16", 2)):
            total = sum((min(context, w) if w else context) * h * (d + dv) * size for h, d, dv, w in layout)
            rows.append((name, total / context, total, 0.0))
        f16 = rows[1][2]
        return [(n, b, t, f16 / t) for n, b, t, _ in rows]
    rows = []
    for name in KV_TYPES:
        try:
            r = kv_bytes_per_token(name, layout, context)
        except Exception:
            continue
        rows.append((name, r["bytes_per_token"], r["total_bytes"], r["ratio_vs_f16"]))
    return rows


def run(ns: argparse.Namespace) -> int:
    from ..errors import TightKVError
    from ..gguf.reader import read_gguf
    from ..hub import human_binary_bytes as human_bytes
    from ..registry import looks_like_path, resolve
    from .common import model_label

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
    print("  Model")
    print(format_pairs([("name", name), *describe(g), ("file", path), ("size", human_bytes(path.stat().st_size))]))
    print()
    print("  Chat template")
    if template:
        print("\n".join("    " + line for line in template.splitlines()))
    else:
        print("    (none: the model runs as plain text completion)")
    print()
    print(f"  KV cache at {context} tokens of context (exact sink and recent windows included)")
    rows = kv_table(g, context)
    width = max(len(r[0]) for r in rows) + 4
    print(f"    {'type':<{width}}{'bytes/token':>12}  {'total':>10}  {'vs f16':>7}")
    for kind, per_token, total, ratio in rows:
        print(f"    {kind:<{width}}{per_token:>12,.0f}  {human_bytes(total):>10}  {ratio:>6.2f}x")
    if ns.metadata:
        print()
        print("  Metadata")
        for key, value in g.metadata.items():
            if hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 8:
                value = f"[{len(value)} values]"
            print(f"    {key}  {value}")
    return 0
