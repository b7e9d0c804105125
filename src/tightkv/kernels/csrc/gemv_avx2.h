// AVX2 block dots with integer multiplies, as llama.cpp's AVX2 path does: the
// activation rows are quantized to int8 in groups of 32 (one float scale each,
// the group's max at 127), each weight group of 32 is unpacked to 32 bytes, and
// maddubs/madd multiply 32 of them at once. Signed weights take the sign trick
// (|w| as unsigned, the sign moved onto x) so no pair sum can saturate int16.
// A group's two halves of 16 may carry their own scale and min (k-quants). Q4_K,
// Q5_K and Q6_K take their activations in blocks of 256 instead, as llama.cpp's
// Q8_K (`rowsk`).
//
// The result is dequantized W times dequantized x (x_q * d) exactly, up to the
// order of float sums; tests check it against that.
#pragma once
#include <atomic>
#include <type_traits>
#include <vector>

#include "gemv_i8.h"

#if defined(__AVX2__) && defined(__FMA__)
#define TK_GEMV_I8 1
#define TK_GEMV_AVX2 1

namespace i8 {
static inline __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m256i bytes(int c) { return _mm256_set1_epi8((char)c); }
static inline __m256i and8(__m256i a, int c) { return _mm256_and_si256(a, bytes(c)); }
static inline __m256i srl8(__m256i a, int n) { return and8(_mm256_srli_epi16(a, n), 0xFF >> n); }
// 16 bytes -> 32: the low nibbles (elements 0..15), then the high nibbles (16..31)
static inline __m256i nibbles(const uint8_t *p) {  // the 16 bytes in both halves, the upper shifted by 4
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
  return and8(_mm256_srlv_epi32(t, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), 15);
}
// byte i = 0xFF where bit i of h is set, else 0
static inline __m256i bits_set(uint32_t h) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf), bit);
  return _mm256_cmpeq_epi8(v, bit);
}
// byte i = 16 where bit i of h is set, else 0
static inline __m256i bit16s(uint32_t h) { return and8(bits_set(h), 16); }
// byte i = -1 where bit i of h is set, else 1 (for _mm256_sign_epi8)
static inline __m256i sign_bytes(uint32_t h) { return _mm256_or_si256(bits_set(h), bytes(1)); }

// Each type calls f(e, q, s0, s1, m0, m1) for elements e..e+31 of a block: the
// values are s*q - m, with (s0, m0) for the first 16 and (s1, m1) for the rest.
// SIGNED: q holds int8 values; otherwise unsigned bytes below 128.
struct Q8_0 {
  enum { QK = 32, TS = 34, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    f(0, ld256(b + 2), d, d, 0.f, 0.f);
  }
};
struct Q4_0 {
  enum { QK = 32, TS = 18, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    f(0, _mm256_sub_epi8(nibbles(b + 2), bytes(8)), d, d, 0.f, 0.f);
  }
};
struct Q4_1 {
  enum { QK = 32, TS = 20, SIGNED = 0, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b), m = h2f(b + 2);
    f(0, nibbles(b + 4), d, d, -m, -m);
  }
};
struct Q5_0 {
  enum { QK = 32, TS = 22, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    f(0, _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), bit16s(u32(b + 2))), bytes(16)), d, d, 0.f, 0.f);
  }
};
struct Q5_1 {
  enum { QK = 32, TS = 24, SIGNED = 0, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b), m = h2f(b + 2);
    f(0, _mm256_or_si256(nibbles(b + 8), bit16s(u32(b + 4))), d, d, -m, -m);
  }
};
struct Q2_K {
  enum { QK = 256, TS = 84, SIGNED = 0, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    UNROLL for (int h = 0; h < 2; h++) {
      const __m256i q = ld256(qs + 32 * h);
      UNROLL for (int j = 0; j < 4; j++) {
        const int s0 = sc[8 * h + 2 * j], s1 = sc[8 * h + 2 * j + 1];
        f(128 * h + 32 * j, and8(_mm256_srli_epi16(q, 2 * j), 3), d * (float)(s0 & 15), d * (float)(s1 & 15),
          dmin * (float)(s0 >> 4), dmin * (float)(s1 >> 4));
      }
    }
  }
};
struct Q3_K {
  enum { QK = 256, TS = 110, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *hm = b, *qs = b + 32, *ls = b + 96, *hs = b + 104;
    const float d = h2f(b + 108);
    const __m256i hv = ld256(hm);
    UNROLL for (int h = 0; h < 2; h++) {
      const __m256i q = ld256(qs + 32 * h);
      UNROLL for (int j = 0; j < 4; j++) {
        const int k = 8 * h + 2 * j;
        const __m256i lo = and8(_mm256_srli_epi16(q, 2 * j), 3);
        const __m256i hb = _mm256_slli_epi16(and8(_mm256_srli_epi16(hv, 4 * h + j), 1), 2);
        f(128 * h + 32 * j, _mm256_sub_epi8(_mm256_or_si256(lo, hb), bytes(4)), q3k_scale(ls, hs, k, d),
          q3k_scale(ls, hs, k + 1, d), 0.f, 0.f);
      }
    }
  }
};


// Sums of four adjacent u8 x s8 products per int32 lane: one VNNI instruction where the
// CPU has it (AVX-512 VNNI, on 256-bit registers), else maddubs and madd.
static inline __m256i dot4(__m256i u8, __m256i s8, __m256i ones) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)ones;
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u8, s8);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), ones);
#endif
}

static inline int32_t hsum8i(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
}

// Quantize M rows of x (M, K), K % 32 == 0, into the buffers of xq.
static inline void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *hs, float *d8) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < M * K / 32; g++) {
    const float *xp = x + 32 * g;
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xp + 8 * i);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    const float amax = _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
    const float dd = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    const __m256 iv = _mm256_set1_ps(id);
    __m256i n[4];
    for (int i = 0; i < 4; i++) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv));  // round to nearest even
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    const __m256i qv = _mm256_permutevar8x32_epi32(p, order);
    _mm256_storeu_si256((__m256i *)(q + 32 * g), qv);
    d[g] = dd;
    // sums of each 16: bytes widened to int16 and added in pairs
    const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qv));
    const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qv, 1));
    const int32_t s0 = hsum8i(_mm256_madd_epi16(lo, ones)), s1 = hsum8i(_mm256_madd_epi16(hi, ones));
    hs[2 * g] = dd * (float)s0;
    hs[2 * g + 1] = dd * (float)s1;
    if (d8) {
      float *pair = d8 + 32 * (g / 2) + 8 * (g % 2);
      _mm256_storeu_ps(pair, _mm256_set1_ps(dd));
      _mm256_storeu_ps(pair + 16, _mm256_set_m128(_mm_set1_ps(32.f * dd * (float)s1), _mm_set1_ps(32.f * dd * (float)s0)));
    }
  }
}

// The weights `n` bytes from p, PREFETCH bytes further on, asked into the cache: measured on the
// 2-core AVX2 EPYC (Zen 3), Qwen2.5 0.5B's matrices streamed from DRAM ran 1.1-1.3x faster
// one activation row at a time (the hardware prefetcher alone left the stream at about half
// of what torch.sum reads), the same in cache; 1, 2 and 4 KB ahead measured alike. Only the
// 256-weight steps: the block visitor runs below the memory's speed, and lost 4-7% with it.
#ifndef PREFETCH
#define PREFETCH 2048
#endif
static ALWAYS_INLINE void prefetch_ahead(const uint8_t *p, int64_t n) {
  for (int64_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + PREFETCH + o, _MM_HINT_T0);
}

