"""Quantized linear layers that keep GGUF weights as blocks, in place in the mmap.

`QuantLinear(raw, qtype, in_features, out_features)` computes ``x @ W.T`` with W
stored as GGML blocks. `raw` is used in place, never copied or repacked: the
module keeps a reference to it, so the memory map under a zero-copy `raw` stays
mapped as long as the module lives, and the engine must not close it. Resident
memory is the touched pages of the file and nothing else (plus, above
`GEMV_MAX_ROWS` input rows, one reused per-thread scratch tile of at most
`TILE_ELEMS` floats).

Two backends, switched by `set_backend`:

- ``"reference"``: dequantize a tile of rows with `tightkv.gguf.quants` and
  `F.linear` in float32; never the whole matrix at once.
- ``"fast"`` (default): a small C++ kernel (`csrc/qmatmul.cpp`, built by
  `library`). It reads each block once and multiplies it into up to 8
  activation rows; more rows run in groups of 8 over each chunk of weight rows
  in turn, so a prompt reads its weights from memory once. AVX2 and AVX-512
  builds (`csrc/gemv_avx2.h`) quantize the activation rows to int8 in groups of
  32 (Q4_K, Q5_K and Q6_K: in blocks of 256, as llama.cpp's Q8_K) and multiply
  bytes with maddubs/madd (one VNNI dpbusd on AVX-512 VNNI), as llama.cpp's AVX2
  and VNNI paths do, which on AVX2 halves the instructions per weight (Gemma 3
  270M, all weights of one decode step on the 2-core AVX2 EPYC: 16.3 ms -> 11.1
  ms, `bench/bench_qmatmul.py`; on the AVX-512 VNNI EPYC, one thread, busy box:
  20.5 -> 15.6 ms against float32 dots). AVX-512 builds put two groups of 32 in
  one 512-bit register where K % 64 == 0, and on VNNI a call of more rows than
  `gemv_max_rows` (a prompt) is a GEMM: each chunk's weight rows unpacked once
  into 16-row tiles of int8 codes, every group of 8 activation rows run over
  them (`tk_gemm_rows`; about 2x the float32 tiles at 512 rows). AVX2 builds have
  a GEMM too: 8-row tiles, the activations as unsigned bytes times the codes by
  maddubs (Q8_0's by the sign trick), up to four products summed in int16 before one
  madd where the codes are small, and a 32-weight block's two halves under one float
  scale; it takes the 32-weight types and the k-quants (`tk_gemm_type`), the IQ and
  FP4 types keep the tiles (docs/weight-types.md). Portable builds
  decode 16 weights at a time to float32 (no activation quantization).

  Prompts (`INT8_PROMPTS`, on by default; ``TIGHTKV_INT8_PROMPTS=0`` turns it
  off) take the kernel at every row count where it beats the float32 tiles: the
  k-quants on every integer build, every block type that the build's GEMM takes;
  elsewhere, above `gemv_max_rows` rows, row tiles are dequantized
  (bit-exact with the reference) for torch's float32 matmul (oneDNN's, see
  `_pick_linear`). `bench/bench_qmatmul.py --crossover` times every layer's
  weights per row count. The measurements score in float32 (`float_prompts`):
  the int8 rounding of a prompt's activations raises the noise floor of every
  comparison between two caches (on Gemma 3 270M, the f32 against the f16 cache:
  KLD 0.0036 where float prompts give below 0.001). Threads: `build.threads()`,
  in the kernel's own pool, whose callers never wait for a helper thread that
  has not started (robust on busy or oversubscribed cores). Without a compiler,
  or with ``TIGHTKV_NO_COMPILE=1``, "fast" runs the reference path.

Why this kernel (measured on the 2-core AVX-512 dev box, 262144x640 Q8_0, one
row): it reads the blocks at 30 GB/s on one thread and about 45 GB/s on two;
torch.compile (Inductor) of a plain-torch block dot over the same raw bytes ran
at 8 GB/s after a 15 s compile per shape; Numba 3-4 GB/s (REFERENCES.md). For
64 rows it beats dequantize + float32 matmul 2-4x (MKL's sgemm on this AMD CPU).
See bench/bench_qmatmul.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from ..gguf import quants
from ..gguf.quants import FLOAT_TYPES
from . import build
from .abi import BLOCK_TYPES, TYPE_IDS, Part  # noqa: F401  (BLOCK_TYPES, TYPE_IDS: the kernels' type numbers)
from .build import set_threads  # noqa: F401  (the engine sets kernel threads here)

GEMV_MAX_ROWS = None  # above this many input rows: dequantized tiles + float32 matmul; None: `gemv_max_rows`
KERNEL_ALWAYS = frozenset({"Q4_K", "Q5_K", "Q6_K"})  # with INT8_PROMPTS: the block-dot kernel at any row count
INT8_PROMPTS = os.environ.get("TIGHTKV_INT8_PROMPTS", "1") != "0"
_scoring = threading.local()  # depth: within `float_prompts` on this thread


@contextlib.contextmanager
def float_prompts():
    """Within this (on the calling thread), prompts take float32 tiles above
    `gemv_max_rows` whatever `INT8_PROMPTS` says: what a measurement scores (perplexity,
    KLD, prompt logprobs), so that two caches compare above int8 rounding's noise."""
    depth = getattr(_scoring, "depth", 0)
    _scoring.depth = depth + 1
    try:
        yield
    finally:
        _scoring.depth = depth


