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
- ``"fast"`` (default): a small C++ kernel, compiled once per machine with the
  system C++ compiler (about 5 s) into ``$TIGHTKV_HOME/kernels`` and loaded with
  ctypes. It reads each block once, decodes 16 weights at a time with SIMD
  (AVX-512, AVX2 or plain C) and multiplies them into up to 4 float32 activation
  rows (float32 accumulation, no activation quantization). Above
  `GEMV_MAX_ROWS` rows it dequantizes row tiles (bit-exact with the reference)
  for torch's float32 matmul (oneDNN's, see `_pick_linear`). Threads: `torch.get_num_threads()`, in the
  kernel's own pool, whose callers never wait for a helper thread that has not
  started (robust on busy or oversubscribed cores). Without a compiler, or with
  ``TIGHTKV_NO_COMPILE=1``, "fast" runs the reference path.

Why this kernel (measured on the 2-core AVX-512 dev box, 262144x640 Q8_0, one
row): it reads the blocks at 30 GB/s on one thread and about 45 GB/s on two;
torch.compile (Inductor) of a plain-torch block dot over the same raw bytes ran
at 8 GB/s after a 15 s compile per shape; Numba 3-4 GB/s (REFERENCES.md). For
64 rows it beats dequantize + float32 matmul 2-4x (MKL's sgemm on this AMD CPU).
See bench/bench_qmatmul.py.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..gguf import quants

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_TYPE_IDS = {name: i for i, name in enumerate(BLOCK_TYPES)}  # the kernel's type numbers
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
GEMV_MAX_ROWS = 24  # above this many input rows: dequantized tiles + float32 matmul (measured crossover)
TILE_ELEMS = 1 << 22  # weight elements per dequantized tile (16 MB of float32)
PARALLEL_MIN_BYTES = 1 << 16  # smaller weights run the block-dot kernel on one thread

_BACKEND = "fast"


_THREADS: int | None = None  # kernel threads; None follows torch.get_num_threads()


def set_threads(n: int | None) -> None:
    """Threads for the block kernels, independent of torch's (None: follow torch)."""
    global _THREADS
    _THREADS = n if n is None else max(1, int(n))


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


SMALL_OP_ELEMS = 1 << 14  # tensors up to this size take the kernel's small ops (decode)


def small_ops(x: torch.Tensor):
    """The kernel library for a small float32 tensor's per-token op, or None (torch then)."""
    if x.numel() > SMALL_OP_ELEMS or x.dtype != torch.float32 or _BACKEND != "fast":
        return None
    return _lib if _lib_state == "loaded" else _kernel()


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
        else:
            if raw.dtype != torch.uint8:
                raise ValueError(f"{qtype} weight must be uint8 block bytes, not {raw.dtype}")
            raw = raw.reshape(out_features, self.row_bytes)  # (out, row_bytes) uint8
            if raw.stride(1) != 1:
                raw = raw.contiguous()
        self.register_buffer("raw", raw, persistent=False)
        self._tid = _TYPE_IDS.get(qtype, -1)  # kernel type id; -1 for float types
        self._nbytes = raw.numel() * raw.element_size()
        # the block kernel's view of `raw` (never moved: the module stays on the CPU)
        self._ptr, self._ld = raw.data_ptr(), raw.stride(0) * raw.element_size()

    def extra_repr(self) -> str:
        return f"{self.qtype}, in_features={self.in_features}, out_features={self.out_features}"

    @property
    def nbytes(self) -> int:
        """Bytes of the weight as stored (the only memory this layer holds)."""
        return self._nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 (..., in_features) -> float32 (..., out_features)."""
        k, n = self.in_features, self.out_features
        if x.dim() == 2 and x.shape[0] == 1 and self._tid >= 0 and x.dtype == torch.float32 and _BACKEND == "fast" \
                and _lib_state == "loaded" and x.is_contiguous():  # decode: one row, straight to the kernel
            return self._gemv(_lib, x, 1)
        x2 = x if x.dim() == 2 else x.reshape(-1, k)  # (M, in)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        m = x2.shape[0]
        if self.qtype == "F32":
            y = F.linear(x2, self.raw)
        elif self._tid >= 0 and _BACKEND == "fast" and (lib := _lib if _lib_state == "loaded" else _kernel()) is not None:
            if m <= GEMV_MAX_ROWS:
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
        return quants.dequantize(self.raw[ids], self.qtype, (ids.numel(), self.in_features))

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of W as float32 (stop - start, in_features)."""
        stop = self.out_features if stop is None else stop
        return self._ref_tile(start, stop)

    # -- paths ---------------------------------------------------------------

    def _threads(self, m: int) -> int:
        return (_THREADS or torch.get_num_threads()) if self._nbytes * m >= PARALLEL_MIN_BYTES else 1

    def _gemv(self, lib, x2: torch.Tensor, m: int) -> torch.Tensor:
        """The block-dot kernel: x2 (M, in) contiguous float32 -> (M, out)."""
        n, k = self.out_features, self.in_features
        y = torch.empty(m, n)  # (M, out)
        if lib.tk_gemv(self._tid, self._ptr, self._ld, n, k, x2.data_ptr(), m, y.data_ptr(), self._threads(m)):
            raise RuntimeError(f"tightkv kernel: bad {self.qtype} shape {n}x{k}")
        return y

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
            raise RuntimeError(f"tightkv kernel: bad {self.qtype} shape {self.out_features}x{k}")
        return buf


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


def _scratch(numel: int) -> torch.Tensor:
    """A per-thread float32 buffer of at least `numel` elements, reused across calls."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _local.buf = torch.empty(numel, dtype=torch.float32)
    return buf


# -- the compiled kernel ---------------------------------------------------------

_lib: ctypes.CDLL | None = None
_lib_state = "unloaded"  # unloaded | loaded | unavailable
_lib_lock = threading.Lock()
_lib_error = ""


def kernel_status() -> str:
    """'loaded', 'unavailable: <why>' or 'unloaded' (not tried yet)."""
    return _lib_state + (f": {_lib_error}" if _lib_error else "")


def _kernel() -> ctypes.CDLL | None:
    global _lib, _lib_state, _lib_error
    if _lib_state != "unloaded":
        return _lib
    with _lib_lock:
        if _lib_state == "unloaded":
            try:
                _lib = _load()
                _lib_state = "loaded"
            except Exception as err:  # no compiler, odd platform: fall back to reference
                _lib, _lib_state, _lib_error = None, "unavailable", str(err).strip().splitlines()[0][:300]
    return _lib


def _cache_dir() -> Path:
    from ..registry import home

    return home() / "kernels"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


def _load(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Compile (once, cached by source, compiler, flags and CPU) and load the kernel.

    `extra_flags` (e.g. ``("-mno-avx512f",)``) exist for testing the AVX2 and
    plain-C paths on an AVX-512 machine.
    """
    if os.environ.get("TIGHTKV_NO_COMPILE", "") not in ("", "0"):
        raise RuntimeError("disabled by TIGHTKV_NO_COMPILE")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found")
    flags = ["-O3", "-march=native", *extra_flags, "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17", "-pthread"]
    source = _full_source()
    key = hashlib.sha256("\0".join([source, cxx, *flags, _cpu_id()]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    so = cache / f"qmatmul-{key}.so"
    if not so.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print("tightkv: compiling CPU kernels (first run only, a few seconds)...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "qmatmul.cpp"
            src.write_text(source)
            out = Path(tmp) / so.name
            proc = subprocess.run([cxx, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                err = proc.stderr.strip() or f"{cxx} exited with {proc.returncode}"
                raise RuntimeError(f"kernel compile failed: {err[:300]}")
            os.replace(out, so)
    lib = ctypes.CDLL(str(so))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.tk_gemv.argtypes = [i32, p, i64, i64, i64, p, i64, p, i32]
    lib.tk_dequant.argtypes = [i32, p, i64, i64, i64, p, i32]
    lib.tk_gemv.restype = lib.tk_dequant.restype = lib.tk_simd.restype = i32
    f32 = ctypes.c_float
    lib.tk_attn.argtypes = [p, i64, i64, i64, i64, i64, f32, p, p, p, p, p, p, i64, p, p, p, p, i64, p, i32]
    lib.tk_attn.restype = i32
    lib.tk_attn_int8.argtypes = [i32]
    lib.tk_attn_int8.restype = i32
    lib.tk_tq4_encode.argtypes = [p, i64, i64, p, p, i64, p, p, i32, p, p, i32]
    lib.tk_tq4_encode.restype = i32
    lib.tk_rms_norm.argtypes = [p, p, i64, i64, f32, p]
    lib.tk_rope_neox.argtypes = [p, p, p, i64, i64, i64, i64, p]
    lib.tk_rms_norm.restype = lib.tk_rope_neox.restype = None
    return lib


def _full_source() -> str:
    """The block kernels plus the fused attention kernel (one library, one thread pool)."""
    from .attention_src import SOURCE as ATTENTION

    return _SOURCE + ATTENTION


_SOURCE = r"""
// tightkv quantized matmul kernels: GGML blocks x float32 activations.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() { std::this_thread::yield(); }
#endif

// A tiny thread pool. A job's chunks are split in one contiguous range per
// thread; each thread claims chunks from the front of its own range with a
// compare-and-swap (so it streams through memory), then steals from the others'
// ranges. The caller works too and, once no chunk is left, waits only for chunks
// that other threads have already started: a helper that is slow to wake (busy
// or oversubscribed cores) never stalls a call, the caller does its share.
// (OpenMP's static split waits for every thread at the end of each region.)
typedef void (*chunk_fn)(const void *ctx, int64_t chunk);

namespace {
const int MAX_THREADS = 64;
struct alignas(64) Cursor {
  std::atomic<uint64_t> v{0};  // job generation << 32 | next chunk of this range
};
struct Job {  // one slot per generation parity, rewritten only after that job ended
  std::atomic<chunk_fn> fn{nullptr};
  std::atomic<const void *> ctx{nullptr};
  std::atomic<int64_t> nchunks{0};
  std::atomic<int> nranges{1};
};
struct Pool {
  alignas(64) std::atomic<uint32_t> gen{0};
  alignas(64) std::atomic<int64_t> done{0};  // chunks finished in the current job
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> busy{false};             // one caller at a time; others run alone
  Cursor cur[MAX_THREADS];
  Job jobs[2];
  std::mutex mu;                             // only for sleeping and starting threads
  std::condition_variable cv;
  int started = 0;
  int used = 0;  // cursors used so far; written only by the caller holding busy
};
Pool &pool = *new Pool;  // never destroyed: helpers may still wait on it at exit

// Run chunks of job generation g, own range first, until none is left.
void work(uint32_t g, int id) {
  const Job &job = pool.jobs[g & 1];
  int nr = job.nranges.load(std::memory_order_relaxed);
  nr = nr < 1 ? 1 : nr > MAX_THREADS ? MAX_THREADS : nr;  // a stale job's value only fails claims
  int64_t mine = 0;
  for (int k = 0; k < nr; k++) {
    const int r = (id + k) % nr;
    std::atomic<uint64_t> &cur = pool.cur[r].v;
    uint64_t s = cur.load(std::memory_order_acquire);
    while ((uint32_t)(s >> 32) == g) {
      const int64_t c = (int64_t)(uint32_t)s, n = job.nchunks.load(std::memory_order_relaxed);
      if (c >= (r + 1) * n / nr) break;
      if (cur.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        // success proves job g was still running, so the slot holds its fn and ctx
        job.fn.load(std::memory_order_relaxed)(job.ctx.load(std::memory_order_relaxed), c);
        mine++;
        s = cur.load(std::memory_order_acquire);
      }
    }
  }
  if (mine) pool.done.fetch_add(mine, std::memory_order_release);
}

void helper(int id) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = pool.gen.load(std::memory_order_acquire);
    for (int i = 0; i < 4000 && g == seen; i++) {  // spin ~0.1 ms: catches back-to-back calls
      cpu_relax();
      g = pool.gen.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(pool.mu);
      pool.sleepers.fetch_add(1, std::memory_order_seq_cst);
      while ((g = pool.gen.load(std::memory_order_seq_cst)) == seen) pool.cv.wait(lk);
      pool.sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = g;
    work(g, id);
  }
}
}  // namespace

static void run_chunks(chunk_fn fn, const void *ctx, int64_t nchunks, int nth) {
  int nr = nth < nchunks ? nth : (int)nchunks;
  if (nr > MAX_THREADS) nr = MAX_THREADS;
  if (nr < 2 || nchunks >= (1LL << 31) || pool.busy.exchange(true, std::memory_order_acquire)) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    return;
  }
  if (pool.started < nr - 1) {
    std::lock_guard<std::mutex> lk(pool.mu);
    while (pool.started < nr - 1) std::thread(helper, ++pool.started).detach();
  }
  uint32_t g = pool.gen.load(std::memory_order_relaxed) + 1;
  if (g == 0) g = 1;  // helpers start having "seen" generation 0
  Job &job = pool.jobs[g & 1];
  job.fn.store(fn, std::memory_order_relaxed);
  job.ctx.store(ctx, std::memory_order_relaxed);
  job.nchunks.store(nchunks, std::memory_order_relaxed);
  job.nranges.store(nr, std::memory_order_relaxed);
  pool.done.store(0, std::memory_order_relaxed);
  // Stamp every cursor ever used, so no cursor still carries an older generation
  // that a stale helper could claim from with this job's slot values.
  if (nr > pool.used) pool.used = nr;
  for (int r = 0; r < pool.used; r++)
    pool.cur[r].v.store((uint64_t)g << 32 | (uint64_t)(r < nr ? r * nchunks / nr : nchunks), std::memory_order_release);
  pool.gen.store(g, std::memory_order_seq_cst);
  if (pool.sleepers.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lk(pool.mu); }
    pool.cv.notify_all();
  }
  work(g, 0);
  while (pool.done.load(std::memory_order_acquire) < nchunks) cpu_relax();
  pool.busy.store(false, std::memory_order_release);
}

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define ALWAYS_INLINE_LAMBDA __attribute__((always_inline))
static inline float h2f(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }
static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

// 16-lane float (V) and int32 (VI) vectors.
#if defined(__AVX512F__)
typedef __m512 V;
typedef __m512i VI;
static inline V vset(float a) { return _mm512_set1_ps(a); }
static inline V vzero() { return _mm512_setzero_ps(); }
static inline V vld(const float *p) { return _mm512_loadu_ps(p); }
static inline void vst(float *p, V a) { _mm512_storeu_ps(p, a); }
static inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
static inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline V vfms(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
static inline float vsum(V a) { return _mm512_reduce_add_ps(a); }
static inline V cvt(VI a) { return _mm512_cvtepi32_ps(a); }
static inline VI ld_i8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline VI ld_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline VI iand(VI a, int c) { return _mm512_and_si512(a, _mm512_set1_epi32(c)); }
static inline VI ior(VI a, VI b) { return _mm512_or_si512(a, b); }
static inline VI isub(VI a, int c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
static inline VI isrl(VI a, int c) { return _mm512_srli_epi32(a, c); }
static inline VI isll(VI a, int c) { return _mm512_slli_epi32(a, c); }
static inline VI ibit16(uint32_t h) { return _mm512_maskz_mov_epi32((__mmask16)(h & 0xFFFF), _mm512_set1_epi32(16)); }
#elif defined(__AVX2__) && defined(__FMA__)
struct V { __m256 a, b; };
struct VI { __m256i a, b; };
static inline V vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
static inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline V vld(const float *p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vst(float *p, V x) { _mm256_storeu_ps(p, x.a); _mm256_storeu_ps(p + 8, x.b); }
static inline V vmul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
static inline V vadd(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
static inline V vsub(V x, V y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
static inline V vfma(V x, V y, V z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
static inline V vfms(V x, V y, V z) { return {_mm256_fmsub_ps(x.a, y.a, z.a), _mm256_fmsub_ps(x.b, y.b, z.b)}; }
static inline float vsum(V x) {
  __m256 s = _mm256_add_ps(x.a, x.b);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(t);
}
static inline V cvt(VI x) { return {_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)}; }
static inline VI ld_i8(const uint8_t *p) {
  __m128i t = _mm_loadu_si128((const __m128i *)p);
  return {_mm256_cvtepi8_epi32(t), _mm256_cvtepi8_epi32(_mm_srli_si128(t, 8))};
}
static inline VI ld_u8(const uint8_t *p) {
  __m128i t = _mm_loadu_si128((const __m128i *)p);
  return {_mm256_cvtepu8_epi32(t), _mm256_cvtepu8_epi32(_mm_srli_si128(t, 8))};
}
static inline VI iand(VI x, int c) { __m256i k = _mm256_set1_epi32(c); return {_mm256_and_si256(x.a, k), _mm256_and_si256(x.b, k)}; }
static inline VI ior(VI x, VI y) { return {_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)}; }
static inline VI isub(VI x, int c) { __m256i k = _mm256_set1_epi32(c); return {_mm256_sub_epi32(x.a, k), _mm256_sub_epi32(x.b, k)}; }
static inline VI isrl(VI x, int c) { return {_mm256_srli_epi32(x.a, c), _mm256_srli_epi32(x.b, c)}; }
static inline VI isll(VI x, int c) { return {_mm256_slli_epi32(x.a, c), _mm256_slli_epi32(x.b, c)}; }
static inline VI ibit16(uint32_t h) {
  __m256i hv = _mm256_set1_epi32((int)h), sixteen = _mm256_set1_epi32(16);
  __m256i ma = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  __m256i mb = _mm256_setr_epi32(256, 512, 1024, 2048, 4096, 8192, 16384, 32768);
  __m256i a = _mm256_cmpeq_epi32(_mm256_and_si256(hv, ma), ma), b = _mm256_cmpeq_epi32(_mm256_and_si256(hv, mb), mb);
  return {_mm256_and_si256(a, sixteen), _mm256_and_si256(b, sixteen)};
}
#else  // portable: GCC/clang vector extensions, lowered to whatever SIMD the target has
typedef float V __attribute__((vector_size(64)));
typedef int32_t VI __attribute__((vector_size(64)));
typedef uint8_t VB __attribute__((vector_size(16)));
typedef int8_t VSB __attribute__((vector_size(16)));
static inline V vset(float a) { return V{a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }  // keeps -0.0
static inline V vzero() { return V{}; }
static inline V vld(const float *p) { V r; memcpy(&r, p, 64); return r; }
static inline void vst(float *p, V a) { memcpy(p, &a, 64); }
static inline V vmul(V a, V b) { return a * b; }
static inline V vadd(V a, V b) { return a + b; }
static inline V vsub(V a, V b) { return a - b; }
static inline V vfma(V a, V b, V c) { return a * b + c; }
static inline V vfms(V a, V b, V c) { return a * b - c; }
static inline float vsum(V a) { float s = 0; for (int i = 0; i < 16; i++) s += a[i]; return s; }
static inline V cvt(VI a) { return __builtin_convertvector(a, V); }
static inline VI ld_i8(const uint8_t *p) { VSB b; memcpy(&b, p, 16); return __builtin_convertvector(b, VI); }
static inline VI ld_u8(const uint8_t *p) { VB b; memcpy(&b, p, 16); return __builtin_convertvector(b, VI); }
static inline VI iand(VI a, int c) { return a & c; }
static inline VI ior(VI a, VI b) { return a | b; }
static inline VI isub(VI a, int c) { return a - c; }
static inline VI isrl(VI a, int c) { return a >> c; }  // lanes are non-negative here
static inline VI isll(VI a, int c) { return a << c; }
static inline VI ibit16(uint32_t h) {
  const VI lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return (((VI{} + (int32_t)(h & 0xFFFF)) >> lane) & 1) << 4;
}
#endif

// Each block type walks its block in 16-element units, calling
// f(e, q, s, mn) for elements e..e+15 of the block, whose values are s*q - mn.
struct Q8_0 {
  enum { QK = 32, TS = 34, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b);
    f(0, cvt(ld_i8(b + 2)), d, 0.f);
    f(16, cvt(ld_i8(b + 18)), d, 0.f);
  }
};
struct Q4_0 {
  enum { QK = 32, TS = 18, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b);
    VI q = ld_u8(b + 2);
    f(0, cvt(isub(iand(q, 15), 8)), d, 0.f);
    f(16, cvt(isub(isrl(q, 4), 8)), d, 0.f);
  }
};
struct Q4_1 {
  enum { QK = 32, TS = 20, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b), m = h2f(b + 2);
    VI q = ld_u8(b + 4);
    f(0, cvt(iand(q, 15)), d, -m);
    f(16, cvt(isrl(q, 4)), d, -m);
  }
};
struct Q5_0 {
  enum { QK = 32, TS = 22, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b);
    uint32_t h = u32(b + 2);
    VI q = ld_u8(b + 6);
    f(0, cvt(isub(ior(iand(q, 15), ibit16(h)), 16)), d, 0.f);
    f(16, cvt(isub(ior(isrl(q, 4), ibit16(h >> 16)), 16)), d, 0.f);
  }
};
struct Q5_1 {
  enum { QK = 32, TS = 24, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t h = u32(b + 4);
    VI q = ld_u8(b + 8);
    f(0, cvt(ior(iand(q, 15), ibit16(h))), d, -m);
    f(16, cvt(ior(isrl(q, 4), ibit16(h >> 16))), d, -m);
  }
};
struct Q2_K {
  enum { QK = 256, TS = 84, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    UNROLL for (int h = 0; h < 2; h++)
      UNROLL for (int j = 0; j < 4; j++)
        UNROLL for (int u = 0; u < 2; u++) {
          int s = sc[8 * h + 2 * j + u];
          f(128 * h + 32 * j + 16 * u, cvt(iand(isrl(ld_u8(qs + 32 * h + 16 * u), 2 * j), 3)), d * (float)(s & 15), dmin * (float)(s >> 4));
        }
  }
};
struct Q3_K {
  enum { QK = 256, TS = 110, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *hm = b, *qs = b + 32, *ls = b + 96, *hs = b + 104;
    float d = h2f(b + 108);
    UNROLL for (int h = 0; h < 2; h++)
      UNROLL for (int j = 0; j < 4; j++)
        UNROLL for (int u = 0; u < 2; u++) {
          int k = 8 * h + 2 * j + u;
          int lo = k < 8 ? (ls[k] & 15) : (ls[k - 8] >> 4);
          int hi = (hs[k % 4] >> (2 * (k / 4))) & 3;
          float s = d * (float)((int8_t)(lo | (hi << 4)) - 32);
          VI ql = iand(isrl(ld_u8(qs + 32 * h + 16 * u), 2 * j), 3);
          VI hb = iand(isrl(ld_u8(hm + 16 * u), 4 * h + j), 1);
          f(128 * h + 32 * j + 16 * u, cvt(isub(ior(ql, isll(hb, 2)), 4)), s, 0.f);
        }
  }
};
static inline void k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63; *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
struct Q4_K {
  enum { QK = 256, TS = 144, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    UNROLL for (int j = 0; j < 4; j++) {
      int s1, m1, s2, m2;
      k_scale_min(scales, 2 * j, &s1, &m1);
      k_scale_min(scales, 2 * j + 1, &s2, &m2);
      float d1 = d * (float)s1, n1 = dmin * (float)m1, d2 = d * (float)s2, n2 = dmin * (float)m2;
      UNROLL for (int u = 0; u < 2; u++) {
        VI q = ld_u8(qs + 32 * j + 16 * u);
        f(64 * j + 16 * u, cvt(iand(q, 15)), d1, n1);
        f(64 * j + 32 + 16 * u, cvt(isrl(q, 4)), d2, n2);
      }
    }
  }
};
struct Q5_K {
  enum { QK = 256, TS = 176, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    UNROLL for (int j = 0; j < 4; j++) {
      int s1, m1, s2, m2;
      k_scale_min(scales, 2 * j, &s1, &m1);
      k_scale_min(scales, 2 * j + 1, &s2, &m2);
      float d1 = d * (float)s1, n1 = dmin * (float)m1, d2 = d * (float)s2, n2 = dmin * (float)m2;
      UNROLL for (int u = 0; u < 2; u++) {
        VI q = ld_u8(qs + 32 * j + 16 * u), h = ld_u8(qh + 16 * u);
        f(64 * j + 16 * u, cvt(ior(iand(q, 15), isll(iand(isrl(h, 2 * j), 1), 4))), d1, n1);
        f(64 * j + 32 + 16 * u, cvt(ior(isrl(q, 4), isll(iand(isrl(h, 2 * j + 1), 1), 4))), d2, n2);
      }
    }
  }
};
struct Q6_K {
  enum { QK = 256, TS = 210, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    UNROLL for (int h = 0; h < 2; h++) {
      const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
      const int8_t *s = sc + 8 * h;
      UNROLL for (int u = 0; u < 2; u++) {
        int l = 16 * u;
        VI a = ld_u8(ql + l), c = ld_u8(ql + 32 + l), hh = ld_u8(qh + l);
        f(128 * h + l, cvt(isub(ior(iand(a, 15), isll(iand(hh, 3), 4)), 32)), d * (float)s[u], 0.f);
        f(128 * h + l + 32, cvt(isub(ior(iand(c, 15), isll(iand(isrl(hh, 2), 3), 4)), 32)), d * (float)s[u + 2], 0.f);
        f(128 * h + l + 64, cvt(isub(ior(isrl(a, 4), isll(iand(isrl(hh, 4), 3), 4)), 32)), d * (float)s[u + 4], 0.f);
        f(128 * h + l + 96, cvt(isub(ior(isrl(c, 4), isll(isrl(hh, 6), 4)), 32)), d * (float)s[u + 6], 0.f);
      }
    }
  }
};

// y[m, r] = sum_k W[r, k] x[m, k] for rows r0..r1 and M activation rows: each
// 16-element unit of W is decoded once (s*q - mn) and multiplied into all M rows.
template <class T, int M>
static void gemv_rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, int64_t K, const float *x, float *y, int64_t N) {
  const int64_t nb = K / T::QK;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    V acc[M][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = vzero();
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      const float *xb = x + j * T::QK;
      T::visit(b, [&](int e, V q, float s, float mn) ALWAYS_INLINE_LAMBDA {
        const V wv = T::MIN ? vfms(q, vset(s), vset(mn)) : vmul(q, vset(s));
        const int p = (e >> 4) & 1;  // two dependency chains per row
        for (int m = 0; m < M; m++) acc[m][p] = vfma(wv, vld(xb + m * K + e), acc[m][p]);
      });
    }
    for (int m = 0; m < M; m++) y[m * N + r] = vsum(vadd(acc[m][0], acc[m][1]));
  }
}

struct GemvCtx {
  const uint8_t *w;
  int64_t ldw, N, K, rows;
  const float *x;
  float *y;
};

template <class T, int M>
static void gemv_chunk(const void *p, int64_t c) {
  const GemvCtx *g = (const GemvCtx *)p;
  int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
  gemv_rows<T, M>(g->w, g->ldw, r0, r1, g->K, g->x, g->y, g->N);
}

// Rows per claimed chunk: about CHUNK_BYTES of weights, at most 64 chunks per thread.
static const int64_t CHUNK_BYTES = 1 << 15;
static const int64_t MB = 4;  // activation rows per pass over the weights
static int64_t chunk_rows(int64_t N, int64_t row_bytes, int nth) {
  int64_t n = N * row_bytes / CHUNK_BYTES, most = 64 * (int64_t)(nth > 1 ? nth : 1);
  n = n < 1 ? 1 : n > most ? most : n;
  return (N + n - 1) / n;
}

template <class T>
static int gemv(const uint8_t *w, int64_t ldw, int64_t N, int64_t K, const float *x, int64_t M, float *y, int nth) {
  if (K % T::QK || ldw < K / T::QK * T::TS) return 1;
  const int64_t rows = chunk_rows(N, ldw, nth), nchunks = (N + rows - 1) / rows;
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    GemvCtx g = {w, ldw, N, K, rows, x + m0 * K, y + m0 * N};
    switch (M - m0 < MB ? M - m0 : MB) {
      case 1: run_chunks(gemv_chunk<T, 1>, &g, nchunks, nth); break;
      case 2: run_chunks(gemv_chunk<T, 2>, &g, nchunks, nth); break;
      case 3: run_chunks(gemv_chunk<T, 3>, &g, nchunks, nth); break;
      default: run_chunks(gemv_chunk<T, 4>, &g, nchunks, nth); break;
    }
  }
  return 0;
}

struct DequantCtx {
  const uint8_t *w;
  int64_t ldw, N, K, rows;
  float *out;
};

// out (N, K) float32 = dequantized rows; bit-exact with gguf-py (no FMA contraction).
template <class T>
static void dequant_chunk(const void *p, int64_t c) {
  const DequantCtx *g = (const DequantCtx *)p;
  const int64_t nb = g->K / T::QK;
  int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = g->w + r * g->ldw;
    float *o = g->out + r * g->K;
    for (int64_t j = 0; j < nb; j++, b += T::TS, o += T::QK)
      T::visit(b, [&](int e, V q, float s, float mn) { vst(o + e, vsub(vmul(q, vset(s)), vset(mn))); });
  }
}

template <class T>
static int dequant(const uint8_t *w, int64_t ldw, int64_t N, int64_t K, float *out, int nth) {
  if (K % T::QK || ldw < K / T::QK * T::TS) return 1;
  const int64_t rows = chunk_rows(N, K * 4, nth);
  DequantCtx g = {w, ldw, N, K, rows, out};
  run_chunks(dequant_chunk<T>, &g, (N + rows - 1) / rows, nth);
  return 0;
}

#define DISPATCH(CALL)                                                                   \
  switch (type) {                                                                        \
    case 0: return CALL(Q4_0); case 1: return CALL(Q4_1); case 2: return CALL(Q5_0);    \
    case 3: return CALL(Q5_1); case 4: return CALL(Q8_0); case 5: return CALL(Q2_K);    \
    case 6: return CALL(Q3_K); case 7: return CALL(Q4_K); case 8: return CALL(Q5_K);    \
    case 9: return CALL(Q6_K); default: return 2;                                        \
  }

// 512, 256 or 0: the SIMD width this build uses (AVX-512, AVX2, plain C).
extern "C" int tk_simd() {
#if defined(__AVX512F__)
  return 512;
#elif defined(__AVX2__) && defined(__FMA__)
  return 256;
#else
  return 0;
#endif
}

extern "C" int tk_gemv(int type, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, const float *x, int64_t M, float *y, int nth) {
#define GEMV(T) gemv<T>(w, ldw, N, K, x, M, y, nth)
  DISPATCH(GEMV)
}

// Small per-token ops (decode), where torch's dispatch costs more than the math.
// out (rows, d) = x / rms(x) * w, float32 accumulation as torch's.
extern "C" void tk_rms_norm(const float *x, const float *w, int64_t rows, int64_t d, float eps, float *out) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *o = out + r * d;
    float ss = 0.f;
    for (int64_t i = 0; i < d; i++) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) o[i] = xr[i] * inv * w[i];
  }
}

// NeoX RoPE of x (H, T, D) contiguous over the first `rot` dims: pairs (i, i + rot/2);
// cos, sin (T, rot/2).
extern "C" void tk_rope_neox(const float *x, const float *cs, const float *sn, int64_t H, int64_t T, int64_t D,
                             int64_t rot, float *out) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < H; h++)
    for (int64_t t = 0; t < T; t++) {
      const float *xr = x + (h * T + t) * D, *c = cs + t * half, *s = sn + t * half;
      float *o = out + (h * T + t) * D;
      for (int64_t i = 0; i < half; i++) {
        const float a = xr[i], b = xr[i + half];
        o[i] = a * c[i] - b * s[i];
        o[i + half] = b * c[i] + a * s[i];
      }
      for (int64_t i = rot; i < D; i++) o[i] = xr[i];
    }
}

extern "C" int tk_dequant(int type, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, float *out, int nth) {
#define DEQUANT(T) dequant<T>(w, ldw, N, K, out, nth)
  DISPATCH(DEQUANT)
}
"""
