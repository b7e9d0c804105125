// NEON block dots with the dot-product instructions (ARMv8.2 `dotprod`: every Apple M chip,
// Graviton 2 on), on the same int8 activations as gemv_avx2.h: rows quantized in groups of
// 32 (one float scale each, the group's max at 127; Q4_K, Q5_K and Q6_K in blocks of 256,
// as llama.cpp's Q8_K), rounded to nearest even as x86 rounds them, so a row's integer sums
// are the same on both and only the order of float sums differs.
//
// `sdot` (vdotq_s32) multiplies 16 signed bytes by 16 and adds each 4 into an int32 lane,
// so a weight's codes stay signed (no sign trick as AVX2's maddubs needs) and a group of
// 32 is two instructions per activation row. llama.cpp's ARM dots (ggml-cpu/arch/arm/
// quants.c, ggml_vec_dot_q4_0_q8_0 and the k-quants) take the same instruction, two blocks
// at a time; here each block type gives its 32 codes per group (`visit`, as on x86) and one
// loop serves them all.
#pragma once
#include "gemv_i8.h"

#if defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD) && !defined(TK_GEMV_I8)
#include <arm_neon.h>
#define TK_GEMV_I8 1

namespace i8 {
struct G32 {  // 32 codes: elements 0..15, 16..31
  int8x16_t lo, hi;
};
static ALWAYS_INLINE uint8x16_t shr(uint8x16_t v, int n) { return vshlq_u8(v, vdupq_n_s8((int8_t)-n)); }
static ALWAYS_INLINE G32 nibbles(const uint8_t *p) {  // 16 bytes -> low nibbles (0..15), high (16..31)
  const uint8x16_t v = vld1q_u8(p);
  return {vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(v, 4))};
}
static ALWAYS_INLINE int8x16_t bits16(uint32_t h) {  // byte i = 16 where bit i of h (16 bits) is set
  static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)h), vdup_n_u8((uint8_t)(h >> 8)));
  return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(16)));
}
static ALWAYS_INLINE G32 add(G32 a, int8x16_t lo, int8x16_t hi) { return {vaddq_s8(a.lo, lo), vaddq_s8(a.hi, hi)}; }
static ALWAYS_INLINE G32 offset(G32 a, int c) { return add(a, vdupq_n_s8((int8_t)c), vdupq_n_s8((int8_t)c)); }

