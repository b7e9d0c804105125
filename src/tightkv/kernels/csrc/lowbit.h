// The 1- to 4-bit GGML weight types of issue 19: IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0.
//
// Each type walks its block 32 weights at a time, in registers: f(e, q0, q1, s0, s1) gets
// weights e..e+15 as int8 codes q0 (16 lanes) times the float scale s0, and e+16..e+31 as
// q1 times s1, exactly (s*q rounds once, as gguf-py's product does): the grid types'
// magnitudes with their signs, IQ1's -1/0/1 grid plus its +-1/8 delta as 8*g +- 1 over a
// scale of dl/8, the 4-bit types' table values. The block-dot kernels then use these codes
// as they use Q8_0's (adapters at the end), so every instruction path gets every type.
//
// The grids and value tables are data that Python hands over once per loaded library
// (tk_lowbit_table, from tightkv.gguf.quants, which takes the grids from gguf-py); a type
// whose tables are missing is refused (tk_lowbit_ready).
#pragma once
#include "simd.h"

namespace lowbit {
typedef int8_t B16 __attribute__((vector_size(16)));  // 16 int8 lanes (SSE2, NEON, or scalar)
typedef uint8_t U16 __attribute__((vector_size(16)));
typedef uint64_t W2 __attribute__((vector_size(16)));
typedef uint32_t W4 __attribute__((vector_size(16)));

// Tables, in the order of tightkv.gguf.quants.kernel_tables().
struct Tables {
  uint64_t iq2xxs[256], iq2xs[512], iq2s[1024];  // 8 magnitudes per entry
  uint32_t iq3xxs[256], iq3s[512];               // 4 magnitudes per entry
  uint64_t iq1s[2048];                           // 8 values of -8, 0, 8 per entry (the grid times 8)
  int8_t iq4[16], fp4[16];                       // kvalues_iq4nl, kvalues_mxfp4
  float ue4m3[256];                              // NVFP4 scales, halved
};
// One copy in the library for every translation unit that includes this header (C++17 inline
// variables), not exported from it.
#define LIBRARY_GLOBAL inline __attribute__((visibility("hidden")))
LIBRARY_GLOBAL Tables tab;
LIBRARY_GLOBAL unsigned loaded;       // bit i: table i was given
LIBRARY_GLOBAL uint64_t sign8[256];   // a sign byte -> 8 bytes, 0xFF where its bit is set
LIBRARY_GLOBAL uint8_t ksign[128];    // a 7-bit sign index -> 8 sign bits, the 8th giving even parity (ksigns_iq2xs)
LIBRARY_GLOBAL uint32_t crumbs[256];  // a byte -> its 4 2-bit fields as bytes, low bits first

static void init_derived() {
  for (int b = 0; b < 256; b++) {
    uint64_t m = 0;
    for (int i = 0; i < 8; i++)
      if (b >> i & 1) m |= (uint64_t)0xFF << (8 * i);
    sign8[b] = m;
    crumbs[b] = (b & 3) | (b >> 2 & 3) << 8 | (b >> 4 & 3) << 16 | (uint32_t)(b >> 6) << 24;
  }
  for (int i = 0; i < 128; i++) ksign[i] = (uint8_t)(i | (__builtin_popcount(i) & 1) << 7);
}

// Table `which` from Python: 0 iq2xxs .. 5 iq1s grids as int8 (entries, width), 6 iq4,
// 7 fp4 as int8, 8 ue4m3 as float32. Returns 0, or 1 for a wrong size or number.
static int set_table(int which, const void *data, int64_t nbytes) {
  void *dst[] = {tab.iq2xxs, tab.iq2xs, tab.iq2s, tab.iq3xxs, tab.iq3s, tab.iq1s, tab.iq4, tab.fp4, tab.ue4m3};
  const int64_t size[] = {sizeof tab.iq2xxs, sizeof tab.iq2xs, sizeof tab.iq2s, sizeof tab.iq3xxs, sizeof tab.iq3s,
                          sizeof tab.iq1s, sizeof tab.iq4, sizeof tab.fp4, sizeof tab.ue4m3};
  if (which < 0 || which > 8 || nbytes != size[which]) return 1;
  if (!sign8[1]) init_derived();
  memcpy(dst[which], data, nbytes);
  if (which == 5)
    for (auto &g : tab.iq1s) {
      uint64_t v = 0;
      for (int i = 0; i < 8; i++) v |= (uint64_t)(uint8_t)(int8_t)(8 * (int8_t)(g >> (8 * i))) << (8 * i);
      g = v;
    }
  loaded |= 1u << which;
  return 0;
}

static ALWAYS_INLINE B16 from64(uint64_t lo, uint64_t hi) { return (B16)(W2){lo, hi}; }
static ALWAYS_INLINE B16 from32(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return (B16)(W4){a, b, c, d}; }
static ALWAYS_INLINE B16 load16(const uint8_t *p) { B16 v; memcpy(&v, p, 16); return v; }
static ALWAYS_INLINE B16 splat(int8_t c) { return B16{c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c}; }
// g with lane i negated where bit i of `bits` is set
static ALWAYS_INLINE B16 negate_where(B16 g, unsigned bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return (B16)_mm_mask_sub_epi8((__m128i)g, (__mmask16)bits, _mm_setzero_si128(), (__m128i)g);
#else
  const B16 m = from64(sign8[bits & 255], sign8[(bits >> 8) & 255]);  // -1 in negated lanes
  return (g ^ m) - m;
#endif
}
// the sign bits of two 7-bit sign indices
static ALWAYS_INLINE unsigned ksigns(unsigned a, unsigned b) { return ksign[a & 127] | ksign[b & 127] << 8; }

// 16 codes 0..15 -> lut[code]
static ALWAYS_INLINE B16 lut16(B16 idx, const int8_t *lut) {
#if defined(__SSSE3__)
  return (B16)_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)lut), (__m128i)idx);
#elif defined(__ARM_NEON)
  return (B16)vqtbl1q_s8(vld1q_s8(lut), vandq_u8((uint8x16_t)idx, vdupq_n_u8(15)));
#else
  B16 out;
  for (int i = 0; i < 16; i++) out[i] = lut[idx[i] & 15];
  return out;
