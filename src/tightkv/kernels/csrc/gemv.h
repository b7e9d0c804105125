// The block-dot kernels' templates, shared by qmatmul.cpp and the type groups (qtypes_*.cpp):
// each group instantiates its types in a translation unit of its own, so the build compiles
// the groups in parallel.
#pragma once
#include "blocks.h"
#include "gemv_avx2.h"
#include "gemv_neon.h"
#ifndef TK_GEMV_I8  // the integer paths' switches where the build has none of them
#define TK_GEMV_I8 0
#endif
#ifndef TK_GEMV_512
#define TK_GEMV_512 0
#endif
#ifndef TK_GEMM
#define TK_GEMM 0
#endif
#include "lowbit.h"

// y[m, r] = sum_k W[r, k] x[m, k] for rows r0..r1 and M activation rows: each
// 16-element unit of W is decoded once (s*q - mn) and multiplied into all M rows.
template <class T, int M>
static void gemv_rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, int64_t K, const float *x, float *y, int64_t ldy) {
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
    for (int m = 0; m < M; m++) y[m * ldy + r] = vsum(vadd(acc[m][0], acc[m][1]));
  }
}

struct GemvCtx {
  const uint8_t *w;
  int64_t ldw, N, K, rows;
  const float *x;
  float *y;
  int64_t ldy;  // y's row stride: the columns of every part of the product
};

template <class T, int M>
static void gemv_chunk(const void *p, int64_t c) {
  const GemvCtx *g = (const GemvCtx *)p;
  int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
  gemv_rows<T, M>(g->w, g->ldw, r0, r1, g->K, g->x, g->y, g->ldy);
}

// Rows per claimed chunk: about CHUNK_BYTES of weights, at most 64 chunks per thread.
static const int64_t CHUNK_BYTES = 1 << 15;
static const int64_t MB = 8;  // activation rows per pass over the weights
static int64_t chunk_rows(int64_t N, int64_t row_bytes, int nth) {
  int64_t n = N * row_bytes / CHUNK_BYTES, most = 64 * (int64_t)(nth > 1 ? nth : 1);
  n = n < 1 ? 1 : n > most ? most : n;
  return (N + n - 1) / n;
}

// The activations of one call: float rows, and on the integer path their int8 groups.
struct Act {
  const float *x;
  const int8_t *q;
  const float *d, *hs, *d8;  // null where only k-quants take the call
  int64_t K;
  const int8_t *kq;  // the k-quants' rows (i8::XK), null where none takes them
  const float *kd;
  const int16_t *kbs;
  const uint8_t *qu;  // q + 128, where the call is a prompt's GEMM (i8::gemm_rows); else null
};

// One weight matrix of a product whose output columns may hold several (q, k and v
// side by side): its chunk function and context for activation rows m0..m0+mb.
#if TK_GEMV_I8
typedef i8::Ctx PartCtx;
#define PART_TYPE(T) i8::T
#define PART_CHUNK i8::chunk
static PartCtx part_ctx(const uint8_t *w, int64_t ldw, int64_t N, int64_t rows, const Act &a, int64_t m0, float *y,
                        int64_t ldy) {
  const int64_t K = a.K;
  i8::XQ x = {nullptr, nullptr, nullptr, nullptr, K, {nullptr, nullptr, nullptr}, nullptr};
  if (a.q) x.q = a.q + m0 * K, x.d = a.d + m0 * K / 32, x.hs = a.hs + m0 * K / 16;
  if (a.d8) x.d8 = a.d8 + m0 * K / 2;
  if (a.kq) x.k = {a.kq + m0 * K, a.kd + m0 * K / 256, a.kbs + m0 * K / 16};
  if (a.qu) x.qu = a.qu + m0 * K;
  return {w, ldw, N, rows, x, y + m0 * ldy, ldy, a.qu != nullptr};
}
#else
typedef GemvCtx PartCtx;
#define PART_TYPE(T) T
#define PART_CHUNK gemv_chunk
static PartCtx part_ctx(const uint8_t *w, int64_t ldw, int64_t N, int64_t rows, const Act &a, int64_t m0, float *y,
                        int64_t ldy) {
  return {w, ldw, N, a.K, rows, a.x + m0 * a.K, y + m0 * ldy, ldy};
}
#endif

template <class T>
static chunk_fn bind(PartCtx &g, const uint8_t *w, int64_t ldw, int64_t N, const Act &a, int64_t m0, int mb,
                     float *y, int64_t ldy, int nth) {
  if (a.K % T::QK || ldw < a.K / T::QK * T::TS) return nullptr;
  g = part_ctx(w, ldw, N, chunk_rows(N, ldw, nth), a, m0, y, ldy);
  switch (mb) {
    case 1: return PART_CHUNK<T, 1>;
    case 2: return PART_CHUNK<T, 2>;
    case 3: return PART_CHUNK<T, 3>;
    case 4: return PART_CHUNK<T, 4>;
    case 5: return PART_CHUNK<T, 5>;
    case 6: return PART_CHUNK<T, 6>;
    case 7: return PART_CHUNK<T, 7>;
    default: return PART_CHUNK<T, 8>;
  }
}
#define BIND(T) bind<PART_TYPE(T)>(g, w, ldw, N, a, m0, mb, y, ldy, nth)

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

// The weight types by number, as the `type` arguments take them (kernels/abi.py BLOCK_TYPES).
static const int NTYPES = 25;
// The chunk function of type `type` for rows m0..m0+mb (nullptr: a bad shape, or a type
// outside the group); dequantized rows (0, 1 a bad shape, 2 a type outside the group).
#define GROUP_ARGS PartCtx &g, const uint8_t *w, int64_t ldw, int64_t N, const Act &a, int64_t m0, int mb, float *y, int64_t ldy, int nth
#define DEQUANT_ARGS const uint8_t *w, int64_t ldw, int64_t N, int64_t K, float *out, int nth
#define DEQUANT(T) dequant<T>(w, ldw, N, K, out, nth)
// A group's two entry points, `CASES(CALL)` its `case n: return CALL(type);` lines.
#define TYPE_GROUP(NAME, CASES)                                                   \
  chunk_fn bind_##NAME(int type, GROUP_ARGS) {                                    \
    switch (type) { CASES(BIND) default: return nullptr; }                        \
  }                                                                               \
  int dequant_##NAME(int type, DEQUANT_ARGS) {                                    \
    switch (type) { CASES(DEQUANT) default: return 2; }                           \
  }
chunk_fn bind_legacy(int type, GROUP_ARGS);
int dequant_legacy(int type, DEQUANT_ARGS);
chunk_fn bind_kquants(int type, GROUP_ARGS);
int dequant_kquants(int type, DEQUANT_ARGS);
chunk_fn bind_lowbit(int type, GROUP_ARGS);
int dequant_lowbit(int type, DEQUANT_ARGS);
chunk_fn bind_grids(int type, GROUP_ARGS);
int dequant_grids(int type, DEQUANT_ARGS);
