// The 1- to 4-bit GGML weight types of issue 19: IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0.
//
// Each type decodes one block into int8 codes q (QK) and one float scale per 16 codes s
// (QK/16), the weights being s*q exactly: the grid types' magnitudes with their signs, IQ1's
// -1/0/1 grid plus its +-1/8 delta as 8*g +- 1 over a scale of dl/8, the 4-bit types' table
// values. The block-dot kernels (qmatmul.cpp, gemv_avx2.h) then treat these codes as they
// treat Q8_0's, so every instruction path gets every type; the block never leaves the stack.
//
// The grids and value tables are data that Python hands over once per loaded library
// (tk_lowbit_table, from tightkv.gguf.quants, which takes the grids from gguf-py); a type
// whose tables are missing is refused (tk_lowbit_ready).
#pragma once
#include "common.h"

namespace lowbit {
typedef int8_t B16 __attribute__((vector_size(16)));  // 16 int8 lanes (SSE2, NEON, or scalar)
typedef uint8_t U16 __attribute__((vector_size(16)));
typedef int8_t B8 __attribute__((vector_size(8)));

// Tables, in the order of tightkv.gguf.quants.KERNEL_TABLES.
struct Tables {
  uint64_t iq2xxs[256], iq2xs[512], iq2s[1024];  // 8 magnitudes per entry
  uint32_t iq3xxs[256], iq3s[512];               // 4 magnitudes per entry
  uint64_t iq1s[2048];                           // 8 values of -8, 0, 8 per entry (the grid times 8)
  int8_t iq4[16], fp4[16];                       // kvalues_iq4nl, kvalues_mxfp4
  float ue4m3[256];                              // NVFP4 scales, halved
};
static Tables tab;
static unsigned loaded;       // bit i: table i was given
static uint64_t sign8[256];   // a sign byte -> 8 bytes, 0xFF where its bit is set
static uint64_t ksign8[128];  // a 7-bit sign index (ksigns_iq2xs: even parity) -> the same

static void init_signs() {
  for (int b = 0; b < 256; b++) {
    uint64_t m = 0;
    for (int i = 0; i < 8; i++)
      if (b >> i & 1) m |= (uint64_t)0xFF << (8 * i);
    sign8[b] = m;
  }
  for (int i = 0; i < 128; i++) ksign8[i] = sign8[i | (__builtin_popcount(i) & 1) << 7];
}

// Table `which` from Python: 0 iq2xxs .. 5 iq1s grids as int8 (entries, width), 6 iq4,
// 7 fp4 as int8, 8 ue4m3 as float32. Returns 0, or 1 for a wrong size or number.
static int set_table(int which, const void *data, int64_t nbytes) {
  void *dst[] = {tab.iq2xxs, tab.iq2xs, tab.iq2s, tab.iq3xxs, tab.iq3s, tab.iq1s, tab.iq4, tab.fp4, tab.ue4m3};
  const int64_t size[] = {sizeof tab.iq2xxs, sizeof tab.iq2xs, sizeof tab.iq2s, sizeof tab.iq3xxs, sizeof tab.iq3s,
                          sizeof tab.iq1s, sizeof tab.iq4, sizeof tab.fp4, sizeof tab.ue4m3};
  if (which < 0 || which > 8 || nbytes != size[which]) return 1;
  if (!sign8[1]) init_signs();
  memcpy(dst[which], data, nbytes);
  if (which == 5)
    for (auto &g : tab.iq1s) {
      B8 v;
      memcpy(&v, &g, 8);
      v = v * (int8_t)8;
      memcpy(&g, &v, 8);
    }
  loaded |= 1u << which;
  return 0;
}

// 8 int8 magnitudes g with the bytes under mask m negated, stored at q.
static ALWAYS_INLINE void signed8(int8_t *q, uint64_t g, uint64_t m) {
  B8 a, b;
  memcpy(&a, &g, 8);
  memcpy(&b, &m, 8);
  a = (a ^ b) - b;  // b = -1 in negated lanes: (a ^ -1) + 1 = -a
  memcpy(q, &a, 8);
}

// 16 nibble bytes p -> 32 int8 values lut[nibble]: the low nibbles, then the high ones.
static ALWAYS_INLINE void lut_nibbles16(const uint8_t *p, const int8_t *lut, int8_t *q) {
#if defined(__SSSE3__)
  const __m128i t = _mm_loadu_si128((const __m128i *)lut), v = _mm_loadu_si128((const __m128i *)p);
  const __m128i m = _mm_set1_epi8(15);
  _mm_storeu_si128((__m128i *)q, _mm_shuffle_epi8(t, _mm_and_si128(v, m)));
  _mm_storeu_si128((__m128i *)(q + 16), _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
#else
  for (int j = 0; j < 16; j++) q[j] = lut[p[j] & 15], q[j + 16] = lut[p[j] >> 4];
#endif
}

static ALWAYS_INLINE void fill(float *s, int n, float v) {
  for (int i = 0; i < n; i++) s[i] = v;
}

// Each type: QK, TS, the tables it needs (bit mask), and decode(block, q[QK], s[QK/16]).
struct Q1_0 {
  enum { QK = 128, TS = 18, NEED = 0 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    fill(s, 8, h2f(b));
    for (int j = 0; j < 16; j++) {  // bit set: +1, else -1
      B8 v;
      const uint64_t m = ~sign8[b[2 + j]] & 0xFEFEFEFEFEFEFEFEull;  // 0xFE where -1 (0xFF = 0x01 ^ 0xFE)
      memcpy(&v, &m, 8);
      v = v ^ (int8_t)1;
      memcpy(q + 8 * j, &v, 8);
    }
  }
};
struct Q2_0 {
  enum { QK = 64, TS = 18, NEED = 0 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    fill(s, 4, h2f(b));
    for (int j = 0; j < 64; j++) q[j] = (int8_t)(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1);
  }
};
struct TQ2_0 {
  enum { QK = 256, TS = 66, NEED = 0 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    fill(s, 16, h2f(b + 64));
    for (int h = 0; h < 2; h++)
      for (int u = 0; u < 2; u++) {
        U16 v;
        memcpy(&v, b + 32 * h + 16 * u, 16);
        for (int k = 0; k < 4; k++) {  // element 128h + 32k + 16u + j = bits 2k of byte 32h + 16u + j
          const B16 c = (B16)((v >> (2 * k)) & 3) - (int8_t)1;
          memcpy(q + 128 * h + 32 * k + 16 * u, &c, 16);
        }
      }
  }
};
struct TQ1_0 {
  enum { QK = 256, TS = 54, NEED = 0 };
  // byte x holds 5 base-3 digits as x = ceil(n * 256 / 243); digit k is ((x * 3^k mod 256) * 3) >> 8
  static ALWAYS_INLINE void digits(const uint8_t *x, int n, int ndig, int8_t *q) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int k = 0; k < ndig; k++)
      for (int j = 0; j < n; j++) q[k * n + j] = (int8_t)((((uint8_t)(x[j] * pow3[k]) * 3) >> 8) - 1);
  }
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    fill(s, 16, h2f(b + 52));
    digits(b, 32, 5, q);
    digits(b + 32, 16, 5, q + 160);
    digits(b + 48, 4, 4, q + 240);
  }
};
struct IQ4_NL {
  enum { QK = 32, TS = 18, NEED = 1 << 6 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    fill(s, 2, h2f(b));
    lut_nibbles16(b + 2, tab.iq4, q);
  }
};
struct IQ4_XS {
  enum { QK = 256, TS = 136, NEED = 1 << 6 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    const int sh = b[2] | b[3] << 8;
    for (int ib = 0; ib < 8; ib++) {
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
      s[2 * ib] = s[2 * ib + 1] = d * (float)(ls - 32);
      lut_nibbles16(b + 8 + 16 * ib, tab.iq4, q + 32 * ib);
    }
  }
};
struct MXFP4 {
  enum { QK = 32, TS = 17, NEED = 1 << 7 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;  // 2^(e - 128)
    float d;
    memcpy(&d, &bits, 4);
    fill(s, 2, d);
    lut_nibbles16(b + 1, tab.fp4, q);
  }
};
struct NVFP4 {
  enum { QK = 64, TS = 36, NEED = 1 << 7 | 1 << 8 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    for (int k = 0; k < 4; k++) {
      s[k] = tab.ue4m3[b[k]];
      for (int j = 0; j < 8; j++) {  // sub-block k: low nibbles are its values 0..7, high ones 8..15
        const uint8_t x = b[4 + 8 * k + j];
        q[16 * k + j] = tab.fp4[x & 15], q[16 * k + 8 + j] = tab.fp4[x >> 4];
      }
    }
  }
};
struct IQ2_XXS {
  enum { QK = 256, TS = 66, NEED = 1 << 0 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t *p = b + 2 + 8 * ib;  // 4 grid indices, then a u32: 4 x 7 sign bits, 4 scale bits
      const uint32_t aux = u32(p + 4);
      s[2 * ib] = s[2 * ib + 1] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; l++) signed8(q + 32 * ib + 8 * l, tab.iq2xxs[p[l]], ksign8[(aux >> (7 * l)) & 127]);
    }
  }
};
struct IQ2_XS {
  enum { QK = 256, TS = 74, NEED = 1 << 1 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    for (int k = 0; k < 16; k++) s[k] = d * (0.5f + (float)((b[66 + k / 2] >> (4 * (k % 2))) & 15)) * 0.25f;
    for (int g = 0; g < 32; g++) {
      const int v = b[2 + 2 * g] | b[3 + 2 * g] << 8;  // 9-bit grid index, 7-bit sign index
      signed8(q + 8 * g, tab.iq2xs[v & 511], ksign8[v >> 9]);
    }
  }
};
struct IQ2_S {
  enum { QK = 256, TS = 82, NEED = 1 << 2 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *sg = b + 34, *qh = b + 66, *sc = b + 74;
    for (int k = 0; k < 16; k++) s[k] = d * (0.5f + (float)((sc[k / 2] >> (4 * (k % 2))) & 15)) * 0.25f;
    for (int g = 0; g < 32; g++)
      signed8(q + 8 * g, tab.iq2s[qs[g] | ((qh[g / 4] >> (2 * (g % 4))) & 3) << 8], sign8[sg[g]]);
  }
};
struct IQ3_XXS {
  enum { QK = 256, TS = 98, NEED = 1 << 3 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
      const uint32_t aux = u32(b + 66 + 4 * ib);  // 4 x 7 sign bits, 4 scale bits
      s[2 * ib] = s[2 * ib + 1] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; l++) {
        const uint8_t *i = qs + 8 * ib + 2 * l;
        signed8(q + 32 * ib + 8 * l, tab.iq3xxs[i[0]] | (uint64_t)tab.iq3xxs[i[1]] << 32, ksign8[(aux >> (7 * l)) & 127]);
      }
    }
  }
};
struct IQ3_S {
  enum { QK = 256, TS = 110, NEED = 1 << 4 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *sg = b + 74, *sc = b + 106;
    for (int ib = 0; ib < 8; ib++) s[2 * ib] = s[2 * ib + 1] = d * (float)(1 + 2 * ((sc[ib / 2] >> (4 * (ib % 2))) & 15));
    for (int g = 0; g < 32; g++) {
      const int i0 = qs[2 * g] | ((qh[g / 4] >> (2 * (g % 4))) & 1) << 8;
      const int i1 = qs[2 * g + 1] | ((qh[g / 4] >> (2 * (g % 4) + 1)) & 1) << 8;
      signed8(q + 8 * g, tab.iq3s[i0] | (uint64_t)tab.iq3s[i1] << 32, sign8[sg[g]]);
    }
  }
};
// 8 grid values times 8, plus 1 or minus 1 (the delta's sign), stored at q.
static ALWAYS_INLINE void iq1_group(int8_t *q, int idx, int neg) {
  B8 v;
  memcpy(&v, &tab.iq1s[idx], 8);
  const int8_t c = neg ? -1 : 1;
  v += B8{c, c, c, c, c, c, c, c};
  memcpy(q, &v, 8);
}
struct IQ1_S {
  enum { QK = 256, TS = 50, NEED = 1 << 5 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
      const int qh = b[34 + 2 * ib] | b[35 + 2 * ib] << 8;  // 4 x 3 high index bits, 3 scale bits, delta sign
      s[2 * ib] = s[2 * ib + 1] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
      for (int l = 0; l < 4; l++) iq1_group(q + 32 * ib + 8 * l, qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8, qh >> 15);
    }
  }
};
struct IQ1_M {
  enum { QK = 256, TS = 56, NEED = 1 << 5 };
  static ALWAYS_INLINE void decode(const uint8_t *b, int8_t *q, float *s) {
    const uint8_t *qs = b, *qh = b + 32, *sc = b + 48;
    uint16_t w[4];
    memcpy(w, sc, 8);
    const uint16_t dh = (w[0] >> 12) | ((w[1] >> 8) & 0xF0) | ((w[2] >> 4) & 0xF00) | (w[3] & 0xF000);
    const float d = h2f((const uint8_t *)&dh);
    for (int k = 0; k < 16; k++) s[k] = d * (float)(2 * ((w[k / 4] >> (3 * (k % 4))) & 7) + 1) * 0.125f;
    for (int g = 0; g < 32; g++) {  // 8 values: 3 high index bits and the delta's sign in a nibble of qh
      const int h = qh[g / 2] >> (4 * (g % 2));
      iq1_group(q + 8 * g, qs[g] | (h & 7) << 8, h & 8);
    }
  }
};
}  // namespace lowbit

