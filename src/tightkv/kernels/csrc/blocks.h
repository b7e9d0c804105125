// GGML weight blocks, decoded 16 elements at a time (see simd.h for the vectors).
#pragma once
#include "simd.h"

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