template <class T, int M>
static void rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / T::QK, G = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    __m256 acc[M];
    float mins[M];
    for (int m = 0; m < M; m++) { acc[m] = _mm256_setzero_ps(); mins[m] = 0.f; }
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      const int64_t g0 = j * (T::QK / 32);
      T::visit(b, [&](int e, __m256i q, float s0, float s1, float m0, float m1) ALWAYS_INLINE_LAMBDA {
        const int64_t g = g0 + e / 32;
        const __m256 sv = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
        const __m256i qa = T::SIGNED ? _mm256_sign_epi8(q, q) : q;
        for (int m = 0; m < M; m++) {
          __m256i xv = ld256((const uint8_t *)(x.q + m * K + 32 * g));
          if (T::SIGNED) xv = _mm256_sign_epi8(xv, q);
          const __m256i p = dot4(qa, xv, ones);
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sv, _mm256_broadcast_ss(x.d + m * G + g)), acc[m]);
          if (T::MIN) mins[m] += m0 * x.hs[m * 2 * G + 2 * g] + m1 * x.hs[m * 2 * G + 2 * g + 1];
        }
      });
    }
    for (int m = 0; m < M; m++) y[m * ldy + r] = hsum8(acc[m]) - mins[m];
  }
}

// Steps of 256 weights for `rows8`: Step<T>::scales(b, n, s, mn) gives a step's 8 groups'
// scales as vectors, s[0] (8 lanes, one per group) or, PER16, s[0] and s[1] (16 lanes, one
// per 16 weights: groups 0-3, then 4-7), and the mins mn alike; codes(b, i) the 32 codes of
// group i, unsigned bytes below 128 (signed bytes where SIGNED is 1, mins then 0; where SIGNED
// is 2, magnitudes below 128 and signs(b, i) their signs as bytes of 1 or -1: the grid types,
// whose signs come apart from their magnitudes). A weight is s * code - mn. One step is 8
// blocks of a 32-weight type, one block of a k-quant.
template <class T>
struct Step {
  enum { OK = 0 };
};
static ALWAYS_INLINE __m256 h2f8(const uint8_t *b, int stride, int n) {  // n <= 8 fp16 values, `stride` bytes apart; 0 after
  uint16_t h[8];
  for (int i = 0; i < 8; i++) {
    h[i] = 0;
    if (i < n) memcpy(h + i, b + i * stride, 2);
  }
  return _mm256_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
}
template <int TS, int OFF, int MOFF, int QOFF, int HOFF>  // Q4_0 / Q4_1 / Q5_0 / Q5_1: scale at 0, min at MOFF (or none)
struct Step32 {
  enum { OK = 1, BLOCKS = 8, PER16 = 0, SIGNED = 0 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int n, __m256 *s, __m256 *mn) {
    s[0] = h2f8(b, TS, n);
    mn[0] = MOFF ? _mm256_sub_ps(_mm256_setzero_ps(), h2f8(b + MOFF, TS, n)) : _mm256_mul_ps(s[0], _mm256_set1_ps((float)OFF));
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const __m256i lo = nibbles(b + i * TS + QOFF);
    return HOFF ? _mm256_or_si256(lo, bit16s(u32(b + i * TS + HOFF))) : lo;
  }
};
template <> struct Step<Q4_0> : Step32<18, 8, 0, 2, 0> {};
template <> struct Step<Q4_1> : Step32<20, 0, 2, 4, 0> {};
template <> struct Step<Q5_0> : Step32<22, 16, 0, 6, 2> {};
template <> struct Step<Q5_1> : Step32<24, 0, 2, 8, 4> {};
template <>
struct Step<Q8_0> {
  enum { OK = 1, BLOCKS = 8, PER16 = 0, SIGNED = 1 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int n, __m256 *s, __m256 *mn) { s[0] = h2f8(b, 34, n); mn[0] = _mm256_setzero_ps(); }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) { return ld256(b + i * 34 + 2); }
};

// 8 floats from p, lanes n.. zero (n <= 8; nothing read past p + n)
static ALWAYS_INLINE __m256 load8(const float *p, int n) {
  if (n == 8) return _mm256_loadu_ps(p);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}

// One step of `rows8` for one weight row: n groups of 32 (8, fewer only in a row's last step
// of a 32-weight type) from g0, into each activation row's accumulators acc and acc2 (odd
// groups: for one row alone an FMA's latency, not its throughput, bounds a chain; every
// row count takes the same two, so a row sums alike alone and in a batch).
template <class T, int M>
static ALWAYS_INLINE void step8(const uint8_t *b, int n, int64_t g0, const XQ &x, __m256 *acc, __m256 *acc2) {
  typedef Step<T> S;
  const int64_t K = x.K, G = K / 32;
  __m256 s[2], mn[2];
  S::scales(b, n, s, mn);
  alignas(32) float sx[M][8];  // each row's scales times its activation scales, one per group (not PER16)
  __m256 sx16[M][2];           // PER16: lane l of sx16[m][h] for the 16 weights l/4 of group 4h + l/2
  for (int m = 0; m < M; m++) {
    const float *hs = x.hs + m * 2 * G + 2 * g0;  // the activations' sums of each 16
    const __m256 xd = load8(x.d + m * G + g0, n);
    if (S::PER16) {
      if (!S::SIGNED) {  // signed codes have no mins
        acc[m] = _mm256_fnmadd_ps(mn[0], _mm256_loadu_ps(hs), acc[m]);
        acc[m] = _mm256_fnmadd_ps(mn[1], _mm256_loadu_ps(hs + 8), acc[m]);
      }
      const __m256 a = _mm256_unpacklo_ps(xd, xd), c = _mm256_unpackhi_ps(xd, xd);  // 0 0 1 1 4 4 5 5, 2 2 3 3 6 6 7 7
      sx16[m][0] = _mm256_mul_ps(s[0], _mm256_permute2f128_ps(a, c, 0x20));
      sx16[m][1] = _mm256_mul_ps(s[1], _mm256_permute2f128_ps(a, c, 0x31));
    } else {
      if (!S::SIGNED) {
        const __m256 h = _mm256_hadd_ps(load8(hs, 2 * n < 8 ? 2 * n : 8), load8(hs + 8, 2 * n > 8 ? 2 * n - 8 : 0));
        const __m256 h32 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8));  // sums of each 32
        acc[m] = _mm256_fnmadd_ps(mn[0], h32, acc[m]);
      }
      _mm256_store_ps(sx[m], _mm256_mul_ps(s[0], xd));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  UNROLL for (int i = 0; i < 8; i++) {
    if (i >= n) break;
    const __m256i q = S::codes(b, i);
    const __m256i qa = S::SIGNED == 1 ? _mm256_sign_epi8(q, q) : q;
    __m256i sg = q;  // what the activations' signs are taken from
    if constexpr (S::SIGNED == 2) sg = S::signs(b, i);
    const int u = 2 * (i % 4);
    const __m256i idx = _mm256_setr_epi32(u, u, u, u, u + 1, u + 1, u + 1, u + 1);
    for (int m = 0; m < M; m++) {
      __m256i xv = ld256((const uint8_t *)(x.q + m * K + 32 * (g0 + i)));
      if (S::SIGNED) xv = _mm256_sign_epi8(xv, sg);
      const __m256 p = _mm256_cvtepi32_ps(dot4(qa, xv, ones));
      const __m256 sc = S::PER16 ? _mm256_permutevar8x32_ps(sx16[m][i / 4], idx) : _mm256_broadcast_ss(sx[m] + i);
      __m256 &a = i % 2 ? acc2[m] : acc[m];  // the same sums for a row alone or in a batch
      a = _mm256_fmadd_ps(p, sc, a);
    }
  }
}

