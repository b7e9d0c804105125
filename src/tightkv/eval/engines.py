"""A tightkv cache type in the words of the engines people deploy: llama.cpp's
`-ctk/-ctv` (with `-fa on`, which a quantized V cache needs) and vLLM's
`--kv-cache-dtype`, and the KV bytes each engine would hold per sequence.

An equivalent is the same when the engine stores the same format or runs the
same algorithm (llama.cpp's q8_0 and q4_0 blocks are ours bit for bit; vLLM's
`turboquant_4bit_nc` is TurboQuant's 4-bit MSE quantizer without the QJL
correction, as our `tq4`), and the nearest by bits otherwise, marked as such. Neither engine keeps our exact sink and recent
window, so a preset that adds them (`progressive`) maps to its body type.

Bytes per sequence count every attention layer's K and V at the context (a
sliding-window layer at its window, as llama.cpp with `swa_full` off and vLLM's
hybrid allocator hold it): llama.cpp's from its block sizes; vLLM's TurboQuant
types estimated from their layout (the codes and an fp16 norm per head vector).
A hybrid model's linear-attention layers hold no KV: their recurrent state
stays float32 in every engine, whatever the cache type, and is left out here.
"""

from __future__ import annotations

from dataclasses import dataclass

# bits per element of each engine's cache types
LLAMACPP_BITS = {
    "f32": 32.0,
    "f16": 16.0,
    "bf16": 16.0,
    "q8_0": 8.5,
    "q5_1": 6.0,
    "q5_0": 5.5,
    "q4_1": 5.0,
    "q4_0": 4.5,
    "iq4_nl": 4.5,
}
VLLM_BITS = {"auto": 16.0, "fp8": 8.0}  # turboquant: codes plus a norm per vector (`_vllm_bits`)
VLLM_TURBOQUANT = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4), "turboquant_3bit_nc": (3, 3)}

# tightkv type -> (llama.cpp K, V, exact), (vLLM dtype, exact)
_EQUIVALENTS = {
    "f32": (("f32", "f32", True), ("auto", False)),  # vLLM caches in the model's dtype (--dtype float32 for f32)
    "f16": (("f16", "f16", True), ("auto", True)),
    "q8_0": (("q8_0", "q8_0", True), ("fp8", False)),
    "q4_0": (("q4_0", "q4_0", True), ("turboquant_4bit_nc", False)),
    "k8v4": (("q8_0", "q4_0", False), ("turboquant_k8v4", True)),  # q8_0 keys, TurboQuant 4-bit values
    "tq4": (("q4_0", "q4_0", False), ("turboquant_4bit_nc", True)),
    "progressive": (("q4_0", "q4_0", False), ("turboquant_4bit_nc", False)),  # tq4 with an exact sink and window
    "tq3": (("q4_0", "q4_0", False), ("turboquant_3bit_nc", True)),
}
_NEAREST_BY_BITS = {
    4: (("q4_0", "q4_0", False), ("turboquant_4bit_nc", False)),
    3: (("q4_0", "q4_0", False), ("turboquant_3bit_nc", False)),
    2: (("q4_0", "q4_0", False), ("turboquant_3bit_nc", False)),
}


@dataclass
class Equivalent:
    engine: str  # "llama.cpp" or "vLLM"
    flags: str  # the command-line setting
    exact: bool  # the same format or algorithm, or only the nearest
    bytes_per_sequence: int  # KV bytes of one sequence at the context


def _bits_of(spec: str) -> int:
    """The nominal bits of a type without an equivalent (kvarn3 -> 3, aggressive -> 3)."""
    import re

    if spec == "aggressive":
        return 3
    m = re.search(r"(\d)", spec)
    return int(m.group(1)) if m else 4


def _vllm_bits(dtype: str, head_dim: int) -> tuple[float, float]:
    if dtype in VLLM_TURBOQUANT:
        k, v = VLLM_TURBOQUANT[dtype]
        norm = 16 / head_dim
        return (k if k == 8 else k + norm), v + norm
    return VLLM_BITS[dtype], VLLM_BITS[dtype]


def sequence_bytes(layout: list, context: int, k_bits, v_bits) -> int:
    """K and V bytes of one sequence at `context` tokens (the attention layers of `layout`);
    k_bits, v_bits are bits per element or functions of the head dim."""
    from ..kv.spec import attention_layers

    total = 0.0
    for heads, d, dv, window in attention_layers(layout):
        cells = context if window is None else min(context, window)
        kb = k_bits(d) if callable(k_bits) else k_bits
        vb = v_bits(dv) if callable(v_bits) else v_bits
        total += cells * heads * (d * kb + dv * vb) / 8
    return int(total)


def equivalents(spec: str, layout: list, context: int) -> list[Equivalent]:
    """llama.cpp's and vLLM's settings for a tightkv type (exact or nearest), each with
    the KV bytes that engine holds per sequence at `context`."""
    base = spec.split(",")[0].strip().lower()
    (ck, cv, c_exact), (vd, v_exact) = _EQUIVALENTS.get(base) or _NEAREST_BY_BITS.get(
        _bits_of(base), _NEAREST_BY_BITS[4]
    )
    quantized_v = cv not in ("f16", "f32", "bf16")
    llama = Equivalent(
        "llama.cpp",
        f"-ctk {ck} -ctv {cv}" + (" -fa on" if quantized_v else ""),
        c_exact,
        sequence_bytes(layout, context, LLAMACPP_BITS[ck], LLAMACPP_BITS[cv]),
    )
    vllm = Equivalent(
        "vLLM",
        f"--kv-cache-dtype {vd}",
        v_exact,
        sequence_bytes(layout, context, lambda d: _vllm_bits(vd, d)[0], lambda d: _vllm_bits(vd, d)[1]),
    )
    return [llama, vllm]


def format_equivalents(spec: str, items: list[Equivalent], context: int) -> list[str]:
    """Lines for `tightkv plan`: each engine's setting, marked when it is only the nearest."""
    lines = []
    for e in items:
        what = e.flags if e.exact else f"no equivalent of {spec}; nearest: {e.flags}"
        lines.append(
            f"  {e.engine + ':':<10} {what} ({e.bytes_per_sequence / 2**20:.1f} MiB KV per sequence "
            f"at {context} tokens)"
        )
    return lines