// Each type calls f(e, q, s0, s1, m0, m1) for elements e..e+31 of a block: the values are
// s*q - m, with (s0, m0) for the first 16 and (s1, m1) for the rest (gemv_avx2.h's visitors).
struct Q8_0 {
  enum { QK = 32, TS = 34, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    f(0, G32{vld1q_s8((const int8_t *)b + 2), vld1q_s8((const int8_t *)b + 18)}, d, d, 0.f, 0.f);
  }
};
struct Q4_0 {
  enum { QK = 32, TS = 18, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    f(0, offset(nibbles(b + 2), -8), d, d, 0.f, 0.f);
  }
};
struct Q4_1 {
  enum { QK = 32, TS = 20, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b), m = h2f(b + 2);
    f(0, nibbles(b + 4), d, d, -m, -m);
  }
};
struct Q5_0 {
  enum { QK = 32, TS = 22, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const uint32_t h = u32(b + 2);
    f(0, offset(add(nibbles(b + 6), bits16(h), bits16(h >> 16)), -16), d, d, 0.f, 0.f);
  }
};
struct Q5_1 {
  enum { QK = 32, TS = 24, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b), m = h2f(b + 2);
    const uint32_t h = u32(b + 4);
    f(0, add(nibbles(b + 8), bits16(h), bits16(h >> 16)), d, d, -m, -m);
  }
};
struct Q2_K {
  enum { QK = 256, TS = 84, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    const uint8x16_t three = vdupq_n_u8(3);
    UNROLL for (int h = 0; h < 2; h++) {
      const uint8x16_t q0 = vld1q_u8(qs + 32 * h), q1 = vld1q_u8(qs + 32 * h + 16);
      UNROLL for (int j = 0; j < 4; j++) {
        const int s0 = sc[8 * h + 2 * j], s1 = sc[8 * h + 2 * j + 1];
        const G32 q = {vreinterpretq_s8_u8(vandq_u8(shr(q0, 2 * j), three)), vreinterpretq_s8_u8(vandq_u8(shr(q1, 2 * j), three))};
        f(128 * h + 32 * j, q, d * (float)(s0 & 15), d * (float)(s1 & 15), dmin * (float)(s0 >> 4), dmin * (float)(s1 >> 4));
      }
    }
  }
};
struct Q3_K {
  enum { QK = 256, TS = 110, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *hm = b, *qs = b + 32, *ls = b + 96, *hs = b + 104;
    const float d = h2f(b + 108);
    const uint8x16_t h0 = vld1q_u8(hm), h1 = vld1q_u8(hm + 16), three = vdupq_n_u8(3), one = vdupq_n_u8(1);
    UNROLL for (int h = 0; h < 2; h++) {
      const uint8x16_t q0 = vld1q_u8(qs + 32 * h), q1 = vld1q_u8(qs + 32 * h + 16);
      UNROLL for (int j = 0; j < 4; j++) {
        const int k = 8 * h + 2 * j;
        const uint8x16_t lo0 = vandq_u8(shr(q0, 2 * j), three), lo1 = vandq_u8(shr(q1, 2 * j), three);
        const uint8x16_t hb0 = vshlq_n_u8(vandq_u8(shr(h0, 4 * h + j), one), 2);
        const uint8x16_t hb1 = vshlq_n_u8(vandq_u8(shr(h1, 4 * h + j), one), 2);
        const G32 q = {vreinterpretq_s8_u8(vorrq_u8(lo0, hb0)), vreinterpretq_s8_u8(vorrq_u8(lo1, hb1))};
        f(128 * h + 32 * j, offset(q, -4), q3k_scale(ls, hs, k, d), q3k_scale(ls, hs, k + 1, d), 0.f, 0.f);
      }
    }
  }
};

// 16 signed bytes times 16: each 4's dot in an int32 lane.
static ALWAYS_INLINE int32x4_t dot16(int8x16_t a, const int8_t *x) { return vdotq_s32(vdupq_n_s32(0), a, vld1q_s8(x)); }