// `rows` a step at a time: a step's scales and mins decoded as vectors once, the mins
// taken off with one product per step against the activations' sums of each 32 (or 16),
// and each group a dot per row scaled by its lane of the step's scales. Unsigned codes
// need no sign trick; a type's offset (Q4_0's 8, Q6_K's 32) goes in with the mins.
template <class T, int M>
static void rows8(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  typedef Step<T> S;
  const int64_t G = x.K / 32, step = S::BLOCKS * T::TS;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    __m256 acc[M], acc2[M];
    for (int m = 0; m < M; m++) acc[m] = acc2[m] = _mm256_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + 8 <= G; g0 += 8, b += step) {
      prefetch_ahead(b, step);
      step8<T, M>(b, 8, g0, x, acc, acc2);
    }
    if (g0 < G) step8<T, M>(b, (int)(G - g0), g0, x, acc, acc2);  // a 32-weight type's last blocks
    for (int m = 0; m < M; m++) y[m * ldy + r] = hsum8(_mm256_add_ps(acc[m], acc2[m]));
  }
}

// The k-quants (Q4_K, Q5_K, Q6_K) against activations quantized as llama.cpp's Q8_K: int8
// in blocks of 256 with one float scale each (the max at 127) and the sum of each 16 codes
// as int16. A block's dots, scales and mins then stay integer (maddubs of codes and
// activations, madd of those pairs with the 16-weight scales), one float product per block:
// about half the vector work of taking each group of 32 to float (`rows512`), which left
// the Q4_K gemv compute-bound on one core.
//
// Quantize M rows of x (M, K), K % 256 == 0, into q (M, K), d (M, K/256), bs (M, K/16).
static inline void quantize_rows_k(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int16_t *bs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < M * K / 256; g++) {
    const float *xp = x + 256 * g;
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xp + 8 * i)));
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    const float amax = _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
    d[g] = amax / 127.f;
    const __m256 iv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    for (int s = 0; s < 8; s++) {  // 32 codes at a time
      __m256i n[4];
      for (int i = 0; i < 4; i++) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp + 32 * s + 8 * i), iv));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
      const __m256i qv = _mm256_permutevar8x32_epi32(p, order);
      _mm256_storeu_si256((__m256i *)(q + 256 * g + 32 * s), qv);
      const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, qv), ones16);  // sums of 4 codes
      const __m256i h = _mm256_hadd_epi32(s4, s4), s16 = _mm256_hadd_epi32(h, h);  // lanes 0 and 4: sums of 16
      bs[16 * g + 2 * s] = (int16_t)_mm256_extract_epi32(s16, 0);
      bs[16 * g + 2 * s + 1] = (int16_t)_mm256_extract_epi32(s16, 4);
    }
  }
}

// A k-quant block for `rowsk`: load(b, sc, mn, d, dmin) gives its 16 scales and mins, one per
// 16 weights, as int16, and d, dmin; codes(b, i) the 32 codes of group i as unsigned bytes
// below 64. A weight is d * sc * code - dmin * mn.
template <class T>
struct KBlock {
  enum { OK = 0 };
};
template <int QS, int QH>  // Q4_K (no 5th bits) / Q5_K: 6-bit scales and mins per 32, each taken twice
struct KBlock45 {
  enum { OK = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m256i &sc, __m256i &mn, float &d, float &dmin) {
    uint32_t u[4];
    k_scale_bytes(b + 4, u);
    const __m128i v = _mm_loadu_si128((const __m128i *)u);  // 8 scales, then 8 mins
    sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));
    mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v));
    d = h2f(b);
    dmin = h2f(b + 2);
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {  // weights 64j..: low nibbles of 32 bytes, then high
    const __m256i q = ld256(b + QS + 32 * (i / 2));
    const __m256i lo = i % 2 ? srl8(q, 4) : and8(q, 15);
    return QH ? _mm256_or_si256(lo, _mm256_slli_epi16(and8(_mm256_srli_epi16(ld256(b + QH), i), 1), 4)) : lo;
  }
};
template <> struct KBlock<Q4_K> : KBlock45<16, 0> {};
template <> struct KBlock<Q5_K> : KBlock45<48, 16> {};
template <>
struct KBlock<Q6_K> {  // int8 scales per 16, codes q + 32: the min is 32 * scale
  enum { OK = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m256i &sc, __m256i &mn, float &d, float &dmin) {
    sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    mn = _mm256_slli_epi16(sc, 5);
    d = dmin = h2f(b + 208);
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {  // group 4h + t: nibbles of ql (t even: low), 2 bits of qh
    const int h = i / 4, t = i % 4;
    const __m256i ql = ld256(b + 64 * h + 32 * (t % 2)), qh = ld256(b + 128 + 32 * h);
    const __m256i lo = t < 2 ? and8(ql, 15) : srl8(ql, 4);
    return _mm256_or_si256(lo, _mm256_slli_epi16(and8(_mm256_srli_epi16(qh, 2 * t), 3), 4));
  }
};

// Pair sums of u8 codes x s8 activations (int16, no saturation: codes below 64) times int16
// scales, added into int32 lanes: one VNNI instruction where the CPU has it.
static ALWAYS_INLINE __m256i dot_scaled(__m256i acc, __m256i codes, __m256i xv, __m256i sc) {
  const __m256i p = _mm256_maddubs_epi16(codes, xv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p, sc);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}

// `rows` for the k-quants on XK activations: per block, group i's codes times each row's
// int8 activations, scaled by the group's two 16-weight scales (lanes 0-7, 8-15), summed in
// int32 (two chains: even and odd groups), then the mins against the rows' 16-sums, and one
// float product per block and row. Each row sums alike alone and in a batch.
template <class T, int M>
static void rowsk(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / 256;
  // group i's scales from its half of the 16: int16 lanes 0-7 take scale 2i, 8-15 scale 2i + 1
  const __m256i pick[4] = {
      _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3),
      _mm256_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7),
      _mm256_setr_epi8(8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11,
                       10, 11, 10, 11),
      _mm256_setr_epi8(12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15,
                       14, 15, 14, 15, 14, 15, 14, 15)};
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    __m256 acc[M];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      if (M > 1) prefetch_ahead(b, T::TS);  // measured: 1.4-1.7x for 4 rows; nothing, or a loss, for one
      __m256i sc, mn;
      float d, dmin;
      KBlock<T>::load(b, sc, mn, d, dmin);
      const __m256i lo = _mm256_permute2x128_si256(sc, sc, 0x00), hi = _mm256_permute2x128_si256(sc, sc, 0x11);
      __m256i is[M][2];
      for (int m = 0; m < M; m++) is[m][0] = is[m][1] = _mm256_setzero_si256();
      UNROLL for (int i = 0; i < 8; i++) {
        const __m256i q = KBlock<T>::codes(b, i);
        const __m256i s = _mm256_shuffle_epi8(i < 4 ? lo : hi, pick[i % 4]);
        for (int m = 0; m < M; m++) {
          const __m256i xv = ld256((const uint8_t *)(x.k.q + m * K + 256 * j + 32 * i));
          is[m][i % 2] = dot_scaled(is[m][i % 2], q, xv, s);
        }
      }
      for (int m = 0; m < M; m++) {
        const float dx = x.k.d[m * nb + j];
        const __m256i im = _mm256_madd_epi16(mn, ld256((const uint8_t *)(x.k.bs + m * K / 16 + 16 * j)));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(is[m][0], is[m][1])), _mm256_set1_ps(d * dx), acc[m]);
        acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_set1_ps(dmin * dx), acc[m]);
      }
    }
    for (int m = 0; m < M; m++) y[m * ldy + r] = hsum8(acc[m]);
  }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define TK_GEMV_512 1
