"""A parsed GGUF described for people: Ollama's `show` fields, human numbers.
Used by `tightkv show`, the REPL's `/show` and the server's model details."""

from __future__ import annotations

from math import prod

import gguf


def human_number(n: int) -> str:
    """Ollama's HumanNumber: 268.10M, 1.2B, 3B."""
    for unit, size, digits in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 1)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.{digits}f}{unit}"
    return str(n)


def file_type(metadata: dict) -> str | None:
    """`general.file_type` as llama.cpp names it (Q4_K_M, Q8_0, F16 ...), if the file says."""
    try:
        return gguf.LlamaFileType(int(metadata["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, TypeError, ValueError):
        return None


def parameters(g) -> int:
    return sum(prod(t.shape) for t in g.tensors.values())


def quantization(g) -> str:
    """The file type, or else the block type holding the most bytes."""
    ft = file_type(g.metadata)
    if ft is not None:
        return ft
    sizes: dict[str, int] = {}
    for t in g.tensors.values():
        sizes[t.qtype] = sizes.get(t.qtype, 0) + int(t.data.nbytes)
    return max(sizes, key=sizes.get) if sizes else "?"


def describe(g) -> list[tuple[str, object]]:
    """(label, value) pairs for a parsed GGUF, as Ollama's `show` lists them."""
    m, arch = g.metadata, g.architecture
    params = parameters(g)
    pairs: list[tuple[str, object]] = [("architecture", arch), ("parameters", human_number(params))]
    for label, key in (
        ("context length", "context_length"),
        ("embedding length", "embedding_length"),
        ("layers", "block_count"),
        ("attention heads", "attention.head_count"),
        ("kv heads", "attention.head_count_kv"),
        ("sliding window", "attention.sliding_window"),
    ):
        if f"{arch}.{key}" in m:
            pairs.append((label, m[f"{arch}.{key}"]))
    if m.get(f"{arch}.rope.scaling.type"):
        pairs.append(("rope scaling", f"{m[f'{arch}.rope.scaling.type']} x{m.get(f'{arch}.rope.scaling.factor', 1):g}"))
    pairs.append(("quantization", quantization(g)))
    return pairs


def format_pairs(pairs: list[tuple[str, object]], indent: int = 4) -> str:
    width = max((len(k) for k, _ in pairs), default=0) + 4
    return "\n".join(f"{' ' * indent}{k:<{width}}{v}" for k, v in pairs)