#endif
}
// 16 nibble bytes -> f(lut[low nibbles] (weights 0..15), lut[high nibbles] (16..31))
static ALWAYS_INLINE void nibbles(const uint8_t *p, const int8_t *lut, B16 *lo, B16 *hi) {
  const U16 v = (U16)load16(p);
  *lo = lut16((B16)(v & 15), lut);
  *hi = lut16((B16)(v >> 4), lut);
}

// Each type: QK, TS, NEED (the tables it needs, a bit mask) and visit(block, f).
struct Q1_0 {
  enum { QK = 128, TS = 18, NEED = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const B16 one = splat(1);
    UNROLL for (int e = 0; e < 128; e += 32) {  // bit set: +1, else -1
      const uint8_t *p = b + 2 + e / 8;
      f(e, negate_where(one, ~(p[0] | p[1] << 8)), negate_where(one, ~(p[2] | p[3] << 8)), d, d);
    }
  }
};
struct Q2_0 {
  enum { QK = 64, TS = 18, NEED = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const B16 one = splat(1);
    UNROLL for (int e = 0; e < 64; e += 32) {  // weight j: bits 2(j%4) of byte j/4
      const uint8_t *p = b + 2 + e / 4;
      f(e, from32(crumbs[p[0]], crumbs[p[1]], crumbs[p[2]], crumbs[p[3]]) - one,
        from32(crumbs[p[4]], crumbs[p[5]], crumbs[p[6]], crumbs[p[7]]) - one, d, d);
    }
  }
};
struct TQ2_0 {
  enum { QK = 256, TS = 66, NEED = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b + 64);
    const B16 one = splat(1);
    UNROLL for (int h = 0; h < 2; h++) {  // weight 128h + 32k + j: bits 2k of byte 32h + j
      const U16 v0 = (U16)load16(b + 32 * h), v1 = (U16)load16(b + 32 * h + 16);
      UNROLL for (int k = 0; k < 4; k++)
        f(128 * h + 32 * k, (B16)((v0 >> (2 * k)) & 3) - one, (B16)((v1 >> (2 * k)) & 3) - one, d, d);
    }
  }
};
struct TQ1_0 {
  enum { QK = 256, TS = 54, NEED = 0 };
  // bytes x hold base-3 digits as x = ceil(n * 256 / 243); digit k is ((x * 3^k mod 256) * 3) >> 8
  static ALWAYS_INLINE B16 digit(U16 x, U16 pow3) {
    typedef uint16_t H16 __attribute__((vector_size(32)));
    const H16 t = (__builtin_convertvector((U16)(x * pow3), H16) * 3) >> 8;
    return __builtin_convertvector(t, B16) - splat(1);
  }
  static ALWAYS_INLINE U16 u8s(uint8_t c) { return (U16)splat((int8_t)c); }
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b + 52);
    const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const U16 a0 = (U16)load16(b), a1 = (U16)load16(b + 16), c = (U16)load16(b + 32);
    UNROLL for (int k = 0; k < 5; k++) f(32 * k, digit(a0, u8s(pow3[k])), digit(a1, u8s(pow3[k])), d, d);
    // 160 + 16k + j: digit k of byte 32 + j; 240 + 4k + j: digit k of byte 48 + j
    f(160, digit(c, u8s(1)), digit(c, u8s(3)), d, d);
    f(192, digit(c, u8s(9)), digit(c, u8s(27)), d, d);
    const uint32_t h = u32(b + 48);
    const U16 hp = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
    f(224, digit(c, u8s(81)), digit((U16)from32(h, h, h, h), hp), d, d);
  }
};
struct IQ4_NL {
  enum { QK = 32, TS = 18, NEED = 1 << 6 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    B16 lo, hi;
    nibbles(b + 2, tab.iq4, &lo, &hi);
    f(0, lo, hi, d, d);
  }
};
struct IQ4_XS {
  enum { QK = 256, TS = 136, NEED = 1 << 6 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const int sh = b[2] | b[3] << 8;
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
      const float s = d * (float)(ls - 32);
      B16 lo, hi;
      nibbles(b + 8 + 16 * ib, tab.iq4, &lo, &hi);
      f(32 * ib, lo, hi, s, s);
    }
  }
};
struct MXFP4 {
  enum { QK = 32, TS = 17, NEED = 1 << 7 };
  static ALWAYS_INLINE float e8m0(uint8_t e) {  // 2^(e - 128)
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    return d;
  }
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = e8m0(b[0]);
    B16 lo, hi;
    nibbles(b + 1, tab.fp4, &lo, &hi);
    f(0, lo, hi, d, d);
  }
};
struct NVFP4 {
  enum { QK = 64, TS = 36, NEED = 1 << 7 | 1 << 8 };
  // sub-block k: the low nibbles of its 8 bytes are its weights 0..7, the high ones 8..15
  static ALWAYS_INLINE B16 sub(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    const U16 v = (U16)from64(w, w >> 4);
    return lut16((B16)(v & 15), tab.fp4);
  }
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    f(0, sub(b + 4), sub(b + 12), tab.ue4m3[b[0]], tab.ue4m3[b[1]]);
    f(32, sub(b + 20), sub(b + 28), tab.ue4m3[b[2]], tab.ue4m3[b[3]]);
  }
};
// IQ2: two groups of 8 magnitudes (g0, g1) with their 16 sign bits -> 16 codes
static ALWAYS_INLINE B16 signed16(uint64_t g0, uint64_t g1, unsigned bits) { return negate_where(from64(g0, g1), bits); }
struct IQ2_XXS {
  enum { QK = 256, TS = 66, NEED = 1 << 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *p = b + 2 + 8 * ib;  // 4 grid indices, then a u32: 4 x 7 sign bits, 4 scale bits
      const uint32_t aux = u32(p + 4);
      const float s = d * (0.5f + (float)(aux >> 28)) * 0.25f;
      const uint64_t *g = tab.iq2xxs;
      f(32 * ib, signed16(g[p[0]], g[p[1]], ksigns(aux, aux >> 7)), signed16(g[p[2]], g[p[3]], ksigns(aux >> 14, aux >> 21)),
        s, s);
    }
  }
};
struct IQ2_XS {
  enum { QK = 256, TS = 74, NEED = 1 << 1 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    uint16_t v[32];  // 9-bit grid index, 7-bit sign index
    memcpy(v, b + 2, 64);
    const uint64_t *g = tab.iq2xs;
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const int sc = b[66 + ib];
      const uint16_t *w = v + 4 * ib;
      f(32 * ib, signed16(g[w[0] & 511], g[w[1] & 511], ksigns(w[0] >> 9, w[1] >> 9)),
        signed16(g[w[2] & 511], g[w[3] & 511], ksigns(w[2] >> 9, w[3] >> 9)),
        d * (0.5f + (float)(sc & 15)) * 0.25f, d * (0.5f + (float)(sc >> 4)) * 0.25f);
    }
  }
};
struct IQ2_S {
  enum { QK = 256, TS = 82, NEED = 1 << 2 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *sg = b + 34, *qh = b + 66, *sc = b + 74;
    const uint64_t *g = tab.iq2s;
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *i = qs + 4 * ib, *m = sg + 4 * ib;
      const int h = qh[ib];  // 2 high index bits per group of 8
      f(32 * ib, signed16(g[i[0] | (h & 3) << 8], g[i[1] | (h & 12) << 6], m[0] | m[1] << 8),
        signed16(g[i[2] | (h & 48) << 4], g[i[3] | (h & 192) << 2], m[2] | m[3] << 8),
        d * (0.5f + (float)(sc[ib] & 15)) * 0.25f, d * (0.5f + (float)(sc[ib] >> 4)) * 0.25f);
    }
  }
};
struct IQ3_XXS {
  enum { QK = 256, TS = 98, NEED = 1 << 3 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const uint32_t *g = tab.iq3xxs;
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *i = b + 2 + 8 * ib;
      const uint32_t aux = u32(b + 66 + 4 * ib);  // 4 x 7 sign bits, 4 scale bits
      const float s = d * (0.5f + (float)(aux >> 28)) * 0.5f;
      f(32 * ib,
        negate_where(from32(g[i[0]], g[i[1]], g[i[2]], g[i[3]]), ksigns(aux, aux >> 7)),
        negate_where(from32(g[i[4]], g[i[5]], g[i[6]], g[i[7]]), ksigns(aux >> 14, aux >> 21)),
        s, s);
    }
  }
};
struct IQ3_S {
  enum { QK = 256, TS = 110, NEED = 1 << 4 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *sg = b + 74, *sc = b + 106;
    const uint32_t *g = tab.iq3s;
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *i = qs + 8 * ib, *m = sg + 4 * ib;
      const int h = qh[ib];  // the 9th index bit of each of the 8 entries
      const float s = d * (float)(1 + 2 * ((sc[ib / 2] >> (4 * (ib % 2))) & 15));
      f(32 * ib,
        negate_where(from32(g[i[0] | (h & 1) << 8], g[i[1] | (h & 2) << 7], g[i[2] | (h & 4) << 6], g[i[3] | (h & 8) << 5]),
                     m[0] | m[1] << 8),
        negate_where(from32(g[i[4] | (h & 16) << 4], g[i[5] | (h & 32) << 3], g[i[6] | (h & 64) << 2],
                            g[i[7] | (h & 128) << 1]),
                     m[2] | m[3] << 8),
        s, s);
    }
  }
};
// IQ1: two groups of 8 grid values (times 8) plus their deltas' signs: 8g + 1 or 8g - 1
static ALWAYS_INLINE B16 iq1_16(int i0, int i1, int neg0, int neg1) {
  const int8_t a = neg0 ? -1 : 1, c = neg1 ? -1 : 1;
  return from64(tab.iq1s[i0], tab.iq1s[i1]) + B16{a, a, a, a, a, a, a, a, c, c, c, c, c, c, c, c};
}
struct IQ1_S {
  enum { QK = 256, TS = 50, NEED = 1 << 5 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const float d = h2f(b);
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *i = b + 2 + 4 * ib;
      const int qh = b[34 + 2 * ib] | b[35 + 2 * ib] << 8;  // 4 x 3 high index bits, 3 scale bits, delta sign
      const float s = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
      const int neg = qh >> 15;
      f(32 * ib, iq1_16(i[0] | (qh & 7) << 8, i[1] | (qh & 0x38) << 5, neg, neg),
        iq1_16(i[2] | (qh & 0x1C0) << 2, i[3] | (qh & 0xE00) >> 1, neg, neg), s, s);
    }
  }
};
struct IQ1_M {
  enum { QK = 256, TS = 56, NEED = 1 << 5 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    const uint8_t *qs = b, *qh = b + 32;
    uint16_t w[4];  // 4 x 3-bit scales each; their top nibbles together hold d
    memcpy(w, b + 48, 8);
    const uint16_t dh = (w[0] >> 12) | ((w[1] >> 8) & 0xF0) | ((w[2] >> 4) & 0xF00) | (w[3] & 0xF000);
    const float d = h2f((const uint8_t *)&dh);
    UNROLL for (int ib = 0; ib < 8; ib++) {
      const uint8_t *i = qs + 4 * ib;
      const int h0 = qh[2 * ib], h1 = qh[2 * ib + 1];  // per 8 weights: 3 high index bits and the delta's sign
      const int sc = w[ib / 2] >> (6 * (ib % 2));
      f(32 * ib, iq1_16(i[0] | (h0 & 7) << 8, i[1] | (h0 & 0x70) << 4, h0 & 8, h0 & 0x80),
        iq1_16(i[2] | (h1 & 7) << 8, i[3] | (h1 & 0x70) << 4, h1 & 8, h1 & 0x80),
        d * (float)(2 * (sc & 7) + 1) * 0.125f, d * (float)(2 * ((sc >> 3) & 7) + 1) * 0.125f);
    }
  }
};