// Sums of four adjacent u8 x s8 products per int32 lane, on 512-bit registers.
static inline __m512i dot4x(__m512i u8, __m512i s8) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u8, s8);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u8, s8), _mm512_set1_epi16(1));
#endif
}
static inline __m256 halves(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }

// A type's codes a 512-bit register (a pair of 32-weight groups) at a time, for rows512 on
// VNNI: Wide<T>::load(b, qu, s, mn) gives the NP pairs of one step (two blocks of a 32-weight
// type, else one block) as bytes qu[i] and each lane's scale s[i] (lanes 0-7 the first group,
// 8-15 the second, per 16 weights where a type's scales are); the weights are s * (qu - 128)
// where SIGNED, else s * qu - mn, mn (QK 256 only) the min of each 16. Built on whole
// registers (one permute for two blocks' nibbles, one mask for 64 high bits, one shuffle
// through a table, the k-quants' scales decoded as vectors), where the generic visitor
// takes 32 codes and two scalar scales at a time. Wide<T>::OK says a type has one.
template <class T>
struct Wide {
  enum { OK = 0, NP = 1, SIGNED = 0, MIN = 0 };
  static void load(const uint8_t *, __m512i *, __m512 *, __m512 &) {}
};
static ALWAYS_INLINE __m512 scales2(const uint8_t *da, const uint8_t *db) {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(h2f(da)), _mm512_set1_ps(h2f(db)));
}
// The 16 nibble bytes at pa and at pb -> 64 bytes: pa's low nibbles, its high ones, pb's low, pb's high.
static ALWAYS_INLINE __m512i nibbles2(const uint8_t *pa, const uint8_t *pb) {
  const __m256i ab = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)pb), _mm_loadu_si128((const __m128i *)pa));
  const __m512i t = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(ab));
  return _mm512_and_si512(_mm512_mask_srli_epi16(t, (__mmask32)0xFF00FF00u, t, 4), _mm512_set1_epi8(15));  // lanes 1, 3
}
// 32 bytes twice, the copy in the upper half shifted right by `hi` bits per 64-bit lane, the lower by `lo`,
// then masked: 2-bit (mask 3) or 1-bit fields of the same bytes for two groups.
static ALWAYS_INLINE __m512i fields2(const uint8_t *p, int lo, int hi, int mask) {
  const __m512i v = _mm512_broadcast_i64x4(ld256(p));
  const __m512i n = _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi);
  return _mm512_and_si512(_mm512_srlv_epi64(v, n), _mm512_set1_epi8((char)mask));
}
// v's scales spread over pair i's lanes: lane l takes v[4i + l/4] for scales per 16 weights
// (sh 2), v[2i + l/8] for scales per 32 (sh 3)
template <int sh>
static ALWAYS_INLINE __m512 spread(__m512 v, int i) {
  const __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), sh);
  return _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32((16 >> sh) * i)), v);
}
static ALWAYS_INLINE __m512 ubytes_ps(const void *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }

template <>
struct Wide<Q4_0> {
  enum { OK = 1, NP = 1, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    qu[0] = _mm512_add_epi8(nibbles2(b + 2, b + 20), _mm512_set1_epi8(120));  // q - 8 + 128
    s[0] = scales2(b, b + 18);
  }
};
template <>
struct Wide<Q5_0> {
  enum { OK = 1, NP = 1, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const __mmask64 hi = (uint64_t)u32(b + 2) | (uint64_t)u32(b + 24) << 32;  // bit i: 16 for byte i
    const __m512i lo = _mm512_add_epi8(nibbles2(b + 6, b + 28), _mm512_set1_epi8(112));  // q - 16 + 128
    qu[0] = _mm512_mask_add_epi8(lo, hi, lo, _mm512_set1_epi8(16));
    s[0] = scales2(b, b + 22);
  }
};
template <>
struct Wide<Q2_K> {
  enum { OK = 1, NP = 4, SIGNED = 0, MIN = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &mn) {
    const __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));  // scale | min << 4, per 16
    const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15))), _mm512_set1_ps(h2f(b + 80)));
    mn = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)), _mm512_set1_ps(h2f(b + 82)));
    UNROLL for (int p = 0; p < 4; p++) {  // weights 128h + 32j + l: bits 2j of byte 32h + l
      qu[p] = fields2(b + 16 + 32 * (p / 2), 4 * (p % 2), 4 * (p % 2) + 2, 3);
      s[p] = spread<2>(sc, p);
    }
  }
};
template <>
struct Wide<Q3_K> {
  enum { OK = 1, NP = 4, SIGNED = 0, MIN = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &mn) {
    uint64_t ls;  // scale k: the low 4 bits from nibble k of these 8 bytes (low nibbles first), 2 high bits from hs
    memcpy(&ls, b + 96, 8);
    const uint32_t hs = u32(b + 104);
    const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full, m2 = 0x03030303u;
    const uint64_t h0 = (hs & m2) | (uint64_t)((hs >> 2) & m2) << 32, h1 = ((hs >> 4) & m2) | (uint64_t)((hs >> 6) & m2) << 32;
    const __m128i v = _mm_set_epi64x((long long)(((ls >> 4) & m4) | h1 << 4), (long long)((ls & m4) | h0 << 4));
    const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(v, _mm_set1_epi8(32)))),
                                    _mm512_set1_ps(h2f(b + 108)));
    mn = _mm512_mul_ps(sc, _mm512_set1_ps(4.f));  // codes 0..7 for q + 4
    UNROLL for (int p = 0; p < 4; p++) {  // weights 128h + 32j + l: bits 2j of qs[32h + l], bit 4h + j of hmask[l]
      const int h = p / 2, j = 2 * (p % 2);
      qu[p] = _mm512_or_si512(fields2(b + 32 + 32 * h, 2 * j, 2 * j + 2, 3), _mm512_slli_epi16(fields2(b, 4 * h + j, 4 * h + j + 1, 1), 2));
      s[p] = spread<2>(sc, p);
    }
  }
};