// y[m, r] for rows r0..r1 and M activation rows. Per group of 32 and row, the two 16s' integer
// dots (sdot) to float, each times its scale and the row's group scale into an accumulator of
// its own: y = (low 16s + high 16s) - mins. `rows_mm` keeps every accumulator's sequence, so a
// row sums alike alone and in a batch, on either path.
template <class T, int M>
static void rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / T::QK, G = K / 32;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    float32x2_t acc[M];  // (low 16s, high 16s)
    float mins[M];
    for (int m = 0; m < M; m++) { acc[m] = vdup_n_f32(0.f); mins[m] = 0.f; }
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      const int64_t g0 = j * (T::QK / 32);
      T::visit(b, [&](int e, G32 q, float s0, float s1, float m0, float m1) ALWAYS_INLINE_LAMBDA {
        const int64_t g = g0 + e / 32;
        for (int m = 0; m < M; m++) {
          const int8_t *xq = x.q + m * K + 32 * g;
          const float dx = x.d[m * G + g];
          const int32x4_t t = vpaddq_s32(dot16(q.lo, xq), dot16(q.hi, xq + 16));
          const float32x2_t s = {s0 * dx, s1 * dx};
          acc[m] = vfma_f32(acc[m], vcvt_f32_s32(vpadd_s32(vget_low_s32(t), vget_high_s32(t))), s);
          if (T::MIN) mins[m] += m0 * x.hs[m * 2 * G + 2 * g] + m1 * x.hs[m * 2 * G + 2 * g + 1];
        }
      });
    }
    for (int m = 0; m < M; m++) y[m * ldy + r] = (vget_lane_f32(acc[m], 0) + vget_lane_f32(acc[m], 1)) - mins[m];
  }
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// The int8 matrix multiply (ARMv8.6 `i8mm`: Apple M2 on, Graviton 3): `smmla` (vmmlaq_s32)
// takes 8 codes of each of two weight rows against 8 activations of each of two activation
// rows, the 2 x 2 int32 dots in one register (lanes: (r, a), (r, b), (r + 1, a), (r + 1, b)),
// where sdot takes one row pair at a time. llama.cpp's ARM dots take it for two rows alike
// (nrc == 2). Used for two activation rows or more: a prompt's chunk, a verification batch.
static ALWAYS_INLINE int8x16_t halves(int8x16_t a, int8x16_t b, int hi) {  // 8 bytes of a, then b's
  const int64x2_t u = vreinterpretq_s64_s8(a), v = vreinterpretq_s64_s8(b);
  return vreinterpretq_s8_s64(hi ? vzip2q_s64(u, v) : vzip1q_s64(u, v));
}
static ALWAYS_INLINE int8x16_t rows8(const int8_t *a, const int8_t *b) { return vcombine_s8(vld1_s8(a), vld1_s8(b)); }
// the 2 x 2 dots of 16 codes of two weight rows (qa, qb) and 16 activations of two rows (xa, xb)
static ALWAYS_INLINE int32x4_t mm16(int8x16_t qa, int8x16_t qb, const int8_t *xa, const int8_t *xb) {
  const int32x4_t p = vmmlaq_s32(vdupq_n_s32(0), halves(qa, qb, 0), rows8(xa, xb));
  return vmmlaq_s32(p, halves(qa, qb, 1), rows8(xa + 8, xb + 8));
}

template <class T>
struct Groups {  // one block of one weight row, as its visitor gives it
  enum { N = T::QK / 32 };
  G32 q[N];
  float s0[N], s1[N], m0[N], m1[N];
  ALWAYS_INLINE void load(const uint8_t *b) {
    T::visit(b, [&](int e, G32 c, float a, float d, float m, float n) ALWAYS_INLINE_LAMBDA {
      const int i = e / 32;
      q[i] = c, s0[i] = a, s1[i] = d, m0[i] = m, m1[i] = n;
    });
  }
};

// `rows` two weight rows and two activation rows at a time (the last pair of an odd M
// repeats its row); an odd last weight row takes `rows`.
template <class T, int M>
static void rows_mm(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / T::QK, G = K / 32;
  constexpr int P = (M + 1) / 2;
  int64_t r = r0;
  for (; r + 1 < r1; r += 2) {
    const uint8_t *b = w + r * ldw;
    float32x4_t lo[P], hi[P];
    float mins[2][M];
    for (int p = 0; p < P; p++) lo[p] = hi[p] = vdupq_n_f32(0.f);
    for (int m = 0; m < M; m++) mins[0][m] = mins[1][m] = 0.f;
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      Groups<T> u, v;  // rows r and r + 1
      u.load(b);
      v.load(b + ldw);
      UNROLL for (int i = 0; i < Groups<T>::N; i++) {
        const int64_t g = j * Groups<T>::N + i;
        for (int p = 0; p < P; p++) {
          const int ma = 2 * p, mb = 2 * p + 1 < M ? 2 * p + 1 : 2 * p;
          const int8_t *xa = x.q + ma * K + 32 * g, *xb = x.q + mb * K + 32 * g;
          const float da = x.d[ma * G + g], db = x.d[mb * G + g];
          const float32x4_t sl = {u.s0[i] * da, u.s0[i] * db, v.s0[i] * da, v.s0[i] * db};
          const float32x4_t sh = {u.s1[i] * da, u.s1[i] * db, v.s1[i] * da, v.s1[i] * db};
          lo[p] = vfmaq_f32(lo[p], vcvtq_f32_s32(mm16(u.q[i].lo, v.q[i].lo, xa, xb)), sl);
          hi[p] = vfmaq_f32(hi[p], vcvtq_f32_s32(mm16(u.q[i].hi, v.q[i].hi, xa + 16, xb + 16)), sh);
        }
        if (T::MIN)
          for (int m = 0; m < M; m++) {
            const float h0 = x.hs[m * 2 * G + 2 * g], h1 = x.hs[m * 2 * G + 2 * g + 1];
            mins[0][m] += u.m0[i] * h0 + u.m1[i] * h1;
            mins[1][m] += v.m0[i] * h0 + v.m1[i] * h1;
          }
      }
    }
    for (int p = 0; p < P; p++) {
      float l[4], h[4];
      vst1q_f32(l, lo[p]);
      vst1q_f32(h, hi[p]);
      for (int k = 0; k < 4; k++) {
        const int m = 2 * p + (k & 1), s = k >> 1;  // lane k: activation row, weight row r + s
        if (m < M) y[m * ldy + r + s] = (l[k] + h[k]) - mins[s][m];
      }
    }
  }
  if (r < r1) rows<T, M>(w, ldw, r, r1, x, y, ldy);
}
#endif

