"""The kernel library's ABI on the Python side: every number, struct and signature that `csrc/`
declares and Python hands over, in one place.

- `Kind`: the attention kernel's storage kinds (`csrc/attention.cpp`, ``enum Kind``); a KV codec
  names its kind with a member (`kv/codecs.py`, ``kernel_kind``).
- `BLOCK_TYPES` / `TYPE_IDS`: the weight kernels' type numbers (`csrc/qmatmul.cpp`, ``DISPATCH``).
- `Seg`, `AttnArgs`: what `tk_attn` takes (a segment of stored tokens; the call's arguments).
- `Part`, `Product`, `FfnPlan`, `QkvPlan`, `MoePlan`: the sublayer plans `tk_ffn_block`,
  `tk_qkv_block`, `tk_moe_row` and `tk_moe_block` take.
- `FUNCTIONS`: each exported function's result and argument types, as `build.py` declares them.

Each mirrors a C++ declaration field by field; ``tests/test_kernel_abi.py`` parses the C++
sources and fails where the two differ (a name, an order, a type, a size or a value), so
a change on one side only cannot go unnoticed. Pointers are ``c_void_p`` (addresses as
ints: ``tensor.data_ptr()``), except where a struct is passed by pointer.
"""

from __future__ import annotations

import ctypes
import enum

_p, _i64, _i32, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


class Kind(enum.IntEnum):
    """How a segment's keys or values are stored (`csrc/attention.cpp`, ``enum Kind``)."""

    F32 = 0
    F16 = 1
    BF16 = 2
    Q8_0 = 3
    TQ4 = 4  # TurboQuant codebook codes, 4 bits (nibbles paired for the int8 paths)
    Q4_0 = 5
    TQ3 = 6  # codebook codes like tq4's, in channel order
    TQ2 = 7
    AK4 = 8  # affine key codes (KVarN and KIVI keys), 4, 3, 2 bits
    AK3 = 9
    AK2 = 10
    AV4 = 11  # KVarN value codes
    AV3 = 12
    AV2 = 13
    AB4 = 14  # KIVI value codes
    AB3 = 15
    AB2 = 16

    @classmethod
    def named(cls, name: str) -> Kind | None:
        """The kind called `name` in either case ("tq4", "ak3", "q8_0"); None where the kernel has none."""
        return cls.__members__.get(name.upper())


NKINDS = len(Kind)  # ``NKINDS`` in the C++ enum
CODEBOOK_KINDS = frozenset({Kind.TQ4, Kind.TQ3, Kind.TQ2})  # kinds that take a codebook (kcb, vcb)

# weight block types, numbered as the weight kernels' `type` argument (csrc/qmatmul.cpp, DISPATCH)
BLOCK_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    # decoded to int8 codes and per-16 scales block by block (csrc/lowbit.h)
    "IQ4_NL",
    "IQ4_XS",
    "Q1_0",
    "Q2_0",
    "TQ1_0",
    "TQ2_0",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
    "MXFP4",
    "NVFP4",
)
TYPE_IDS = {name: i for i, name in enumerate(BLOCK_TYPES)}  # the kernels' type numbers ("NTYPES" in C++)


class Seg(ctypes.Structure):
    """A run of stored tokens of one kind (`csrc/attention.cpp`, ``struct Seg``). Per side (k, v)
    up to four fields: field i at address ``k{i}``, head stride ``kh{i}`` and row stride ``kt{i}``
    bytes; fields 0 and 1 hold a row per token, fields 2 and 3 one per ``kd2`` / ``kd3`` tokens.
    ``body``: the segment is in the body's code domain (rotation, channel scale and centre)."""

    _fields_ = [
        ("kkind", _i64),
        ("vkind", _i64),
        ("body", _i64),
        ("unused", _i64),
        ("k0", _p),
        ("k1", _p),
        ("kh0", _i64),
        ("kt0", _i64),
        ("kh1", _i64),
        ("kt1", _i64),
        ("v0", _p),
        ("v1", _p),
        ("vh0", _i64),
        ("vt0", _i64),
        ("vh1", _i64),
        ("vt1", _i64),
        ("k2", _p),
        ("k3", _p),
        ("kh2", _i64),
        ("kt2", _i64),
        ("kd2", _i64),
        ("kh3", _i64),
        ("kt3", _i64),
        ("kd3", _i64),
        ("v2", _p),
        ("v3", _p),
        ("vh2", _i64),
        ("vt2", _i64),
        ("vd2", _i64),
        ("vh3", _i64),
        ("vt3", _i64),
        ("vd3", _i64),
    ]


