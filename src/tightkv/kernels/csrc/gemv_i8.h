// What the integer block dots share on every instruction set (gemv_avx2.h, gemv_neon.h):
// the quantized activation rows, a call's context, and the k-quants' scale unpacking.
#pragma once
#include "blocks.h"

namespace i8 {
// The same rows for the k-quants, as llama.cpp's Q8_K (`rowsk`): int8 in blocks of 256, one
// float scale each, and the sum of each 16 codes as int16; null where no k-quant takes them.
struct XK {
  const int8_t *q;
  const float *d;     // (M, K/256)
  const int16_t *bs;  // (M, K/16)
};

// Activation rows quantized in groups of 32: q (M, K) int8, d (M, K/32) scales,
// hs (M, K/16) the dequantized sums of each 16 (for the mins); on AVX-512 also
// d8 (M, K/64, 32): per pair of groups, each scale spread over 8 lanes (two groups
// fill a register), then 32 * scale * the sum of each 16 over its 4 lanes (the
// offset of weights taken as unsigned w + 128, `rows512`).
struct XQ {
  const int8_t *q;
  const float *d, *hs, *d8;
  int64_t K;
  XK k;
  const uint8_t *qu;  // q + 128 as unsigned bytes, where a prompt takes `gemm_rows`; else null
};

struct Ctx {
  const uint8_t *w;
  int64_t ldw, N, rows;
  XQ x;
  float *y;
  int64_t ldy;  // y's row stride: the columns of every part of the product
  bool gemm;    // a prompt's call (GEMM_ROWS rows or more): `gemm_rows` where the type takes it
};

static inline float q3k_scale(const uint8_t *ls, const uint8_t *hs, int k, float d) {
  const int lo = k < 8 ? (ls[k] & 15) : (ls[k - 8] >> 4);
  const int hi = (hs[k % 4] >> (2 * (k / 4))) & 3;
  return d * (float)((int8_t)(lo | (hi << 4)) - 32);
}

// Q4_K and Q5_K's 12 bytes of 6-bit scales and mins -> 8 scale bytes, then 8 min bytes
static ALWAYS_INLINE void k_scale_bytes(const uint8_t *q, uint32_t u[4]) {
  memcpy(u, q, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);  // mins 4-7
  const uint32_t mins03 = u[1] & m6;
  u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);  // scales 4-7
  u[2] = mins03;
  u[0] &= m6;  // scales 0-3
}
// Q4_K, Q5_K, Q6_K: their shapes; `rowsk` reads their blocks (KBlock, per instruction set).
struct Q4_K {
  enum { QK = 256, TS = 144 };
};
struct Q5_K {
  enum { QK = 256, TS = 176 };
};
struct Q6_K {
  enum { QK = 256, TS = 210 };
};
}  // namespace i8
