"""A parsed GGUF described for people: Ollama's `show` fields, human numbers.
Used by `tightkv show`, the REPL's `/show` and the server's model details; and
`read_per_token`, the weight bytes one decoded token reads (`show`, `plan`, `bench`)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class TokenRead:
    """The weight bytes one decoded token reads, by kind (`read_per_token`).

    A dense model reads every tensor once per token, so `per_token` is all its tensors'
    bytes (`weights`), as `tightkv bench`'s GB/s has counted the weights (the file's size,
    its header too): the token embedding whole, though a lookup reads one row of it
    (`embedding_unread` says how much that leaves out; 0 when the embedding is also the
    output layer). A mixture of experts reads its routed experts' share of each 3-D expert
    tensor, and all the rest whole. A per-layer token embedding table (Gemma 4 E2B/E4B's
    ``per_layer_token_embd``, more than half such a file) is only ever looked up, one row a
    token: that row is in `dense`, the rest in `per_layer_unread` (in `weights`, not read).
    """

    weights: int  # every tensor, as stored
    dense: int  # what every token reads: all but the experts whole, a row of per_layer_token_embd
    shared: int  # the shared expert (*_shexp), read by every token
    experts: int  # the routed experts' tensors (3-D *_exps), every expert
    experts_read: int  # their share a token reads: experts_used of expert_count, per tensor
    experts_used: int = 0
    expert_count: int = 0
    embedding_unread: int = 0  # token_embd bytes beyond the one row a lookup reads (in dense)
    per_layer_unread: int = 0  # per_layer_token_embd bytes beyond a token's row (not in dense)

    @property
    def per_token(self) -> int:
        return self.dense + self.shared + self.experts_read

    @property
    def moe(self) -> bool:
        return self.expert_count > 0

    def parts(self, human) -> str:
        """'dense 1.2 GiB + 8 of 128 routed experts 0.6 GiB + shared expert 40 MiB', sizes by `human`."""
        out = [f"dense {human(self.dense)}"]
        if self.moe:
            out.append(f"{self.experts_used} of {self.expert_count} routed experts {human(self.experts_read)}")
        if self.shared:
            out.append(f"shared expert {human(self.shared)}")
        return " + ".join(out)


def is_expert_tensor(name: str, shape: tuple[int, ...]) -> bool:
    """A routed experts' tensor: ``blk.N.ffn_{gate,up,down}_exps.weight``, (experts, rows, cols)."""
    return len(shape) == 3 and "_exps." in name


def read_per_token(g) -> TokenRead:
    """The weight bytes one decoded token reads from the GGUF `g` (header only, no data read):
    every dense tensor whole, the shared expert whole, and ``{arch}.expert_used_count`` of the
    ``expert_count`` experts of each 3-D expert tensor (all of them when the count is missing),
    one row of the per-layer token embeddings (``per_layer_token_embd``, a lookup only); the
    multi-token-prediction blocks after the model's own (``nextn_predict_layers``) not at all."""
    m, arch = g.metadata, g.architecture
    dense = shared = experts = read = count = unrun = per_layer_unread = 0
    used = int(m.get(f"{arch}.expert_used_count") or 0)
    layers = int(m.get(f"{arch}.block_count") or 1 << 30) - int(m.get(f"{arch}.nextn_predict_layers") or 0)
    for name, t in g.tensors.items():
        nbytes = int(t.data.nbytes)
        if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
            unrun += nbytes
        elif is_expert_tensor(name, t.shape):
            count = int(t.shape[0])
            k = min(used or count, count)
            experts += nbytes
            read += nbytes // count * k
        elif "_shexp." in name:
            shared += nbytes
        elif name == "per_layer_token_embd.weight" and len(t.shape) == 2:
            row = nbytes // int(t.shape[0])  # (vocab, layers * per-layer width): a token's row
            dense += row
            per_layer_unread += nbytes - row
        else:
            dense += nbytes
    embd = g.tensors.get("token_embd.weight")
    unread = 0
    if embd is not None and "output.weight" in g.tensors and len(embd.shape) == 2:
        unread = int(embd.data.nbytes) - int(embd.data.nbytes) // int(embd.shape[0])
    return TokenRead(
        dense + shared + experts + unrun + per_layer_unread,
        dense,
        shared,
        experts,
        read,
        min(used or count, count) if count else 0,
        count,
        unread,
        per_layer_unread,
    )


def experts_line(g) -> str | None:
    """'8 of 128 per token, and a shared expert' for a mixture of experts; None otherwise."""
    m, arch = g.metadata, g.architecture
    total = int(m.get(f"{arch}.expert_count") or 0)
    if not total:
        return None
    used = int(m.get(f"{arch}.expert_used_count") or total)
    shared = any("_shexp." in n for n in g.tensors)
    return f"{used} of {total} per token" + (", and a shared expert" if shared else "")


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
    if (experts := experts_line(g)) is not None:
        pairs.append(("experts", experts))
    if m.get(f"{arch}.rope.scaling.type"):
        pairs.append(("rope scaling", f"{m[f'{arch}.rope.scaling.type']} x{m.get(f'{arch}.rope.scaling.factor', 1):g}"))
    pairs.append(("quantization", quantization(g)))
    return pairs


def format_pairs(pairs: list[tuple[str, object]], indent: int = 4) -> str:
    width = max((len(k) for k, _ in pairs), default=0) + 4
    return "\n".join(f"{' ' * indent}{k:<{width}}{v}" for k, v in pairs)