// `rows` with two groups of 32 per 512-bit register (K % 64 == 0): a type's groups are
// gathered a block at a time (two blocks of a 32-weight type), then multiplied in pairs
// into every activation row; the mins of 16 halves take one vector product. With VNNI,
// signed weights go in as unsigned w + 128 (one xor for all rows, where the sign trick
// takes an abs and a mask, and a masked negation per row), and each lane takes off
// 32 * d * its 16's sum (d8's second half): sum (w + 128) x - 128 sum x = sum w x.
template <class T, int M>
static void rows512(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  constexpr int NG = T::QK / 32, BPI = NG == 1 ? 2 : 1, NGI = NG * BPI;  // groups per block, per iteration
  const int64_t K = x.K, nb = K / T::QK, G = K / 32;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    __m512 acc[M], macc[M];
    float mins[M];
    for (int m = 0; m < M; m++) { acc[m] = macc[m] = _mm512_setzero_ps(); mins[m] = 0.f; }
    for (int64_t j = 0; j < nb; j += BPI, b += BPI * T::TS) {
      if (M > 1) prefetch_ahead(b, BPI * T::TS);  // as rowsk
#if defined(__AVX512VNNI__)
      if constexpr (Wide<T>::OK) {
        typedef Wide<T> W;
        __m512i qu[W::NP];
        __m512 s[W::NP], mn;
        W::load(b, qu, s, mn);
        const int64_t g0 = j * NG;
        for (int m = 0; m < M; m++) {
          UNROLL for (int i = 0; i < W::NP; i++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x.q + m * K + 32 * (g0 + 2 * i)));
            const float *dc = x.d8 + 16 * (m * G + g0 + 2 * i);
            const __m512 dot = _mm512_cvtepi32_ps(dot4x(qu[i], xv));
            const __m512 p = W::SIGNED ? _mm512_fmsub_ps(dot, _mm512_loadu_ps(dc), _mm512_loadu_ps(dc + 16))
                                       : _mm512_mul_ps(dot, _mm512_loadu_ps(dc));
            acc[m] = _mm512_fmadd_ps(p, s[i], acc[m]);
          }
          if (W::MIN) macc[m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(x.hs + m * 2 * G + 2 * g0), macc[m]);
        }
        continue;
      }
#endif
      __m256i q[NGI];
      __m256 sv[NGI];
      alignas(64) float mv[2 * NGI];
      UNROLL for (int k = 0; k < BPI; k++)
        T::visit(b + k * T::TS, [&](int e, __m256i qq, float s0, float s1, float m0, float m1) ALWAYS_INLINE_LAMBDA {
          const int i = k * NG + e / 32;
          q[i] = qq;
          sv[i] = halves(s0, s1);
          mv[2 * i] = m0;
          mv[2 * i + 1] = m1;
        });
      const int64_t g0 = j * NG;
      UNROLL for (int i = 0; i < NGI; i += 2) {
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q[i]), q[i + 1], 1);
        const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(sv[i]), sv[i + 1], 1);
#if defined(__AVX512VNNI__)
        if (T::SIGNED) {
          const __m512i qu = _mm512_xor_si512(qq, _mm512_set1_epi8((char)0x80));
          for (int m = 0; m < M; m++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x.q + m * K + 32 * (g0 + i)));
            const float *dc = x.d8 + 16 * (m * G + g0 + i);
            const __m512 p = _mm512_fmsub_ps(_mm512_cvtepi32_ps(dot4x(qu, xv)), _mm512_loadu_ps(dc),
                                             _mm512_loadu_ps(dc + 16));
            acc[m] = _mm512_fmadd_ps(p, s, acc[m]);
          }
          continue;
        }
#endif
        const __m512i qa = T::SIGNED ? _mm512_abs_epi8(qq) : qq;
        const __mmask64 neg = T::SIGNED ? _mm512_movepi8_mask(qq) : 0;
        for (int m = 0; m < M; m++) {
          __m512i xv = _mm512_loadu_si512((const void *)(x.q + m * K + 32 * (g0 + i)));
          if (T::SIGNED) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
          const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(dot4x(qa, xv)), s);
          acc[m] = _mm512_fmadd_ps(p, _mm512_loadu_ps(x.d8 + 16 * (m * G + g0 + i)), acc[m]);
        }
      }
      if (T::MIN) {
        if (2 * NGI == 16) {
          const __m512 mvv = _mm512_load_ps(mv);
          for (int m = 0; m < M; m++) macc[m] = _mm512_fmadd_ps(mvv, _mm512_loadu_ps(x.hs + m * 2 * G + 2 * g0), macc[m]);
        } else {
          for (int m = 0; m < M; m++)
            for (int i = 0; i < 2 * NGI; i++) mins[m] += mv[i] * x.hs[m * 2 * G + 2 * g0 + i];
        }
      }
    }
    for (int m = 0; m < M; m++)
      y[m * ldy + r] = _mm512_reduce_add_ps(acc[m]) - (T::MIN || Wide<T>::MIN ? _mm512_reduce_add_ps(macc[m]) + mins[m] : 0.f);
  }
}

#if defined(__AVX512VNNI__)
// The types `rows512x2` takes: signed codes, no mins, one pair of 32-weight groups (two
// blocks) per iteration of rows512's VNNI path.
template <class T>
struct Pairs2 {
  static constexpr bool OK =
      Wide<T>::OK ? Wide<T>::NP == 1 && Wide<T>::SIGNED && !Wide<T>::MIN : T::QK == 32 && T::SIGNED && !T::MIN;
  // From how many activation rows: Q8_0's 34-byte blocks stay bound by memory below 5 rows,
  // where one weight row at a time streamed faster (Gemma 3's 262,144 x 640 output, Zen 5).
  static constexpr int FROM = T::TS == 34 ? 5 : 2;
};
// One iteration's codes (as unsigned w + 128) and lane scales, as rows512's VNNI path has them.
template <class T>
static ALWAYS_INLINE void signed_pair(const uint8_t *b, __m512i &qu, __m512 &s) {
  if constexpr (Wide<T>::OK) {
    __m512 mn;
    Wide<T>::load(b, &qu, &s, mn);
  } else {
    __m256i q[2];
    __m256 sv[2];
    UNROLL for (int k = 0; k < 2; k++)
      T::visit(b + k * T::TS, [&](int, __m256i qq, float s0, float s1, float, float) ALWAYS_INLINE_LAMBDA {
        q[k] = qq;
        sv[k] = halves(s0, s1);
      });
    qu = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1), _mm512_set1_epi8((char)0x80));
    s = _mm512_insertf32x8(_mm512_castps256_ps512(sv[0]), sv[1], 1);
  }
}