class AttnArgs(ctypes.Structure):
    """`tk_attn`'s arguments (`csrc/attention.cpp`, ``struct AttnArgs``): queries q (Hkv, R, D),
    R = (H / Hkv) * T rows per KV head; each side's body rotation (signs, Hadamard block),
    channel scale and centre (null: none); `nseg` segments and their ranges (nseg, T, 2);
    codebooks (16 floats, null: none); the output (Hkv, R, Dv); a sink logit per query head
    (null: none); steps (non-zero: each query position computed as a decode step of it alone
    computes it, bit for bit)."""

    _fields_ = [
        ("q", _p),
        ("Hkv", _i64),
        ("R", _i64),
        ("T", _i64),
        ("D", _i64),
        ("Dv", _i64),
        ("ksigns", _p),
        ("khb", _i64),
        ("kscale", _p),
        ("kcenter", _p),
        ("vsigns", _p),
        ("vhb", _i64),
        ("vscale", _p),
        ("vcenter", _p),
        ("nseg", _i64),
        ("segs", _p),
        ("ranges", _p),
        ("kcb", _p),
        ("vcb", _p),
        ("chunk_tokens", _i64),
        ("out", _p),
        ("sinks", _p),
        ("steps", _i64),
        ("scale", _f32),
        ("nth", ctypes.c_int32),
    ]


class Part(ctypes.Structure):
    """One weight matrix of a product (`csrc/qmatmul.cpp`, ``struct Part``): its type number
    (`TYPE_IDS`), the address of its first row, the row stride in bytes and its rows."""

    _fields_ = [("type", _i64), ("w", _p), ("ld", _i64), ("rows", _i64)]


class Product(ctypes.Structure):
    """Up to three weight matrices over the same input, outputs side by side (q, k, v; gate,
    up), and their bytes in all (`csrc/qmatmul.cpp`, ``struct Product``)."""

    _fields_ = [("n", _i64), ("bytes", _i64), ("part", Part * 3)]


class FfnPlan(ctypes.Structure):
    """What `tk_ffn_block` takes (`csrc/qmatmul.cpp`, ``struct FfnPlan``)."""

    _fields_ = [
        ("d", _i64),
        ("ff", _i64),
        ("act", _i64),
        ("width", _i64),
        ("post_attn_norm", _p),
        ("ffn_norm", _p),
        ("post_ffn_norm", _p),
        ("wo", Product),
        ("gate_up", Product),
        ("down", Product),
    ]


class QkvPlan(ctypes.Structure):
    """What `tk_qkv_block` takes (`csrc/qmatmul.cpp`, ``struct QkvPlan``)."""

    _fields_ = [
        ("H", _i64),
        ("Hkv", _i64),
        ("D", _i64),
        ("K", _i64),
        ("bias", _p),
        ("q_norm", _p),
        ("k_norm", _p),
        ("qkv", Product),
    ]