// Quantize M rows of x (M, K), K % 32 == 0, into q, d, hs (XQ; no d8 here).
static inline void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *hs, float *) {
  for (int64_t g = 0; g < M * K / 32; g++) {
    const float *xp = x + 32 * g;
    float32x4_t v[8], mx = vdupq_n_f32(0.f);
    for (int i = 0; i < 8; i++) { v[i] = vld1q_f32(xp + 4 * i); mx = vmaxq_f32(mx, vabsq_f32(v[i])); }
    const float amax = vmaxvq_f32(mx);
    const float dd = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int16x8_t h[4];
    for (int i = 0; i < 4; i++)  // round to nearest even, as x86's cvtps
      h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i], id))),
                          vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i + 1], id))));
    const int8x16_t a = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])), b = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
    vst1q_s8(q + 32 * g, a);
    vst1q_s8(q + 32 * g + 16, b);
    d[g] = dd;
    hs[2 * g] = dd * (float)vaddlvq_s8(a);
    hs[2 * g + 1] = dd * (float)vaddlvq_s8(b);
  }
}

// Quantize M rows of x (M, K), K % 256 == 0, into q (M, K), d (M, K/256), bs (M, K/16) (XK).
static inline void quantize_rows_k(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int16_t *bs) {
  for (int64_t g = 0; g < M * K / 256; g++) {
    const float *xp = x + 256 * g;
    float32x4_t mx = vdupq_n_f32(0.f);
    for (int i = 0; i < 64; i++) mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(xp + 4 * i)));
    const float amax = vmaxvq_f32(mx);
    d[g] = amax / 127.f;
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    for (int s = 0; s < 16; s++) {  // 16 codes at a time
      int16x8_t h[2];
      for (int i = 0; i < 2; i++)
        h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xp + 16 * s + 8 * i), id))),
                            vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xp + 16 * s + 8 * i + 4), id))));
      const int8x16_t c = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
      vst1q_s8(q + 256 * g + 16 * s, c);
      bs[16 * g + s] = vaddlvq_s8(c);
    }
  }
}