// rows512 for several activation rows, two weight rows at a time: each activation row's
// codes and scales are loaded once for both, halving the loads and address arithmetic per
// product where a few rows (a verification, a batch) keep the kernel busy with arithmetic
// rather than memory. Each weight row runs the very operations rows512 runs for it, in the
// same order, so its sums are bit for bit those of rows512 (and of a row alone).
template <class T, int M>
static void rows512x2(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  static_assert(T::QK == 32, "one pair of groups per iteration");
  const int64_t K = x.K, G = K / 32;
  int64_t r = r0;
  for (; r + 1 < r1; r += 2) {
    const uint8_t *b0 = w + r * ldw, *b1 = b0 + ldw;
    __m512 acc0[M], acc1[M];
    for (int m = 0; m < M; m++) acc0[m] = acc1[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g += 2, b0 += 2 * T::TS, b1 += 2 * T::TS) {
      prefetch_ahead(b0 + PREFETCH, 2 * T::TS);  // twice rows512's distance: two rows' blocks an iteration
      prefetch_ahead(b1 + PREFETCH, 2 * T::TS);
      __m512i qu0, qu1;
      __m512 s0, s1;
      signed_pair<T>(b0, qu0, s0);
      signed_pair<T>(b1, qu1, s1);
      for (int m = 0; m < M; m++) {
        const __m512i xv = _mm512_loadu_si512((const void *)(x.q + m * K + 32 * g));
        const float *dc = x.d8 + 16 * (m * G + g);
        const __m512 d = _mm512_loadu_ps(dc), d16 = _mm512_loadu_ps(dc + 16);
        acc0[m] = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(dot4x(qu0, xv)), d, d16), s0, acc0[m]);
        acc1[m] = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(dot4x(qu1, xv)), d, d16), s1, acc1[m]);
      }
    }
    for (int m = 0; m < M; m++) {
      y[m * ldy + r] = _mm512_reduce_add_ps(acc0[m]);
      y[m * ldy + r + 1] = _mm512_reduce_add_ps(acc1[m]);
    }
  }
  if (r < r1) rows512<T, M>(w, ldw, r, r1, x, y, ldy);
}

// rowsk on 512-bit registers (VNNI): groups 2p and 2p + 1 of a block in one register (low
// half, high half), so one maddubs and one dpwssd do what rowsk does in two of each. Integer
// sums are exact in any order, and the halves' sum is rowsk's two chains' sum lane for lane,
// so from there each row runs rowsk's float operations in rowsk's order: the same sums, bit
// for bit.
template <class T, int M>
static void rowsk512(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const int64_t K = x.K, nb = K / 256;
  // pair p's scales, from the 8 int16 of its half of the block's 16 (lo, hi: one per 128-bit lane):
  // group 2p takes scales 4p' and 4p' + 1 in its two 8-lane halves, group 2p + 1 scales 4p' + 2
  // and 4p' + 3 (p' = p % 2), as rowsk's pick gives them
  const __m512i pick[2] = {
      _mm512_setr_epi64(0x0100010001000100LL, 0x0100010001000100LL, 0x0302030203020302LL, 0x0302030203020302LL,
                        0x0504050405040504LL, 0x0504050405040504LL, 0x0706070607060706LL, 0x0706070607060706LL),
      _mm512_setr_epi64(0x0908090809080908LL, 0x0908090809080908LL, 0x0B0A0B0A0B0A0B0ALL, 0x0B0A0B0A0B0A0B0ALL,
                        0x0D0C0D0C0D0C0D0CLL, 0x0D0C0D0C0D0C0D0CLL, 0x0F0E0F0E0F0E0F0ELL, 0x0F0E0F0E0F0E0F0ELL)};
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *b = w + r * ldw;
    __m256 acc[M];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; j++, b += T::TS) {
      if (M > 1) prefetch_ahead(b, T::TS);
      __m256i sc, mn;
      float d, dmin;
      KBlock<T>::load(b, sc, mn, d, dmin);
      const __m512i lo = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc));
      const __m512i hi = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sc, 1));
      __m512i is[M];
      for (int m = 0; m < M; m++) is[m] = _mm512_setzero_si512();
      UNROLL for (int p = 0; p < 4; p++) {
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(KBlock<T>::codes(b, 2 * p)),
                                             KBlock<T>::codes(b, 2 * p + 1), 1);
        const __m512i s = _mm512_shuffle_epi8(p < 2 ? lo : hi, pick[p % 2]);
        for (int m = 0; m < M; m++) {
          const __m512i xv = _mm512_loadu_si512((const void *)(x.k.q + m * K + 256 * j + 64 * p));
          is[m] = _mm512_dpwssd_epi32(is[m], _mm512_maddubs_epi16(q, xv), s);
        }
      }
      for (int m = 0; m < M; m++) {
        const float dx = x.k.d[m * nb + j];
        const __m256i im = _mm256_madd_epi16(mn, ld256((const uint8_t *)(x.k.bs + m * K / 16 + 16 * j)));
        const __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(is[m]), _mm512_extracti64x4_epi64(is[m], 1));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc[m]);
        acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_set1_ps(dmin * dx), acc[m]);
      }
    }
    for (int m = 0; m < M; m++) y[m * ldy + r] = hsum8(acc[m]);
  }
}

#define TK_GEMM 1  // the prompt GEMM on 512-bit registers, with VNNI
#endif
#else
#define TK_GEMV_512 0
#endif
#if !TK_GEMV_512
#define TK_GEMM 2  // the prompt GEMM on 256-bit registers (maddubs and madd), AVX2 builds
#else
#ifndef TK_GEMM
#define TK_GEMM 0  // AVX-512 without VNNI: torch's float32 tiles (AVX-512) beat the 256-bit GEMM
#endif
#endif

// A prompt's products, every block type's, as a GEMM: a chunk's weight rows are unpacked
// once (per thread and call, `GemmPack`) into int8 codes laid out TR rows by 4 codes at a
// time (TR: 16 with VNNI, 8 on AVX2), with each row's scale (and min) per 16 weights, and
// every group of activation rows then runs over them: one VNNI product takes 4 codes of 16
// weight rows against 4 activations broadcast (AVX2: maddubs and madd, 8 rows), so the float
// work (a scale per 16 weights) is shared by TR rows, where `rows512` does it per row and pair
// of groups (the k-quants' `rowsk` per row and block, on activations in blocks of 256; here
// theirs are in groups of 32 as every other type's, through `KVisit`). The activations go in
// as unsigned bytes (q + 128); each row's 128 * sum of its codes per 16 starts its integer
// sum negated. A row's sums here differ from its sums alone (a decode row), as the float32
// tiles' do: only calls of at least GEMM_ROWS rows take it.
#if TK_GEMM
template <int TR>
struct GemmPack {
  const uint8_t *w = nullptr;
  int64_t r0 = -1, r1 = -1, K = 0;
  uint64_t epoch = 0;
  avec<int8_t> codes;   // (tiles, K/16, 4, TR, 4)
  avec<float> sw, mw;   // (tiles, K/16, TR): scale, min
  avec<int32_t> nws;    // (tiles, K/16, TR): -128 * the sum of the 16 codes
};
extern std::atomic<uint64_t> gemm_epoch;  // a new value per call: a pack never outlives its call