def gemv_max_rows(lib) -> int:
    """The most input rows the block-dot kernel takes (`GEMV_MAX_ROWS` where set): the
    crossover with dequantized tiles, 40 on AVX-512 builds, 24 on the others
    (`bench/bench_qmatmul.py --crossover`; docs/weight-types.md)."""
    if GEMV_MAX_ROWS is not None:
        return GEMV_MAX_ROWS
    if id(lib) not in _MAX_ROWS:
        _MAX_ROWS[id(lib)] = 40 if lib.tk_simd() == 512 else 24
    return _MAX_ROWS[id(lib)]


_MAX_ROWS: dict[int, int] = {}  # per loaded library


def takes_kernel(lib, qtypes, rows: int) -> bool:
    """Whether `rows` input rows of weights of these types take the block-dot kernel: up to
    `gemv_max_rows`, and with `INT8_PROMPTS` (outside `float_prompts`) above it on a build
    that quantizes the activations: where every type is in `KERNEL_ALWAYS`, or where the
    build's prompt GEMM takes every type (`tk_gemm_rows`, `tk_gemm_type`: all block types
    with AVX-512 VNNI, the 32-weight types and the k-quants on AVX2). A set `GEMV_MAX_ROWS`
    holds for every type."""
    if rows <= gemv_max_rows(lib):
        return True
    if not (INT8_PROMPTS and not getattr(_scoring, "depth", 0) and GEMV_MAX_ROWS is None and lib.tk_gemv_int8()):
        return False
    if all(q in KERNEL_ALWAYS for q in qtypes):
        return True
    # the kernel runs the rows below tk_gemm_rows as a decode batch's, the GEMM from there
    return lib.tk_gemm_rows() > 0 and all(lib.tk_gemm_type(TYPE_IDS[q]) for q in qtypes)


def kernel_rows() -> int:
    """The most input rows a forward sends through the block-dot kernel (0 where the
    reference backend or no compiled library runs)."""
    lib = build.library() if _BACKEND == "fast" else None
    return 0 if lib is None else gemv_max_rows(lib)


TILE_ELEMS = 1 << 22  # weight elements per dequantized tile (16 MB of float32)
PARALLEL_MIN_BYTES = 1 << 16  # smaller weights run the block-dot kernel on one thread

_BACKEND = "fast"