// The kernels' view of a decoded type: blocks.h's 16-element visitor (float paths) ...
template <class D>
struct Decoded {
  enum { QK = D::QK, TS = D::TS, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    alignas(64) int8_t q[QK];
    float s[QK / 16];
    D::decode(b, q, s);
    UNROLL for (int e = 0; e < QK; e += 16) f(e, cvt(ld_i8((const uint8_t *)q + e)), s[e / 16], 0.f);
  }
};
#define LOWBIT_TYPES(X) X(IQ4_NL) X(IQ4_XS) X(Q1_0) X(Q2_0) X(TQ1_0) X(TQ2_0) X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) \
  X(IQ3_XXS) X(IQ3_S) X(IQ1_S) X(IQ1_M) X(MXFP4) X(NVFP4)
#define LOWBIT_FLOAT(T) struct T : Decoded<lowbit::T> {};
LOWBIT_TYPES(LOWBIT_FLOAT)

// ... and gemv_avx2.h's 32-element one (int8 activations).
#if TK_GEMV_I8
namespace i8 {
template <class D>
struct Decoded {
  enum { QK = D::QK, TS = D::TS, SIGNED = 1, MIN = 0 };
  template <class F> static ALWAYS_INLINE void visit(const uint8_t *b, F &&f) {
    alignas(64) int8_t q[QK];
    float s[QK / 16];
    D::decode(b, q, s);
    UNROLL for (int e = 0; e < QK; e += 32) f(e, ld256((const uint8_t *)q + e), s[e / 16], s[e / 16 + 1], 0.f, 0.f);
  }
};
#define LOWBIT_I8(T) struct T : Decoded<lowbit::T> {};
LOWBIT_TYPES(LOWBIT_I8)
}  // namespace i8
#endif