// C: an offset taken off every code (a weight s * q - m is s * (q - C) - (m - s * C)), so that
// the codes of an unsigned type sit around 0.
template <class T, int TR, int C = 0>
static const GemmPack<TR> &gemm_pack(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, int64_t K) {
  thread_local GemmPack<TR> pack;
  GemmPack<TR> &p = pack;  // one TLS lookup, not one per access
  const uint64_t epoch = gemm_epoch.load(std::memory_order_relaxed);
  if (p.w == w && p.r0 == r0 && p.r1 == r1 && p.K == K && p.epoch == epoch) return p;
  const int64_t H = K / 16, tiles = (r1 - r0 + TR - 1) / TR;
  p.codes.resize(tiles * H * 16 * TR);  // every entry written below: the rows', then the last tile's padding
  p.sw.resize(tiles * H * TR);
  p.mw.resize(tiles * H * TR);
  p.nws.resize(tiles * H * TR);
  int8_t *codes = p.codes.data();
  float *sw = p.sw.data(), *mw = p.mw.data();
  int32_t *nws = p.nws.data();
  for (int64_t r = r0; r < r1; r++) {
    const int64_t t = (r - r0) / TR, rr = (r - r0) % TR;
    const uint8_t *b = w + r * ldw;
    for (int64_t j = 0; j < K / T::QK; j++, b += T::TS)
      T::visit(b, [&](int e, __m256i q, float s0, float s1, float m0, float m1) ALWAYS_INLINE_LAMBDA {
        const __m256i cq = C ? _mm256_sub_epi8(q, _mm256_set1_epi8(C)) : q;
        alignas(32) int8_t c[32];
        _mm256_store_si256((__m256i *)c, cq);
        // each 16's sum: the 8-byte sums of the codes + 128, less 16 x 128
        const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(cq, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
        const int32_t sums[2] = {(int32_t)(_mm256_extract_epi64(sad, 0) + _mm256_extract_epi64(sad, 1)) - 2048,
                                 (int32_t)(_mm256_extract_epi64(sad, 2) + _mm256_extract_epi64(sad, 3)) - 2048};
        for (int hh = 0; hh < 2; hh++) {
          const int64_t at = t * H + (j * T::QK + e) / 16 + hh;
          for (int k = 0; k < 4; k++) memcpy(codes + (at * 4 + k) * 4 * TR + 4 * rr, c + 16 * hh + 4 * k, 4);
          sw[at * TR + rr] = hh ? s1 : s0;
          mw[at * TR + rr] = C ? (hh ? m1 - s1 * C : m0 - s0 * C) : hh ? m1 : m0;
          nws[at * TR + rr] = -128 * sums[hh];
        }
      });
  }
  for (int64_t rr = (r1 - r0) % TR; rr && rr < TR; rr++)  // the last tile's padding rows: zero weights
    for (int64_t at = (tiles - 1) * H; at < tiles * H; at++) {
      for (int k = 0; k < 4; k++) memset(codes + (at * 4 + k) * 4 * TR + 4 * rr, 0, 4);
      sw[at * TR + rr] = mw[at * TR + rr] = 0.f;
      nws[at * TR + rr] = 0;
    }
  p.w = w, p.r0 = r0, p.r1 = r1, p.K = K, p.epoch = epoch;
  return p;
}

// A k-quant's blocks as the GEMM's unpacking takes them: each 32 codes (below 64) with the
// scale and min of each 16 (a weight is d * sc * code - dmin * mn).
template <class T>
struct KVisit {
  enum { QK = 256, TS = T::TS, SIGNED = 0, MIN = 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    __m256i sc, mn;
    float d, dmin;
    KBlock<T>::load(b, sc, mn, d, dmin);
    alignas(32) int16_t s[16], m[16];
    _mm256_store_si256((__m256i *)s, sc);
    _mm256_store_si256((__m256i *)m, mn);
    for (int i = 0; i < 8; i++)
      f(32 * i, KBlock<T>::codes(b, i), d * s[2 * i], d * s[2 * i + 1], dmin * m[2 * i], dmin * m[2 * i + 1]);
  }
};

#if TK_GEMM == 1
template <class T>
static constexpr bool gemm_takes() { return true; }  // every type of this file

// 16-code steps under one weight scale and min (and one activation scale, per 32): two for
// the 32-weight blocks and Q4_K and Q5_K (a scale per 32), one for the rest (Q6_K: per 16).
template <class T>
static constexpr int gemm_halves() {
  return T::QK == 32 || std::is_same<T, KVisit<Q4_K>>::value || std::is_same<T, KVisit<Q5_K>>::value ? 2 : 1;
}

template <class T, int M>
static void gemm_rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  constexpr int HS = gemm_halves<T>();
  const int64_t K = x.K, H = K / 16, G = K / 32;
  const GemmPack<16> &p = gemm_pack<T, 16>(w, ldw, r0, r1, K);
  for (int64_t t = 0; t * 16 < r1 - r0; t++) {
    __m512 acc[M];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t h = 0; h < H; h += HS) {
      const int64_t at = t * H + h;
      __m512i nw = _mm512_load_si512((const void *)&p.nws[at * 16]);
      if (HS == 2) nw = _mm512_add_epi32(nw, _mm512_load_si512((const void *)&p.nws[at * 16 + 16]));
      __m512i is[M];
      for (int m = 0; m < M; m++) is[m] = nw;
      UNROLL for (int k = 0; k < 4 * HS; k++) {
        const __m512i wv = _mm512_load_si512((const void *)&p.codes[(at * 4 + k) * 64]);
        for (int m = 0; m < M; m++) {
          int32_t xa;
          memcpy(&xa, x.qu + m * K + 16 * h + 4 * k, 4);
          is[m] = _mm512_dpbusd_epi32(is[m], _mm512_set1_epi32(xa), wv);
        }
      }
      const __m512 sw = _mm512_load_ps(&p.sw[at * 16]);
      for (int m = 0; m < M; m++)
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m]), _mm512_mul_ps(sw, _mm512_set1_ps(x.d[m * G + h / 2])), acc[m]);
      if (T::MIN)
        for (int hh = 0; hh < HS; hh++) {
          const __m512 mw = _mm512_load_ps(&p.mw[(at + hh) * 16]);
          for (int m = 0; m < M; m++) acc[m] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(x.hs[m * H + h + hh]), acc[m]);
        }
    }
    const int64_t n = r1 - r0 - 16 * t;
    const __mmask16 keep = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    for (int m = 0; m < M; m++) _mm512_mask_storeu_ps(y + m * ldy + r0 + 16 * t, keep, acc[m]);
  }
}
#else
// The AVX2 GEMM multiplies unsigned activations (q + 128) by the codes with maddubs, whose
// pair sums saturate at int16: it takes the types whose codes stay within +-64, adding
// GemmSums<T>::N maddubs results in int16 before one madd widens them (N * 2 * 255 * the
// largest code at most 32767), with the codes less C (gemm_pack) and mins where MIN. Q8_0's
// codes reach 127: it takes the sign trick instead (SIGNS: |w| times the signed activations
// given w's signs, as `rows`), one maddubs to each madd.
template <class T>
struct GemmSums {
  enum { N = 0, C = 0, MIN = 0, SIGNS = 0 };
};
template <> struct GemmSums<Q8_0> { enum { N = 1, C = 0, MIN = 0, SIGNS = 1 }; };  // -127..127
template <> struct GemmSums<Q4_0> { enum { N = 4, C = 0, MIN = 0, SIGNS = 0 }; };  // codes -8..7
template <> struct GemmSums<Q4_1> { enum { N = 4, C = 0, MIN = 1, SIGNS = 0 }; };  // 0..15
template <> struct GemmSums<Q5_0> { enum { N = 4, C = 0, MIN = 0, SIGNS = 0 }; };  // -16..15
template <> struct GemmSums<Q5_1> { enum { N = 4, C = 16, MIN = 1, SIGNS = 0 }; };  // 0..31, less 16
template <> struct GemmSums<Q2_K> { enum { N = 4, C = 0, MIN = 1, SIGNS = 0 }; };  // 0..3
template <> struct GemmSums<Q3_K> { enum { N = 4, C = 0, MIN = 0, SIGNS = 0 }; };  // -4..3
template <> struct GemmSums<KVisit<Q4_K>> { enum { N = 4, C = 0, MIN = 1, SIGNS = 0 }; };  // 0..15
template <> struct GemmSums<KVisit<Q5_K>> { enum { N = 4, C = 16, MIN = 1, SIGNS = 0 }; };  // 0..31, less 16
template <> struct GemmSums<KVisit<Q6_K>> { enum { N = 2, C = 32, MIN = 0, SIGNS = 0 }; };  // 0..63, less 32: no min left
template <class T>
static constexpr bool gemm_takes() { return GemmSums<T>::N > 0; }