// A k-quant block for `rowsk`: load(b, sc, mn, d, dmin) gives its 16 scales and mins, one per
// 16 weights, and d, dmin; codes(b, i) the 32 codes of group i (unsigned, below 64). A weight
// is d * sc * code - dmin * mn (gemv_avx2.h's KBlock).
template <class T>
struct KBlock {
  enum { OK = 0 };
};
template <int QS, int QH>  // Q4_K (no 5th bits) / Q5_K: 6-bit scales and mins per 32, each taken twice
struct KBlock45 {
  enum { OK = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, int32_t *sc, int16_t *mn, float &d, float &dmin) {
    uint32_t u[4];
    k_scale_bytes(b + 4, u);
    const uint8_t *v = (const uint8_t *)u;  // 8 scales, then 8 mins
    for (int k = 0; k < 16; k++) { sc[k] = v[k / 2]; mn[k] = v[8 + k / 2]; }
    d = h2f(b);
    dmin = h2f(b + 2);
  }
  static ALWAYS_INLINE G32 codes(const uint8_t *b, int i) {  // weights 64j..: low nibbles of 32 bytes, then high
    const uint8_t *q = b + QS + 32 * (i / 2);
    uint8x16_t a = vld1q_u8(q), c = vld1q_u8(q + 16);
    a = i % 2 ? vshrq_n_u8(a, 4) : vandq_u8(a, vdupq_n_u8(15));
    c = i % 2 ? vshrq_n_u8(c, 4) : vandq_u8(c, vdupq_n_u8(15));
    if (QH) {
      const uint8x16_t one = vdupq_n_u8(1);
      a = vorrq_u8(a, vshlq_n_u8(vandq_u8(shr(vld1q_u8(b + QH), i), one), 4));
      c = vorrq_u8(c, vshlq_n_u8(vandq_u8(shr(vld1q_u8(b + QH + 16), i), one), 4));
    }
    return {vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(c)};
  }
};
template <> struct KBlock<Q4_K> : KBlock45<16, 0> {};
template <> struct KBlock<Q5_K> : KBlock45<48, 16> {};
template <>
struct KBlock<Q6_K> {  // int8 scales per 16, codes q + 32: the min is 32 * scale
  enum { OK = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, int32_t *sc, int16_t *mn, float &d, float &dmin) {
    for (int k = 0; k < 16; k++) { sc[k] = (int8_t)b[192 + k]; mn[k] = (int16_t)(32 * sc[k]); }
    d = dmin = h2f(b + 208);
  }
  static ALWAYS_INLINE G32 codes(const uint8_t *b, int i) {  // group 4h + t: nibbles of ql (t even: low), 2 bits of qh
    const int h = i / 4, t = i % 4;
    const uint8_t *ql = b + 64 * h + 32 * (t % 2), *qh = b + 128 + 32 * h;
    uint8x16_t out[2];
    for (int k = 0; k < 2; k++) {
      const uint8x16_t l = vld1q_u8(ql + 16 * k), hb = vld1q_u8(qh + 16 * k);
      const uint8x16_t lo = t < 2 ? vandq_u8(l, vdupq_n_u8(15)) : vshrq_n_u8(l, 4);
      out[k] = vorrq_u8(lo, vshlq_n_u8(vandq_u8(shr(hb, 2 * t), vdupq_n_u8(3)), 4));
    }
    return {vreinterpretq_s8_u8(out[0]), vreinterpretq_s8_u8(out[1])};
  }
};