// 16 int8 codes -> the 16 int32 lanes of simd.h's VI
static ALWAYS_INLINE VI widen(B16 q) {
#if defined(__AVX512F__)
  return _mm512_cvtepi8_epi32((__m128i)q);
#elif defined(__AVX2__) && defined(__FMA__)
  return {_mm256_cvtepi8_epi32((__m128i)q), _mm256_cvtepi8_epi32(_mm_srli_si128((__m128i)q, 8))};
#else
  return __builtin_convertvector(q, VI);
#endif
}
}  // namespace lowbit

// The kernels' view of a type: blocks.h's 16-weight visitor (float paths) ...
template <class D>
struct Lowbit {
  enum { QK = D::QK, TS = D::TS, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    D::visit(b, [&](int e, lowbit::B16 q0, lowbit::B16 q1, float s0, float s1) ALWAYS_INLINE_LAMBDA {
      f(e, cvt(lowbit::widen(q0)), s0, 0.f);
      f(e + 16, cvt(lowbit::widen(q1)), s1, 0.f);
    });
  }
};
#define LOWBIT_TYPES(X) X(IQ4_NL) X(IQ4_XS) X(Q1_0) X(Q2_0) X(TQ1_0) X(TQ2_0) X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) \
  X(IQ3_XXS) X(IQ3_S) X(IQ1_S) X(IQ1_M) X(MXFP4) X(NVFP4)