// Tiles t .. t + TT - 1 (8 weight rows each) against activation rows m0 .. m0 + MM - 1: each
// code vector loaded once for MM rows, each activation broadcast once for TT tiles (TT x MM
// <= 4: the int16 sums and float accumulators stay in 16 registers), each integer sum scaled
// once per row and scale (16 codes; 32 for the 32-weight blocks). n: the weight rows left from
// tile t.
template <class T, int TT, int MM>
static ALWAYS_INLINE void gemm_tile(const GemmPack<8> &p, int64_t t, const XQ &x, int m0, float *y, int64_t ldy,
                                    int64_t n) {
  constexpr int N = GemmSums<T>::N, SIGNS = GemmSums<T>::SIGNS;
  constexpr int HS = T::QK == 32 ? 2 : 1;  // 16-code steps under one scale (a block of 32)
  const int64_t K = x.K, H = K / 16, G = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[TT][MM];
  for (int u = 0; u < TT; u++)
    for (int m = 0; m < MM; m++) acc[u][m] = _mm256_setzero_ps();
  for (int64_t h0 = 0; h0 < H; h0 += HS) {
    __m256i is[TT][MM], s16[TT][MM];
    for (int u = 0; u < TT; u++) {  // the offset of the activations taken as q + 128, or none (SIGNS)
      const __m256i *nws = (const __m256i *)&p.nws[((t + u) * H + h0) * 8];
      const __m256i nw = SIGNS ? _mm256_setzero_si256()
                         : HS == 2 ? _mm256_add_epi32(_mm256_load_si256(nws), _mm256_load_si256(nws + 1))
                                   : _mm256_load_si256(nws);
      for (int m = 0; m < MM; m++) is[u][m] = nw;
    }
    UNROLL for (int k = 0; k < 4 * HS; k++) {
      __m256i wv[TT], wa[TT];
      for (int u = 0; u < TT; u++) {
        wv[u] = _mm256_load_si256((const __m256i *)&p.codes[(((t + u) * H + h0) * 4 + k) * 32]);
        if (SIGNS) wa[u] = _mm256_abs_epi8(wv[u]);
      }
      for (int m = 0; m < MM; m++) {
        int32_t xa;
        memcpy(&xa, (SIGNS ? (const uint8_t *)x.q : x.qu) + (m0 + m) * K + 16 * h0 + 4 * k, 4);
        const __m256i xv = _mm256_set1_epi32(xa);
        for (int u = 0; u < TT; u++) {
          const __m256i pk = SIGNS ? _mm256_maddubs_epi16(wa[u], _mm256_sign_epi8(xv, wv[u]))
                                   : _mm256_maddubs_epi16(xv, wv[u]);
          s16[u][m] = k % N ? _mm256_add_epi16(s16[u][m], pk) : pk;
          if (k % N == N - 1) is[u][m] = _mm256_add_epi32(is[u][m], _mm256_madd_epi16(s16[u][m], ones));
        }
      }
    }
    for (int m = 0; m < MM; m++) {
      const __m256 xd = _mm256_set1_ps(x.d[(m0 + m) * G + h0 / 2]);
      for (int u = 0; u < TT; u++) {
        const int64_t at = (t + u) * H + h0;
        acc[u][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[u][m]), _mm256_mul_ps(_mm256_load_ps(&p.sw[at * 8]), xd), acc[u][m]);
        if (GemmSums<T>::MIN)
          for (int hh = 0; hh < HS; hh++)
            acc[u][m] = _mm256_fnmadd_ps(_mm256_load_ps(&p.mw[(at + hh) * 8]), _mm256_set1_ps(x.hs[(m0 + m) * H + h0 + hh]),
                                         acc[u][m]);
      }
    }
  }
  for (int u = 0; u < TT; u++)
    for (int m = 0; m < MM; m++) {
      float *o = y + (m0 + m) * ldy + 8 * u;
      const int64_t left = n - 8 * u;
      if (left >= 8) {
        _mm256_storeu_ps(o, acc[u][m]);
      } else {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[u][m]);
        memcpy(o, v, left * sizeof(float));
      }
    }
}

// Tiles t .. t + TT - 1 against every activation row of the group, two rows at a time.
template <class T, int TT, int M>
static ALWAYS_INLINE void gemm_tiles(const GemmPack<8> &p, int64_t t, const XQ &x, float *y, int64_t ldy, int64_t n) {
  UNROLL for (int m0 = 0; m0 < M; m0 += 2) {
    if (m0 + 1 < M) gemm_tile<T, TT, 2>(p, t, x, m0, y, ldy, n);
    else gemm_tile<T, TT, 1>(p, t, x, m0, y, ldy, n);
  }
}

template <class T, int M>
static void gemm_rows(const uint8_t *w, int64_t ldw, int64_t r0, int64_t r1, const XQ &x, float *y, int64_t ldy) {
  const GemmPack<8> &p = gemm_pack<T, 8, GemmSums<T>::C>(w, ldw, r0, r1, x.K);
  const int64_t tiles = (r1 - r0 + 7) / 8;
  int64_t t = 0;
  for (; t + 1 < tiles; t += 2) gemm_tiles<T, 2, M>(p, t, x, y + r0 + 8 * t, ldy, r1 - r0 - 8 * t);
  if (t < tiles) gemm_tiles<T, 1, M>(p, t, x, y + r0 + 8 * t, ldy, r1 - r0 - 8 * t);
}
#endif
#endif  // TK_GEMM


template <class T, int M>
static void chunk(const void *p, int64_t c) {
  const Ctx *g = (const Ctx *)p;
  int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
  if constexpr (KBlock<T>::OK) {  // their activations come in blocks of 256 (XQ::k), a prompt's in groups of 32
#if TK_GEMM
    if (g->gemm) return gemm_rows<KVisit<T>, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);  // every k-quant
#endif
#if TK_GEMV_512 && defined(__AVX512VNNI__)
    return rowsk512<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
#endif
    rowsk<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
  } else {
#if TK_GEMM
    if constexpr (gemm_takes<T>())
      if (g->gemm) return gemm_rows<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
#endif
#if TK_GEMV_512
#if defined(__AVX512VNNI__)
    if constexpr (Pairs2<T>::OK && M >= Pairs2<T>::FROM)
      if (g->x.K % 64 == 0) return rows512x2<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
#endif
    if (g->x.K % 64 == 0) return rows512<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
#endif
    if constexpr (Step<T>::OK) return rows8<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
    rows<T, M>(g->w, g->ldw, r0, r1, g->x, g->y, g->ldy);
  }
}
}  // namespace i8
#endif