// `rows` for the k-quants on XK activations: per block, each 16's dot times its scale summed
// in int32, the mins against the rows' 16-sums, one float product per block and row.
template <class T, int M>
static void rowsk(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / 256;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    float acc[M];
    for (int m = 0; m < M; m++) acc[m] = 0.f;
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      int32_t sc[16];
      int16_t mn[16];
      float d, dmin;
      KBlock<T>::load(b, sc, mn, d, dmin);
      int32x4_t is[M];
      for (int m = 0; m < M; m++) is[m] = vdupq_n_s32(0);
      UNROLL for (int i = 0; i < 8; i++) {
        const G32 q = KBlock<T>::codes(b, i);
        for (int m = 0; m < M; m++) {
          const int8_t *xq = x.k.q + m * K + 256 * j + 32 * i;
          is[m] = vmlaq_n_s32(is[m], dot16(q.lo, xq), sc[2 * i]);
          is[m] = vmlaq_n_s32(is[m], dot16(q.hi, xq + 16), sc[2 * i + 1]);
        }
      }
      const int16x8_t mn0 = vld1q_s16(mn), mn1 = vld1q_s16(mn + 8);
      for (int m = 0; m < M; m++) {
        const float dx = x.k.d[m * nb + j];
        const int16_t *bs = x.k.bs + m * K / 16 + 16 * j;
        int32x4_t im = vmull_s16(vget_low_s16(mn0), vld1_s16(bs));
        im = vmlal_s16(im, vget_high_s16(mn0), vld1_s16(bs + 4));
        im = vmlal_s16(im, vget_low_s16(mn1), vld1_s16(bs + 8));
        im = vmlal_s16(im, vget_high_s16(mn1), vld1_s16(bs + 12));
        acc[m] += (float)vaddvq_s32(is[m]) * (d * dx) - (float)vaddvq_s32(im) * (dmin * dx);
      }
    }
    for (int m = 0; m < M; m++) y[m * ldy + r] = acc[m];
  }
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// `rowsk` two weight rows and two activation rows at a time (`rows_mm`): each 16's 2 x 2
// dots times the weight rows' scales, summed in int32 as `rowsk` sums them; the same float
// products after.
template <class T, int M>
static void rowsk_mm(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / 256;
  constexpr int P = (M + 1) / 2;
  int64_t r = r0;
  for (; r + 1 < r1; r += 2) {
    const uint8_t *b = w + r * ldw;
    float acc[2][M];
    for (int m = 0; m < M; m++) acc[0][m] = acc[1][m] = 0.f;
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      int32_t sc[2][16];
      int16_t mn[2][16];
      float d[2], dmin[2];
      KBlock<T>::load(b, sc[0], mn[0], d[0], dmin[0]);
      KBlock<T>::load(b + ldw, sc[1], mn[1], d[1], dmin[1]);
      int32x4_t is[P];
      for (int p = 0; p < P; p++) is[p] = vdupq_n_s32(0);
      UNROLL for (int i = 0; i < 8; i++) {
        const G32 qa = KBlock<T>::codes(b, i), qb = KBlock<T>::codes(b + ldw, i);
        const int32x4_t sl = {sc[0][2 * i], sc[0][2 * i], sc[1][2 * i], sc[1][2 * i]};
        const int32x4_t sh = {sc[0][2 * i + 1], sc[0][2 * i + 1], sc[1][2 * i + 1], sc[1][2 * i + 1]};
        for (int p = 0; p < P; p++) {
          const int ma = 2 * p, mb = 2 * p + 1 < M ? 2 * p + 1 : 2 * p;
          const int8_t *xa = x.k.q + ma * K + 256 * j + 32 * i, *xb = x.k.q + mb * K + 256 * j + 32 * i;
          is[p] = vmlaq_s32(is[p], mm16(qa.lo, qb.lo, xa, xb), sl);
          is[p] = vmlaq_s32(is[p], mm16(qa.hi, qb.hi, xa + 16, xb + 16), sh);
        }
      }
      int32_t ints[P][4];
      for (int p = 0; p < P; p++) vst1q_s32(ints[p], is[p]);
      for (int s = 0; s < 2; s++)
        for (int m = 0; m < M; m++) {
          const float dx = x.k.d[m * nb + j];
          const int16_t *bs = x.k.bs + m * K / 16 + 16 * j;
          int32_t im = 0;
          for (int k = 0; k < 16; k++) im += mn[s][k] * bs[k];
          acc[s][m] += (float)ints[m / 2][2 * s + (m & 1)] * (d[s] * dx) - (float)im * (dmin[s] * dx);
        }
    }
    for (int s = 0; s < 2; s++)
      for (int m = 0; m < M; m++) y[m * ldy + r + s] = acc[s][m];
  }
  if (r < r1) rowsk<T, M>(w, ldw, r, r1, x, y, ldy);
}
#endif

template <class T, int M>
static void chunk(const void *p, int64_t c) {
  const Ctx *g = (const Ctx *)p;
  int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
#if defined(__ARM_FEATURE_MATMUL_INT8)
  if constexpr (M > 1) {
    if constexpr (KBlock<T>::OK) return rowsk_mm<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
    else return rows_mm<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
  }
#endif
  if constexpr (KBlock<T>::OK) rowsk<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
  else rows<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
}
}  // namespace i8
#endif