#define LOWBIT_FLOAT(T) struct T : Lowbit<lowbit::T> {};
LOWBIT_TYPES(LOWBIT_FLOAT)

// ... and gemv_avx2.h's 32-weight one (int8 activations).
#if TK_GEMV_I8
namespace i8 {
template <class D>
struct Lowbit {
  enum { QK = D::QK, TS = D::TS, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    D::visit(b, [&](int e, lowbit::B16 q0, lowbit::B16 q1, float s0, float s1) ALWAYS_INLINE_LAMBDA {
#if TK_GEMV_AVX2
      f(e, _mm256_set_m128i((__m128i)q1, (__m128i)q0), s0, s1, 0.f, 0.f);
#else
      f(e, G32{(int8x16_t)q0, (int8x16_t)q1}, s0, s1, 0.f, 0.f);
#endif
    });
  }
};
#define LOWBIT_I8(T) struct T : Lowbit<lowbit::T> {};
LOWBIT_TYPES(LOWBIT_I8)
#if TK_GEMV_AVX2
// gemv_avx2.h's 256-weight steps (`rows8`, prefetching) for the types whose codes come
// from their bytes or grids; Q2_0, NVFP4 and IQ1_S take `rows` (IQ1_S's step measured 0.7x of it).
// 16 nibble bytes -> t[low nibbles] (weights 0..15), t[high nibbles] (16..31)
static ALWAYS_INLINE __m256i table32(const int8_t *t, const uint8_t *p) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)), nibbles(p));
}
template <>
struct Step<IQ4_NL> {
  enum { OK = 1, BLOCKS = 8, PER16 = 0, SIGNED = 1 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int n, __m256 *s, __m256 *mn) { s[0] = h2f8(b, 18, n); mn[0] = _mm256_setzero_ps(); }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) { return table32(lowbit::tab.iq4, b + 18 * i + 2); }
};
template <>
struct Step<MXFP4> {
  enum { OK = 1, BLOCKS = 8, PER16 = 0, SIGNED = 1 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int n, __m256 *s, __m256 *mn) {
    alignas(32) int32_t e[8];  // 2^(e - 128) as lowbit::MXFP4::e8m0, 8 at once; lanes n.. zero
    for (int i = 0; i < 8; i++) e[i] = i < n ? b[17 * i] : 0;
    const __m256i ev = _mm256_load_si256((const __m256i *)e), one = _mm256_set1_epi32(1);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(ev, one), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ev);  // e < 2
    const __m256i bits = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), ev));
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    s[0] = _mm256_castsi256_ps(_mm256_and_si256(bits, live));
    mn[0] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) { return table32(lowbit::tab.fp4, b + 17 * i + 1); }
};
template <>
struct Step<IQ4_XS> {
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 1 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    // group i: 4 low bits from nibble i of bytes 4..7, 2 high bits from bits 2i of bytes 2..3
    const __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)u32(b + 4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(b[2] | b[3] << 8), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    const __m256i m15 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3);
    const __m256i ls = _mm256_or_si256(_mm256_and_si256(lo, m15), _mm256_slli_epi32(_mm256_and_si256(hi, m3), 4));
    s[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))), _mm256_set1_ps(h2f(b)));
    mn[0] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) { return table32(lowbit::tab.iq4, b + 8 + 16 * i); }
};
template <>
struct Step<TQ2_0> {  // codes 0..2 for q + 1
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 0 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) { s[0] = mn[0] = _mm256_set1_ps(h2f(b + 64)); }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {  // weight 128h + 32k + j: bits 2k of byte 32h + j
    return and8(_mm256_srli_epi16(ld256(b + 32 * (i / 4)), 2 * (i % 4)), 3);
  }
};
// TQ1_0: base-3 digits of bytes x, (x * 3^k mod 256) * 3 >> 8, with a power per 16-bit word
static ALWAYS_INLINE __m256i trits(__m256i x, __m256i pw) {
  const __m256i three = _mm256_set1_epi16(3);
  const __m256i lo = _mm256_mulhi_epu16(_mm256_mullo_epi16(_mm256_slli_epi16(x, 8), pw), three);
  const __m256i hi = _mm256_mulhi_epu16(_mm256_mullo_epi16(_mm256_and_si256(x, _mm256_set1_epi16((short)0xFF00)), pw), three);
  return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 8));
}
static ALWAYS_INLINE __m256i words2(short a, short b) { return _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a)); }
template <>
struct Step<TQ1_0> {  // codes 0..2 for q + 1
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 0 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) { s[0] = mn[0] = _mm256_set1_ps(h2f(b + 52)); }
  // weights 32k + j: digit k of byte j (k < 5); 160 + 16k + j: digit k of byte 32 + j; 240 + 4k + j: of byte 48 + j
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    static const short pow3[5] = {1, 3, 9, 27, 81};
    if (i < 5) return trits(ld256(b), _mm256_set1_epi16(pow3[i]));
    const __m128i c = _mm_loadu_si128((const __m128i *)(b + 32));
    if (i < 7) return trits(_mm256_set_m128i(c, c), i == 5 ? words2(1, 3) : words2(9, 27));
    const __m256i hp = _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27);
    return trits(_mm256_set_m128i(_mm_set1_epi32((int)u32(b + 48)), c), hp);
  }
};
// The grid types: magnitudes gathered by index (SIGNED 2: signs apart), IQ1's signed values
// 8g +- 1 (SIGNED 1). Scales per 32 weights, or per 16 (PER16) as nibbles.
static ALWAYS_INLINE uint32_t ksigns4(uint32_t a) {  // four 7-bit sign indices (bits 0..27) -> 32 sign bits
  using lowbit::ksign;
  return ksign[a & 127] | ksign[a >> 7 & 127] << 8 | ksign[a >> 14 & 127] << 16 | (uint32_t)ksign[a >> 21 & 127] << 24;
}
static ALWAYS_INLINE __m256i grid4(const uint64_t *g, int a, int b, int c, int d) { return _mm256_setr_epi64x(g[a], g[b], g[c], g[d]); }
template <class I>
static ALWAYS_INLINE __m256i grid8x4(const uint32_t *g, I &&ix) {
  return _mm256_setr_epi32(g[ix(0)], g[ix(1)], g[ix(2)], g[ix(3)], g[ix(4)], g[ix(5)], g[ix(6)], g[ix(7)]);
}
static ALWAYS_INLINE __m256 per32(const int32_t *v, float d) {  // 8 ints times d
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)v)), _mm256_set1_ps(d));
}
// IQ2_XXS / IQ3_XXS: the top nibble x of 8 words `stride` bytes apart from p -> d * (2x + 1)
static ALWAYS_INLINE __m256 odd_scales(const uint8_t *p, int stride, float d) {
  int32_t v[8];
  for (int i = 0; i < 8; i++) v[i] = 2 * (int32_t)(u32(p + stride * i) >> 28) + 1;
  return per32(v, d);
}
// IQ2_XS / IQ2_S: 8 scale bytes at p, a nibble per 16 weights (low first) -> d * (0.5 + nibble) / 4
static ALWAYS_INLINE void iq2_scales(const uint8_t *p, float d, __m256 *s) {
  const __m128i v = _mm_loadl_epi64((const __m128i *)p), m4 = _mm_set1_epi8(15);
  const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
  const __m256 half = _mm256_set1_ps(0.5f), dq = _mm256_set1_ps(0.25f * d);
  s[0] = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib)), half), dq);
  s[1] = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8))), half), dq);
}
template <>
struct Step<IQ2_XXS> {  // per 32: 4 grid indices, then a u32 of 4 x 7 sign bits and 4 scale bits
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 2 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    s[0] = odd_scales(b + 6, 8, 0.125f * h2f(b));  // d (0.5 + x) / 4 = d (2x + 1) / 8
    mn[0] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const uint8_t *p = b + 2 + 8 * i;
    return grid4(lowbit::tab.iq2xxs, p[0], p[1], p[2], p[3]);
  }
  static ALWAYS_INLINE __m256i signs(const uint8_t *b, int i) { return sign_bytes(ksigns4(u32(b + 6 + 8 * i))); }
};
template <>
struct Step<IQ2_XS> {  // per 8 weights a word: a 9-bit grid index, a 7-bit sign index
  enum { OK = 1, BLOCKS = 1, PER16 = 1, SIGNED = 2 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    iq2_scales(b + 66, h2f(b), s);
    mn[0] = mn[1] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    uint16_t w[4];
    memcpy(w, b + 2 + 8 * i, 8);
    return grid4(lowbit::tab.iq2xs, w[0] & 511, w[1] & 511, w[2] & 511, w[3] & 511);
  }
  static ALWAYS_INLINE __m256i signs(const uint8_t *b, int i) {
    uint16_t w[4];
    memcpy(w, b + 2 + 8 * i, 8);
    using lowbit::ksign;
    return sign_bytes(ksign[w[0] >> 9] | ksign[w[1] >> 9] << 8 | ksign[w[2] >> 9] << 16 | (uint32_t)ksign[w[3] >> 9] << 24);
  }
};
template <>
struct Step<IQ2_S> {  // per 32: 4 index bytes with 2 high bits each from qh, 32 sign bits
  enum { OK = 1, BLOCKS = 1, PER16 = 1, SIGNED = 2 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    iq2_scales(b + 74, h2f(b), s);
    mn[0] = mn[1] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const uint8_t *q = b + 2 + 4 * i;
    const int h = b[66 + i];
    return grid4(lowbit::tab.iq2s, q[0] | (h & 3) << 8, q[1] | (h & 12) << 6, q[2] | (h & 48) << 4, q[3] | (h & 192) << 2);
  }
  static ALWAYS_INLINE __m256i signs(const uint8_t *b, int i) { return sign_bytes(u32(b + 34 + 4 * i)); }
};
template <>
struct Step<IQ3_XXS> {  // per 32: 8 grid indices; a u32 of 4 x 7 sign bits and 4 scale bits
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 2 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    s[0] = odd_scales(b + 66, 4, 0.25f * h2f(b));  // d (0.5 + x) / 2 = d (2x + 1) / 4
    mn[0] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const uint8_t *q = b + 2 + 8 * i;
    return grid8x4(lowbit::tab.iq3xxs, [&](int j) ALWAYS_INLINE_LAMBDA { return q[j]; });
  }
  static ALWAYS_INLINE __m256i signs(const uint8_t *b, int i) { return sign_bytes(ksigns4(u32(b + 66 + 4 * i))); }
};
template <>
struct Step<IQ3_S> {  // per 32: 8 index bytes with a 9th bit each from qh, 32 sign bits; a scale nibble
  enum { OK = 1, BLOCKS = 1, PER16 = 0, SIGNED = 2 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u32(b + 106)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                         _mm256_set1_epi32(15));
    const __m256i odd = _mm256_add_epi32(_mm256_slli_epi32(nib, 1), _mm256_set1_epi32(1));
    s[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(odd), _mm256_set1_ps(h2f(b)));
    mn[0] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const uint8_t *q = b + 2 + 8 * i;
    const int h = b[66 + i];
    return grid8x4(lowbit::tab.iq3s, [&](int j) ALWAYS_INLINE_LAMBDA { return q[j] | (h >> j & 1) << 8; });
  }
  static ALWAYS_INLINE __m256i signs(const uint8_t *b, int i) { return sign_bytes(u32(b + 74 + 4 * i)); }
};
// IQ1: four grid entries (times 8) plus their deltas, +1 or -1 per 8 weights
static ALWAYS_INLINE __m256i iq1_codes(int a, int b, int c, int d, bool na, bool nb, bool nc, bool nd) {
  const uint64_t one = 0x0101010101010101ull, minus = 0xFFFFFFFFFFFFFFFFull;
  const __m256i delta = _mm256_setr_epi64x(na ? minus : one, nb ? minus : one, nc ? minus : one, nd ? minus : one);
  return _mm256_add_epi8(grid4(lowbit::tab.iq1s, a, b, c, d), delta);
}
template <>
struct Step<IQ1_M> {  // per 8 weights: an index byte, 3 high index bits and the delta's sign; 3-bit scales per 16
  enum { OK = 1, BLOCKS = 1, PER16 = 1, SIGNED = 1 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int, __m256 *s, __m256 *mn) {
    uint16_t w[4];  // 4 x 3-bit scales each; their top nibbles together hold d
    memcpy(w, b + 48, 8);
    const uint16_t dh = (w[0] >> 12) | ((w[1] >> 8) & 0xF0) | ((w[2] >> 4) & 0xF00) | (w[3] & 0xF000);
    const float d = 0.125f * h2f((const uint8_t *)&dh);
    int32_t v[16];  // 16 weights u of group u / 2: bits 6 (u / 2 % 2) + 3 (u % 2) of w[u / 4]
    for (int u = 0; u < 16; u++) v[u] = 2 * ((w[u / 4] >> (6 * (u / 2 % 2) + 3 * (u % 2))) & 7) + 1;
    s[0] = per32(v, d);
    s[1] = per32(v + 8, d);
    mn[0] = mn[1] = _mm256_setzero_ps();
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) {
    const uint8_t *q = b + 4 * i;
    const int h0 = b[32 + 2 * i], h1 = b[33 + 2 * i];
    return iq1_codes(q[0] | (h0 & 7) << 8, q[1] | (h0 & 0x70) << 4, q[2] | (h1 & 7) << 8, q[3] | (h1 & 0x70) << 4,
                     h0 & 8, h0 & 0x80, h1 & 8, h1 & 0x80);
  }
};
template <>
struct Step<Q1_0> {  // codes 16 (bit set) or 0 over a scale of d / 8, less d: +-d
  enum { OK = 1, BLOCKS = 2, PER16 = 0, SIGNED = 0 };
  static ALWAYS_INLINE void scales(const uint8_t *b, int n, __m256 *s, __m256 *mn) {
    const float d0 = h2f(b), d1 = n > 4 ? h2f(b + 18) : 0.f;
    mn[0] = _mm256_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1);
    s[0] = _mm256_mul_ps(mn[0], _mm256_set1_ps(0.125f));
  }
  static ALWAYS_INLINE __m256i codes(const uint8_t *b, int i) { return bit16s(u32(b + 18 * (i / 4) + 2 + 4 * (i % 4))); }
};
#if TK_GEMV_512
// gemv_avx2.h's Wide loads. 4-bit table types: one shuffle through the table taken as t + 128.
static ALWAYS_INLINE __m512i table_pair(const int8_t *t, const uint8_t *pa, const uint8_t *pb) {
  const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
  return _mm512_shuffle_epi8(_mm512_xor_si512(lut, _mm512_set1_epi8((char)0x80)), nibbles2(pa, pb));
}
template <>
struct Wide<IQ4_NL> {
  enum { OK = 1, NP = 1, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    qu[0] = table_pair(lowbit::tab.iq4, b + 2, b + 20);
    s[0] = scales2(b, b + 18);
  }
};
template <>
struct Wide<MXFP4> {
  enum { OK = 1, NP = 1, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    qu[0] = table_pair(lowbit::tab.fp4, b + 1, b + 18);
    s[0] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(lowbit::MXFP4::e8m0(b[0])), _mm512_set1_ps(lowbit::MXFP4::e8m0(b[17])));
  }
};
template <>
struct Wide<IQ4_XS> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    uint32_t lo4;  // scale ib: the low 4 bits from nibble ib of these 4 bytes, 2 high bits from sh
    memcpy(&lo4, b + 4, 4);
    const uint64_t lo = _pdep_u64(lo4, 0x0F0F0F0F0F0F0F0Full), hi = _pdep_u64(b[2] | b[3] << 8, 0x3030303030303030ull);
    const __m128i ls = _mm_sub_epi8(_mm_cvtsi64_si128((long long)(lo | hi)), _mm_set1_epi8(32));
    const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ls)), _mm512_set1_ps(h2f(b)));  // per 32 (lanes 0-7)
    UNROLL for (int p = 0; p < 4; p++) {
      qu[p] = table_pair(lowbit::tab.iq4, b + 8 + 32 * p, b + 24 + 32 * p);
      s[p] = spread<3>(sc, p);
    }
  }
};
template <>
struct Wide<Q1_0> {
  enum { OK = 1, NP = 2, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const __m512 d = _mm512_set1_ps(h2f(b));
    UNROLL for (int p = 0; p < 2; p++) {  // bit set: +1 (129), else -1 (127)
      uint64_t bits;
      memcpy(&bits, b + 2 + 8 * p, 8);
      qu[p] = _mm512_mask_blend_epi8(bits, _mm512_set1_epi8(127), _mm512_set1_epi8((char)129));
      s[p] = d;
    }
  }
};
// The grid types: a pair's grid entries gathered by index, their signs as one 64-bit mask
// (q + 128 = 128 - |q| where set), IQ1's +-1 delta added per 8 or 32 weights.
static ALWAYS_INLINE __m512i signed_pair(__m512i mag, uint64_t neg) {
  const __m512i base = _mm512_set1_epi8((char)0x80);
  return _mm512_mask_sub_epi8(_mm512_add_epi8(base, mag), neg, base, mag);
}
// four 7-bit sign indices in each of a and b (bits 0..27) -> 64 sign bits, each byte's 8th bit
// its even parity (ksigns_iq2xs)
static ALWAYS_INLINE uint64_t ksigns64(uint32_t a, uint32_t b) {
  const uint64_t v = _pdep_u64(a, 0x7F7F7F7Full) | _pdep_u64(b, 0x7F7F7F7Full) << 32;
  uint64_t t = v ^ (v >> 4);
  t ^= t >> 2;
  t ^= t >> 1;
  return v | (t & 0x0101010101010101ull) << 7;
}
// grid entries g[ix(0)], g[ix(1)], ... in 128-bit pieces (faster here than a gather, or than one 512-bit set)
static ALWAYS_INLINE __m512i join4(__m128i a, __m128i b, __m128i c, __m128i d) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(b, a)), _mm256_set_m128i(d, c), 1);
}
template <class I>
static ALWAYS_INLINE __m512i grid8(const uint64_t *g, I &&ix) {
  __m128i v[4];
  UNROLL for (int k = 0; k < 4; k++) v[k] = _mm_set_epi64x((long long)g[ix(2 * k + 1)], (long long)g[ix(2 * k)]);
  return join4(v[0], v[1], v[2], v[3]);
}
// entry j: g[i[j] | (bit j of h) << 8]
static ALWAYS_INLINE __m512i grid16(const uint32_t *g, const uint8_t *i, int h) {
  __m128i v[4];
  UNROLL for (int k = 0; k < 4; k++) {
    const int j = 4 * k;
    v[k] = _mm_setr_epi32(g[i[j] | (h >> j & 1) << 8], g[i[j + 1] | (h >> (j + 1) & 1) << 8],
                          g[i[j + 2] | (h >> (j + 2) & 1) << 8], g[i[j + 3] | (h >> (j + 3) & 1) << 8]);
  }
  return join4(v[0], v[1], v[2], v[3]);
}
// the IQ2 scales of a block, per 16 weights: d * (0.5 + the nibbles of 8 bytes at p, low first) / 4
static ALWAYS_INLINE __m512 iq2_scales16(const uint8_t *p, float d) {
  const __m128i v = _mm_loadl_epi64((const __m128i *)p), m4 = _mm_set1_epi8(15);
  const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
  return _mm512_mul_ps(_mm512_add_ps(ubytes_ps(&nib), _mm512_set1_ps(0.5f)), _mm512_set1_ps(0.25f * d));
}
static ALWAYS_INLINE __m512 blend_halves(float a, float b) { return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b)); }
template <>
struct Wide<IQ2_XXS> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const float d = 0.25f * h2f(b);
    UNROLL for (int p = 0; p < 4; p++) {  // sub-blocks 2p, 2p + 1: 4 grid indices, then 4 x 7 sign bits and 4 scale bits
      const uint8_t *pa = b + 2 + 16 * p, *pb = pa + 8;
      const uint32_t aa = u32(pa + 4), ab = u32(pb + 4);
      qu[p] = signed_pair(grid8(lowbit::tab.iq2xxs, [&](int j) ALWAYS_INLINE_LAMBDA { return j < 4 ? pa[j] : pb[j - 4]; }), ksigns64(aa, ab));
      s[p] = blend_halves(d * (0.5f + (float)(aa >> 28)), d * (0.5f + (float)(ab >> 28)));
    }
  }
};
template <>
struct Wide<IQ2_XS> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const __m512 sc = iq2_scales16(b + 66, h2f(b));
    UNROLL for (int p = 0; p < 4; p++) {  // 8 words: a 9-bit grid index, a 7-bit sign index
      const uint8_t *w = b + 2 + 16 * p;
      uint64_t lo, hi;
      memcpy(&lo, w, 8);
      memcpy(&hi, w + 8, 8);
      const uint64_t m = 0xFE00FE00FE00FE00ull;
      const auto ix = [&](int j) ALWAYS_INLINE_LAMBDA { return (int)((j < 4 ? lo : hi) >> (16 * (j % 4)) & 511); };
      qu[p] = signed_pair(grid8(lowbit::tab.iq2xs, ix), ksigns64((uint32_t)_pext_u64(lo, m), (uint32_t)_pext_u64(hi, m)));
      s[p] = spread<2>(sc, p);
    }
  }
};
template <>
struct Wide<IQ2_S> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const __m512 sc = iq2_scales16(b + 74, h2f(b));
    UNROLL for (int p = 0; p < 4; p++) {  // entry j: index byte j | 2 high bits from qh, then 64 sign bits
      const int h = b[66 + 2 * p] | b[67 + 2 * p] << 8;
      const uint8_t *i = b + 2 + 8 * p;
      uint64_t sg;
      memcpy(&sg, b + 34 + 8 * p, 8);
      qu[p] = signed_pair(grid8(lowbit::tab.iq2s, [&](int j) ALWAYS_INLINE_LAMBDA { return i[j] | (h >> (2 * j) & 3) << 8; }), sg);
      s[p] = spread<2>(sc, p);
    }
  }
};
template <>
struct Wide<IQ3_XXS> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const float d = 0.5f * h2f(b);
    UNROLL for (int p = 0; p < 4; p++) {  // 16 grid indices, then per 32: 4 x 7 sign bits and 4 scale bits
      const uint32_t aa = u32(b + 66 + 8 * p), ab = u32(b + 70 + 8 * p);
      const uint8_t *i = b + 2 + 16 * p;
      const uint32_t *g = lowbit::tab.iq3xxs;  // (written out: grid16(g, i, 0) and join4 measured 40% slower, GCC spills)
      __m128i q4[4];
      UNROLL for (int k = 0; k < 4; k++) q4[k] = _mm_setr_epi32(g[i[4 * k]], g[i[4 * k + 1]], g[i[4 * k + 2]], g[i[4 * k + 3]]);
      const __m512i mag = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q4[1], q4[0])), _mm256_set_m128i(q4[3], q4[2]), 1);
      qu[p] = signed_pair(mag, ksigns64(aa, ab));
      s[p] = blend_halves(d * (0.5f + (float)(aa >> 28)), d * (0.5f + (float)(ab >> 28)));
    }
  }
};
template <>
struct Wide<IQ3_S> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const float d = h2f(b);
    UNROLL for (int p = 0; p < 4; p++) {  // entry j: index byte j | bit j of qh << 8; 64 sign bits; a scale nibble per 32
      const int h = b[66 + 2 * p] | b[67 + 2 * p] << 8;
      const uint8_t *i = b + 2 + 16 * p;
      uint64_t sg;
      memcpy(&sg, b + 74 + 8 * p, 8);
      qu[p] = signed_pair(grid16(lowbit::tab.iq3s, i, h), sg);
      const int sc = b[106 + p];
      s[p] = blend_halves(d * (float)(1 + 2 * (sc & 15)), d * (float)(1 + 2 * (sc >> 4)));
    }
  }
};
// IQ1: entry j's index byte | 3 high bits (h >> 4j' for the shifts given), its grid (times 8) + 128 +- 1
template <class I>
static ALWAYS_INLINE __m512i iq1_pair(I &&ix, __mmask8 neg) {
  const __m512i delta = _mm512_mask_blend_epi64(neg, _mm512_set1_epi8((char)129), _mm512_set1_epi8(127));
  return _mm512_add_epi8(grid8(lowbit::tab.iq1s, ix), delta);
}
template <>
struct Wide<IQ1_S> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    const float d = 0.125f * h2f(b);
    UNROLL for (int p = 0; p < 4; p++) {  // per 32: a word of 4 x 3 high index bits, 3 scale bits, the delta's sign
      const uint32_t h = u32(b + 34 + 4 * p);
      const uint8_t *i = b + 2 + 8 * p;
      const __mmask8 neg = (__mmask8)((h >> 15 & 1 ? 0x0F : 0) | (h >> 31 ? 0xF0 : 0));
      qu[p] = iq1_pair([&](int j) ALWAYS_INLINE_LAMBDA { return i[j] | (h >> (3 * (j % 4) + 16 * (j / 4)) & 7) << 8; }, neg);
      s[p] = blend_halves(d * (float)(2 * ((h >> 12) & 7) + 1), d * (float)(2 * ((h >> 28) & 7) + 1));
    }
  }
};
template <>
struct Wide<IQ1_M> {
  enum { OK = 1, NP = 4, SIGNED = 1, MIN = 0 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &) {
    uint64_t w;  // 16 3-bit scales (per 16 weights) in the low 12 bits of each word; the top nibbles hold d
    memcpy(&w, b + 48, 8);
    const uint16_t dh = (uint16_t)_pext_u64(w, 0xF000F000F000F000ull);
    const uint64_t s3 = _pext_u64(w, 0x0FFF0FFF0FFF0FFFull);
    const __m128i sv = _mm_set_epi64x((long long)_pdep_u64(s3 >> 24, 0x0707070707070707ull),
                                      (long long)_pdep_u64(s3, 0x0707070707070707ull));
    const __m512 sc = _mm512_mul_ps(_mm512_add_ps(_mm512_mul_ps(ubytes_ps(&sv), _mm512_set1_ps(2.f)), _mm512_set1_ps(1.f)),
                                    _mm512_set1_ps(0.125f * h2f((const uint8_t *)&dh)));
    UNROLL for (int p = 0; p < 4; p++) {  // a nibble per entry: 3 high index bits, the delta's sign
      const uint32_t h = u32(b + 32 + 4 * p);
      const uint8_t *i = b + 8 * p;
      qu[p] = iq1_pair([&](int j) ALWAYS_INLINE_LAMBDA { return i[j] | (h >> (4 * j) & 7) << 8; }, (__mmask8)_pext_u32(h, 0x88888888u));
      s[p] = spread<2>(sc, p);
    }
  }
};
// TQ1_0: base-3 digits of bytes x, (x * 3^k mod 256) * 3 >> 8, for 64 bytes with a power per word
static ALWAYS_INLINE __m512i trits(__m512i x, __m512i pw) {
  const __m512i three = _mm512_set1_epi16(3);
  const __m512i lo = _mm512_mulhi_epu16(_mm512_mullo_epi16(_mm512_slli_epi16(x, 8), pw), three);
  const __m512i hi = _mm512_mulhi_epu16(_mm512_mullo_epi16(_mm512_and_si512(x, _mm512_set1_epi16((short)0xFF00)), pw), three);
  return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 8));
}
static ALWAYS_INLINE __m512i words4(short a, short b, short c, short d) {  // a per 128 bits
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))),
                            _mm256_set_m128i(_mm_set1_epi16(d), _mm_set1_epi16(c)), 1);
}
template <>
struct Wide<TQ1_0> {
  enum { OK = 1, NP = 4, SIGNED = 0, MIN = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &mn) {
    const __m512 d = _mm512_set1_ps(h2f(b + 52));
    mn = d;  // codes 0..2 for q + 1
    // weights 32k + j: digit k of byte j (k < 5); 160 + 16k + j: digit k of byte 32 + j; 240 + 4k + j: of byte 48 + j
    const __m256i a = ld256(b);
    const __m128i c = _mm_loadu_si128((const __m128i *)(b + 32)), h = _mm_set1_epi32((int)u32(b + 48));
    const __m512i aa = _mm512_broadcast_i64x4(a);
    qu[0] = trits(aa, words4(1, 1, 3, 3));
    qu[1] = trits(aa, words4(9, 9, 27, 27));
    qu[2] = trits(_mm512_inserti64x4(_mm512_castsi256_si512(a), _mm256_set_m128i(c, c), 1), words4(81, 81, 1, 3));
    const __m512i hp = _mm512_inserti64x4(words4(9, 27, 81, 1),
                                          _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27), 1);
    qu[3] = trits(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(c, c)), _mm256_set_m128i(h, c), 1), hp);
    UNROLL for (int p = 0; p < 4; p++) s[p] = d;
  }
};
template <>
struct Wide<TQ2_0> {
  enum { OK = 1, NP = 4, SIGNED = 0, MIN = 1 };
  static ALWAYS_INLINE void load(const uint8_t *b, __m512i *qu, __m512 *s, __m512 &mn) {
    const __m512 d = _mm512_set1_ps(h2f(b + 64));
    mn = d;  // codes 0..2 for q + 1
    UNROLL for (int p = 0; p < 4; p++) {  // weight 128h + 32k + j: bits 2k of byte 32h + j
      qu[p] = fields2(b + 32 * (p / 2), 4 * (p % 2), 4 * (p % 2) + 2, 3);
      s[p] = d;
    }
  }
};
#endif
#endif  // TK_GEMV_AVX2
}  // namespace i8
#endif