def check_backend(name: str, what: str) -> str:
    if name not in ("fast", "reference"):
        raise ValueError(f"unknown {what} backend {name!r} (fast or reference)")
    return name


def set_backend(name: str) -> None:
    """Choose "fast" (compiled kernel where available) or "reference" for all QuantLinears."""
    global _BACKEND
    _BACKEND = check_backend(name, "qmatmul")


def get_backend() -> str:
    return _BACKEND


def small_ops(x: torch.Tensor):
    """The kernel library for a float32 tensor's per-token op (RMS norm, RoPE), or None
    (torch then). Whatever the tensor's size: a row must compute the same alone, in a
    batch or in a prompt chunk, so the path may not depend on how many rows come along."""
    if x.dtype != torch.float32 or _BACKEND != "fast":
        return None
    return build.library()


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A zero-copy torch view of a (possibly read-only, memory-mapped) numpy array."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


class QuantLinear(torch.nn.Module):
    """y = x @ W.T with W (out_features, in_features) kept as GGML blocks.

    raw: uint8 (out_features, row_bytes) block bytes, typically a zero-copy view of
    the GGUF memory map (kept alive by this module, used in place); or, for
    F32/F16/BF16, the float tensor (out_features, in_features) or its bytes.
    """

    def __init__(self, raw: torch.Tensor | np.ndarray, qtype: str, in_features: int, out_features: int):
        super().__init__()
        quants.check_supported(qtype, f"<{out_features}x{in_features}>")
        if isinstance(raw, np.ndarray):
            raw = as_tensor(raw)
        self.qtype, self.in_features, self.out_features = qtype, in_features, out_features
        self.row_bytes = quants.row_bytes(qtype, in_features)
        if qtype in FLOAT_TYPES:
            if raw.dtype == torch.uint8:
                raw = raw.reshape(out_features, self.row_bytes).view(FLOAT_TYPES[qtype])
            raw = raw.reshape(out_features, in_features)  # (out, in) float
            if raw.stride(1) != 1:
                raw = raw.contiguous()
        else:
            if raw.dtype != torch.uint8:
                raise ValueError(f"{qtype} weight must be uint8 block bytes, not {raw.dtype}")
            raw = raw.reshape(out_features, self.row_bytes)  # (out, row_bytes) uint8
            if raw.stride(1) != 1:
                raw = raw.contiguous()
        self.register_buffer("raw", raw, persistent=False)
        self._tid = TYPE_IDS.get(qtype, -1)  # kernel type id; -1 for float types
        self._half = {"F16": 0, "BF16": 1}.get(qtype)  # tk_gemv_float's weights (decode rows)
        self._nbytes = raw.numel() * raw.element_size()
        # the block kernel's view of `raw` (never moved: the module stays on the CPU)
        self._ptr, self._ld = raw.data_ptr(), raw.stride(0) * raw.element_size()

    def extra_repr(self) -> str:
        return f"{self.qtype}, in_features={self.in_features}, out_features={self.out_features}"

    @property
    def nbytes(self) -> int:
        """Bytes of the weight as stored (the only memory this layer holds)."""
        return self._nbytes

    # What a kernel call takes of this weight (`abi.Part`: type, weights, row stride, rows)

    @property
    def type_id(self) -> int:
        """The block type's number in the kernels (`abi.TYPE_IDS`); -1 for float types,
        which the block kernels do not take."""
        return self._tid

    @property
    def data_ptr(self) -> int:
        """The address of the first weight row (`raw`, which never moves: the module stays on the CPU)."""
        return self._ptr

    @property
    def row_stride(self) -> int:
        """Bytes from one weight row to the next."""
        return self._ld

    def kernel_part(self) -> Part | None:
        """This weight as one part of a kernel product (`abi.Part`); None for float types."""
        return None if self._tid < 0 else Part(self._tid, self._ptr, self._ld, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 (..., in_features) -> float32 (..., out_features)."""
        k, n = self.in_features, self.out_features
        lib = build.library() if (self._tid >= 0 or self._half is not None) and _BACKEND == "fast" else None
        if (
            lib is not None and x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float32 and x.is_contiguous()
        ):  # decode: one row, straight to the kernel
            return self._gemv(lib, x, 1)
        x2 = x if x.dim() == 2 else x.reshape(-1, k)  # (M, in)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        m = x2.shape[0]
        if self.qtype == "F32":
            y = F.linear(x2, self.raw)
        elif self._half is not None:  # F16, BF16: the kernel for a few rows, else float32 tiles
            y = (
                self._gemv(lib, x2, m)
                if lib is not None and m <= gemv_max_rows(lib)
                else self._tiled(x2, self._ref_tile)
            )
        elif lib is not None:
            if takes_kernel(lib, (self.qtype,), m):
                y = self._gemv(lib, x2, m)
            else:
                nth = self._threads(m)
                y = self._tiled(x2, lambda r0, r1: self._fast_tile(lib, r0, r1, nth))
        else:
            y = self._tiled(x2, self._ref_tile)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], n)

    __call__ = forward  # no hooks on the hot path: nn.Module's call machinery costs ~2 us a layer

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (n,) of W, dequantized exactly: float32 (n, in_features)."""
        ids = ids.reshape(-1).long()
        rows = self.raw[ids]  # (n, row bytes), gathered
        lib = build.library() if self._tid >= 0 and _BACKEND == "fast" else None
        if lib is None:
            return quants.dequantize(rows, self.qtype, (ids.numel(), self.in_features))
        out = torch.empty(ids.numel(), self.in_features)
        if lib.tk_dequant(self._tid, rows.data_ptr(), rows.stride(0), ids.numel(), self.in_features, out.data_ptr(), 1):
            raise self._error(self.in_features)
        return out

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of W as float32 (stop - start, in_features)."""
        stop = self.out_features if stop is None else stop
        return self._ref_tile(start, stop)

    # -- paths ---------------------------------------------------------------

    def _threads(self, m: int) -> int:
        return build.threads() if self._nbytes * m >= PARALLEL_MIN_BYTES else 1

    def _gemv(self, lib, x2: torch.Tensor, m: int) -> torch.Tensor:
        """The block-dot kernel: x2 (M, in) contiguous float32 -> (M, out)."""
        n, k = self.out_features, self.in_features
        y = torch.empty(m, n)  # (M, out)
        if self._half is not None:
            failed = lib.tk_gemv_float(
                self._half, self._ptr, self._ld, n, k, x2.data_ptr(), m, y.data_ptr(), self._threads(m)
            )
        else:
            failed = lib.tk_gemv(self._tid, self._ptr, self._ld, n, k, x2.data_ptr(), m, y.data_ptr(), self._threads(m))
        if failed:
            raise self._error(k)
        return y

    def _error(self, k: int) -> RuntimeError:
        lib = build.library()
        if lib is not None and not lib.tk_lowbit_ready(self._tid):
            return RuntimeError(f"tightkv kernel: the {self.qtype} tables were not loaded")
        return RuntimeError(f"tightkv kernel: bad {self.qtype} shape {self.out_features}x{k}")

    def _tile_rows(self) -> int:
        return max(1, min(self.out_features, TILE_ELEMS // self.in_features))

    def _tiled(self, x2: torch.Tensor, tile_fn) -> torch.Tensor:
        n = self.out_features
        step = self._tile_rows()
        if step >= n:
            return _linear(x2, tile_fn(0, n))
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)  # (M, out)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            y[:, r0:r1] = _linear(x2, tile_fn(r0, r1))
        return y

    def _ref_tile(self, r0: int, r1: int) -> torch.Tensor:
        return quants.dequantize(self.raw[r0:r1], self.qtype, (r1 - r0, self.in_features))

    def _fast_tile(self, lib, r0: int, r1: int, nth: int) -> torch.Tensor:
        """Rows r0:r1 of W dequantized by the kernel (bit-exact) into a reused buffer."""
        k = self.in_features
        buf = _scratch((r1 - r0) * k)[: (r1 - r0) * k].view(r1 - r0, k)
        ptr = self.raw.data_ptr() + r0 * self.raw.stride(0)
        if lib.tk_dequant(self._tid, ptr, self.raw.stride(0), r1 - r0, k, buf.data_ptr(), nth):
            raise self._error(k)
        return buf


class StackedLinear(torch.nn.Module):
    """Several `QuantLinear`s over the same input, their outputs side by side:
    y (..., sum of out_features) = [x @ W_1.T, x @ W_2.T, ...] (q, k and v; gate and up).

    Each part keeps its own blocks and type. Up to `GEMV_MAX_ROWS` rows, one kernel call
    quantizes the activations once and runs every part's rows in one pass of the pool,
    with the same arithmetic per row as the parts alone; above it, the parts run one
    by one. `sizes` splits the result: ``q, k, v = y.split(stacked.sizes, -1)``.
    """

    def __init__(self, parts: list[QuantLinear]):
        super().__init__()
        if len({p.in_features for p in parts}) != 1 or not 1 <= len(parts) <= 8:
            raise ValueError("stacked linears need 1 to 8 parts with the same in_features")
        self.parts = parts  # a plain list: the parts are views of the file, not parameters
        self.in_features = parts[0].in_features
        self.sizes = [p.out_features for p in parts]
        self.out_features = sum(self.sizes)
        self._nbytes = sum(p.nbytes for p in parts)
        blocks = all(p.type_id >= 0 for p in parts)
        self._args = (
            None
            if not blocks
            else [
                (ctypes.c_int * len(parts))(*(p.type_id for p in parts)),
                (ctypes.c_void_p * len(parts))(*(p.data_ptr for p in parts)),
                (ctypes.c_int64 * len(parts))(*(p.row_stride for p in parts)),
                (ctypes.c_int64 * len(parts))(*self.sizes),
            ]
        )

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 (..., in_features) -> float32 (..., out_features)."""
        lib = build.library() if self._args is not None and _BACKEND == "fast" else None
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # (M, in)
        if (
            lib is None
            or not takes_kernel(lib, [p.qtype for p in self.parts], x2.shape[0])
            or x2.dtype != torch.float32
            or not x2.is_contiguous()
        ):
            y = torch.cat([p(x2) for p in self.parts], dim=-1)
        else:
            m = x2.shape[0]
            y = torch.empty(m, self.out_features)  # (M, out)
            nth = build.threads() if self._nbytes * m >= PARALLEL_MIN_BYTES else 1
            if lib.tk_gemv_parts(len(self.parts), *self._args, self.in_features, x2.data_ptr(), m, y.data_ptr(), nth):
                raise RuntimeError(f"tightkv kernel: stacked {[p.qtype for p in self.parts]} failed")
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    __call__ = forward


def _onednn_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _pick_linear():
    """x (M, K) @ w (N, K).T in float32: torch's oneDNN linear where this build has it.
    Measured on the AVX-512 dev box (Gemma 3 270M shapes, 512 rows, 2 threads): 433
    GFLOPS against 193 for F.linear, whose BLAS takes a slower path on AMD CPUs."""
    try:
        x, w = torch.randn(3, 32), torch.randn(5, 32)
        if torch.allclose(_onednn_linear(x, w), F.linear(x, w), atol=1e-5):
            return _onednn_linear
    except (AttributeError, RuntimeError):
        pass
    return F.linear


_linear = _pick_linear()
_local = threading.local()


def release_scratch() -> None:
    """Drop this thread's dequantized-tile buffer (the next prefill makes it again)."""
    _local.buf = None


def _scratch(numel: int) -> torch.Tensor:
    """A per-thread float32 buffer of at least `numel` elements, reused across calls."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _local.buf = torch.empty(numel, dtype=torch.float32)
    return buf