class MoePlan(ctypes.Structure):
    """A block's router and experts as `tk_moe_row` and `tk_moe_block` take them
    (`csrc/qmatmul.cpp`, ``struct MoePlan``): the router (E, K) float32 and its bias (null:
    none); k experts used, renormalized to sum 1, times `scale` (0: not); gate and up
    (E, 2) and down (E,) types, addresses and row strides; the expert width ff and the act
    (`sublayers.ACT_IDS`); the experts' biases (null: none)."""

    _fields_ = [
        ("R", _p),
        ("rb", _p),
        ("E", _i64),
        ("K", _i64),
        ("k", _i64),
        ("ff", _i64),
        ("act", _i64),
        ("gu_types", _p),
        ("gu_ws", _p),
        ("gu_lds", _p),
        ("d_types", _p),
        ("d_ws", _p),
        ("d_lds", _p),
        ("gb", _p),
        ("ub", _p),
        ("db", _p),
        ("scale", ctypes.c_double),
    ]


STRUCTS = (Seg, AttnArgs, Part, Product, FfnPlan, QkvPlan, MoePlan)  # each mirrors the C++ struct of its name

# name: (result type, argument types) of each exported function (None: void)
FUNCTIONS = {
    # weights (csrc/qmatmul.cpp)
    "tk_gemv": (_i32, [_i32, _p, _i64, _i64, _i64, _p, _i64, _p, _i32]),
    "tk_gemv_parts": (_i32, [_i32, _p, _p, _p, _p, _i64, _p, _i64, _p, _i32]),
    "tk_gemv_float": (_i32, [_i32, _p, _i64, _i64, _i64, _p, _i64, _p, _i32]),
    "tk_gemv_each": (_i32, [_i32, _p, _p, _p, _i64, _i64, _p, _p, _i32]),
    "tk_moe_row": (_i32, [_p, _p, _p, _p, _p, _i32]),
    "tk_dequant": (_i32, [_i32, _p, _i64, _i64, _i64, _p, _i32]),
    "tk_simd": (_i32, []),
    "tk_gemv_int8": (_i32, []),
    "tk_gemm_rows": (_i32, []),
    "tk_gemm_type": (_i32, [_i32]),
    "tk_lowbit_table": (_i32, [_i32, _p, _i64]),
    "tk_lowbit_ready": (_i32, [_i32]),
    # per-token ops and sublayers (csrc/qmatmul.cpp); the plans are still handed over as int64 arrays
    "tk_rms_norm": (None, [_p, _p, _i64, _i64, _f32, _p]),
    "tk_add_rms_norm": (None, [_p, _p, _p, _p, _i64, _i64, _f32, _p, _p]),
    "tk_glu": (None, [_p, _i64, _i64, _i32, _p]),
    "tk_argmax": (None, [_p, _i64, _i64, _i64, _p]),
    "tk_rope_neox": (None, [_p, _p, _p, _i64, _i64, _i64, _i64, _p]),
    "tk_qkv_heads": (None, [_p, _i64, _i64, _i64, _i64, _p, _p, _f32, _p, _p, _i64, _p, _p, _p]),
    "tk_ffn_block": (_i32, [_p, _p, _p, _i64, _f32, _p, _p, _p, _i32, _i64]),
    "tk_moe_block": (_i32, [_p, _p, _p, _p, _i64, _f32, _p, _p, _p, _i32, _i64]),
    "tk_qkv_block": (_i32, [_p, _p, _i64, _f32, _p, _p, _i64, _p, _p, _p, _i32, _i64]),
    # a Gated DeltaNet decode token (csrc/recurrent.cpp)
    "tk_gdn_step": (
        _i32,
        [_p, _p, _p, _i64, _i64, _p, _p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _p, _f32, _p, _p, _i32],
    ),
    # attention and the KV encoders (csrc/attention.cpp, csrc/encode.cpp)
    "tk_attn": (_i32, [ctypes.POINTER(AttnArgs)]),
    "tk_attn_int8": (_i32, [_i32]),
    "tk_tq_encode": (_i32, [_p, _i64, _i64, _i32, _p, _p, _i64, _p, _p, _i32, _p, _p, _i32]),
    "tk_kvarn_encode": (_i32, [_p, _i64, _i64, _i64, _i32, _i32, _i64, _p, _i64, _p, _p, _p, _p, _i32]),
}


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set every exported function's argument and result types on a loaded library."""
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
