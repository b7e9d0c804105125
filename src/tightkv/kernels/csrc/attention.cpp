// ---------------------------------------------------------------------------
// Fused attention over a KV cache for a few query rows (decode), straight from
// the stored format: dense f32/f16/bf16, q8_0/q4_0 blocks, tq4/tq3/tq2 codes, KVarN
// and KIVI codes (enum Kind). Block by block
// with an online softmax; nothing is materialized beyond one decoded vector.
//
// Queries: q (Hkv, R, D) float32 in the original domain, R = group * T rows per KV
// head, row r is query position t = r % T. Segments: each is a run of stored
// tokens of one format, in the exact domain (scores q.k) or the body's code domain
// (scores (q*kscale) R_k^T . k + q.kcenter, values summed in the code domain and
// mapped back once: (acc_c R_v) * vscale + l_c * vcenter). Each segment gives every
// query position t a visible index range [lo, hi).
// ---------------------------------------------------------------------------
#include <type_traits>
#include <vector>

#include "common.h"

namespace attn {
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

static inline f16v ld(const float *p) { f16v r; memcpy(&r, p, 64); return r; }
static inline void st(float *p, f16v a) { memcpy(p, &a, 64); }
static inline f16v splat(float a) { return f16v{} + a; }
// *p in every lane: one broadcast load on AVX-512 (splat adds a zero vector first)
static inline f16v bcast(const float *p) {
#if defined(__AVX512F__)
  return (f16v)_mm512_set1_ps(*p);
#else
  return splat(*p);
#endif
}
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TK_AVX2 1
static inline float hmax8(__m256 s) {
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}
// round to nearest (even), one instruction (lrintf is a library call)
static inline int rnd(float x) { return _mm_cvtss_si32(_mm_set_ss(x)); }
// codebook lookup of 8 codes (int32 lanes 0..15) in a 16-entry table held as two registers
static inline __m256 lut16(__m256i idx, __m256 cb0, __m256 cb1) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(cb0, idx), _mm256_permutevar8x32_ps(cb1, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}
#else
#define TK_AVX2 0
#endif
#if !TK_AVX2 && defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define TK_NEON 1
static inline int rnd(float x) { return (int)vcvtns_s32_f32(x); }  // round to nearest (even), as cvtss
#else
#define TK_NEON 0
#endif
// Integer paths for a few rows (decode steps, short verifications): 4-bit affine keys (KVarN,
// KIVI) and tq4 keys against int8 queries, and KVarN's 4-bit values against 7-bit weights;
// NEON's integer sums are AVX2's (see the NEON block below).
#define TK_I8_FEW (TK_AVX2 || TK_NEON)

// The 16-lane helpers below serve the AVX-512 and portable builds (the AVX2 build has its
// own loops in AVX2 registers).
static inline f16v fma(f16v a, f16v b, f16v c) {
#if defined(__AVX512F__)
  return (f16v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  return a * b + c;
#endif
}
static inline float hsum(f16v a) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)a);
#else
  float s = 0; for (int i = 0; i < 16; i++) s += a[i]; return s;
#endif
}
#if defined(__AVX512F__)
// hsum of 16 vectors at once: lane k of the result is hsum(v[k]) to the bit, each sum formed
// from the pairs _mm512_reduce_add_ps forms (halves of 8, of 4, then pairs 2 apart, then
// neighbours), in the same order; a + b == b + a exactly.
static inline __m512 hsum16(const __m512 *v) {
  __m512 t[8], u[4], w[2];
  for (int k = 0; k < 8; k++)  // lanes i + (i + 8): key k in quarters 0-1, key k + 8 in 2-3
    t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[k], v[k + 8], 0xEE), _mm512_shuffle_f32x4(v[k], v[k + 8], 0x44));
  for (int k = 0; k < 4; k++)  // + 4 apart: quarters hold keys k, k + 8, k + 4, k + 12
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[k], t[k + 4], 0x88), _mm512_shuffle_f32x4(t[k], t[k + 4], 0xDD));
  for (int k = 0; k < 2; k++)  // + 2 apart
    w[k] = _mm512_add_ps(_mm512_shuffle_ps(u[k], u[k + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[k], u[k + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), r);
}
#endif
static inline float hmax(f16v a) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps((__m512)a);
#else
  float s = a[0]; for (int i = 1; i < 16; i++) s = a[i] > s ? a[i] : s; return s;
#endif
}
static inline f16v ld_f16(const uint8_t *p) {
#if defined(__AVX512F__)
  return (f16v)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
  f16v r; for (int i = 0; i < 16; i++) { half_t h; memcpy(&h, p + 2 * i, 2); r[i] = (float)h; } return r;
#endif
}
static inline f16v ld_bf16(const uint8_t *p) {
  u16x16 h; memcpy(&h, p, 32);
  u16v w = __builtin_convertvector(h, u16v) << 16;
  return (f16v)w;
}
static inline f16v ld_i8(const uint8_t *p) {
  i8x16 b; memcpy(&b, p, 16);
  return __builtin_convertvector(__builtin_convertvector(b, i16v), f16v);
}
static inline float f16s(const uint8_t *p) { half_t h; memcpy(&h, p, 2); return (float)h; }

// exp for x <= 0 (and -inf): 2^n * p(f), |f| <= 1/2, relative error ~1e-7
static inline f16v vexp(f16v x) {
  const f16v lo = splat(-87.0f);
  f16v xc = x < lo ? lo : x;
  f16v t = xc * 1.44269504088896341f;
  f16v tr = t + (t >= 0 ? splat(0.5f) : splat(-0.5f));
  i16v n = __builtin_convertvector(tr, i16v);
  f16v f = (t - __builtin_convertvector(n, f16v)) * 0.69314718055994531f;
  f16v p = splat(1.0f / 5040);
  p = p * f + 1.0f / 720; p = p * f + 1.0f / 120; p = p * f + 1.0f / 24;
  p = p * f + 1.0f / 6; p = p * f + 0.5f; p = p * f + 1.0f; p = p * f + 1.0f;
  i16v bits = (n + 127) << 23;
  f16v r = p * (f16v)bits;
  return x < lo ? splat(0.0f) : r;
}

enum Kind {
  F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, TQ4 = 4, Q4_0 = 5,
  TQ3 = 6, TQ2 = 7,             // codebook codes like tq4's, in channel order
  AK4 = 8, AK3 = 9, AK2 = 10,   // affine key codes (KVarN, KIVI): x = (code * A[g] + B[g]) * m[t]
  AV4 = 11, AV3 = 12, AV2 = 13, // KVarN value codes: x = (code * a[t] + b[t]) * C[g]
  AB4 = 14, AB3 = 15, AB2 = 16, // KIVI value codes: x = code * a[t, c / G] + b[t, c / G], G = gcd(32, Dv)
  NKINDS = 17
};
// g: a group of tokens (a KVarN tile, a KIVI key group) that shares channel vectors.
constexpr int code_bits(int k) { return k == TQ4 ? 4 : k == TQ3 ? 3 : k == TQ2 ? 2 : k >= AK4 ? 4 - (k - AK4) % 3 : 0; }
constexpr bool is_cb(int k) { return k == TQ3 || k == TQ2; }
constexpr bool is_ak(int k) { return k >= AK4 && k <= AK2; }
constexpr bool is_av(int k) { return k >= AV4 && k <= AV2; }
constexpr bool is_ab(int k) { return k >= AB4 && k <= AB2; }
// kinds whose field 1 is a per-token multiplier of the dot product (keys) or of the weight (values)
constexpr bool has_mult(int k) { return k == TQ4 || is_cb(k) || is_ak(k) || is_av(k); }

struct Seg {
  int64_t kkind, vkind, body, unused;
  const uint8_t *k0, *k1;
  int64_t kh0, kt0, kh1, kt1;
  const uint8_t *v0, *v1;
  int64_t vh0, vt0, vh1, vt1;
  // fields 2 and 3 of each side: one row per kd2 / kd3 tokens (1: per token)
  const uint8_t *k2, *k3;
  int64_t kh2, kt2, kd2, kh3, kt3, kd3;
  const uint8_t *v2, *v3;
  int64_t vh2, vt2, vd2, vh3, vt3, vd3;
};
static_assert(sizeof(Seg) == 32 * 8, "segment descriptor");

// tk_attn's arguments. Queries q (Hkv, R, D) float32, R = group * T rows per KV head; per
// side the body's rotation (signs, Hadamard block hb; null: none), channel scale and centre
// (null: none); nseg segments and each query position's range in each, ranges (nseg, T, 2);
// the codebooks of codebook kinds (16 floats; null: none); tokens per chunk a thread claims
// in a decode step; the output (Hkv, R, Dv); per query head a sink logit that enters each
// row's softmax as one more score with no value (gpt-oss; null: none); steps (non-zero: each
// query position computed bit for bit as a decode step of that position alone computes it:
// a speculative verification; see tk_attn); threads. kernels/abi.py mirrors this struct,
// as it does Seg and enum Kind (tests/test_kernel_abi.py checks that they agree).
struct AttnArgs {
  const float *q;
  int64_t Hkv, R, T, D, Dv;
  const float *ksigns;
  int64_t khb;
  const float *kscale, *kcenter, *vsigns;
  int64_t vhb;
  const float *vscale, *vcenter;
  int64_t nseg;
  const Seg *segs;
  const int64_t *ranges;
  const float *kcb, *vcb;
  int64_t chunk_tokens;
  float *out;
  const float *sinks;
  int64_t steps;
  float scale;
  int32_t nth;
};
static_assert(sizeof(AttnArgs) == 24 * 8, "tk_attn's arguments");

struct Ctx {
  int64_t Hkv, R, T, D, Dv;
  const Seg *segs;
  const int64_t *ranges;  // (nseg, T, 2)
  // inputs: queries (Hkv, R, D), scale, and the body's rotation, scale and centre per side
  // rotations R = H diag(signs) / sqrt(hb) per block of hb channels (kv/rotation.py), or none
  const float *q, *ksigns, *kscale, *kcenter, *vsigns, *vscale, *vcenter;
  int64_t khb, vhb;
  float scale, kstep, vstep;  // kstep, vstep: the codebooks' int8 steps
  bool any_body, kperm, vperm;
  const int32_t *ksrc, *q8src, *vsrc;  // lane orders: code-domain query, int8 query, value sums
  float *qx, *qb, *bias;  // (Hkv, R, D) exact-domain and code-domain queries (scaled), (Hkv, R) bias
  f16v kcb, vcb;
  // int8 paths (tq4 with D % 128 == 0 on AVX-512 VNNI): per (head, row) int8 code-domain
  // query in nibble order, its byte sum and its float multiplier; codebooks as bytes
  bool i8k, i8v;
  bool i8ak, i8av;  // AVX2: 4-bit affine keys (KVarN, KIVI) and KVarN values in integers (D, Dv % 64 == 0)
  const int32_t *vch;  // (Dv) the channel in each lane of a body's value sums (see vsrc)
  int8_t *q8;
  int32_t *q8sum;
  float *q8mul;
  uint8_t klut[64], vlut[64];  // K: codebook / kstep + LUT_OFF (u8); V: codebook / vstep (s8)
  // chunks, and those of each (head, row tile) for the merge
  const int64_t *chunks;  // (nchunks, CH): seg, head, token start, end, row start, end, piece (steps: else -1)
  int64_t step;           // a steps call: tokens per piece, each row's pieces from its own first token
  const int64_t *poff;    // where each chunk's partial starts in part
  float *part;            // per chunk (rows, Dv + 2): acc, m, l
  const int64_t *row_chunks, *row_first;
  int64_t rt;  // rows per tile
  int64_t prow;  // rows per query position in a steps call (the path's choices follow them), else 0
  float *out;  // (Hkv, R, Dv)
  const float *sinks;  // (Hkv R / T) per query head, or null
};

static const int BT = 32;
#if defined(__AVX512F__)
#define TK_512 1  // few rows score keys decoded a block at a time (score_decoded)
#else
#define TK_512 0
#endif
static const int VROWS = TK_AVX2 ? 2 : 4;  // rows whose value sums stay in registers (2 x 4 x 16 lanes)
static const int ONCE_ROWS = 8;  // AVX-512, values decoded once: the same, 2 x 8 x 16 lanes (add_rows_decoded)
static const int CH = 7;
static const int64_t PRE_ROWS = 8;  // rows from which the float path scores a block by one matmul
// f(std::integral_constant<int, NR>()) for nr rows (1..4): the row count a kernel is built for.
template <class F>
static ALWAYS_INLINE void with_rows(int nr, F &&f) {
  switch (nr) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    default: f(std::integral_constant<int, 4>()); break;
  }
}
// tq4's integer keys: the u8 codebook's offset (VNNI: 8 bits; AVX2's maddubs: 7, so that no
// pair sum saturates int16; NEON takes AVX2's), and the channels per run of even, then odd
// channels in the int8 query (the code bytes one load splits into nibbles: 64 on AVX-512, 32
// on AVX2 and NEON)
static const int LUT_OFF = TK_I8_FEW ? 64 : 128;
static const int64_t Q8_RUN = TK_I8_FEW ? 64 : 128;

// Channel i of a group of 32 codes of BITS bits at p, packed as kv/bits.py does.
template <int BITS>
static inline int code_at(const uint8_t *p, int i) {
  if constexpr (BITS == 4) return (p[i / 2] >> (4 * (i % 2))) & 15;
  if constexpr (BITS == 2) return (p[i / 4] >> (2 * (i % 4))) & 3;
  const int g = i / 8;
  return (int)(((uint32_t)p[3 * g] | (uint32_t)p[3 * g + 1] << 8 | (uint32_t)p[3 * g + 2] << 16) >> (3 * (i % 8))) & 7;
}
#if defined(__AVX2__)
// Channels 8g .. 8g+7 of the same group as int32 lanes: the word that holds them
// broadcast, shifted per lane, masked.
template <int BITS, bool TAIL = false>
static inline __m256i codes8(const uint8_t *p, int g) {
  uint32_t w;
  __m256i sh;
  if constexpr (BITS == 4) {
    w = u32(p + 4 * g);
    sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  } else if constexpr (BITS == 2) {
    uint16_t h; memcpy(&h, p + 2 * g, 2);
    w = h;
    sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  } else {
    // never past the group's 12 bytes (a 16-channel tail's 6)
    w = g < (TAIL ? 1 : 3) ? u32(p + 3 * g) : u32(p + 3 * g - 1) >> 8;
    sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  }
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32((1 << BITS) - 1));
}
#endif

// Channels 32b .. 32b+31 of a stored vector as two float32 vectors (tq4: codebook
// values in the permuted order even|odd, the per-vector scale applied by the caller;
// other codes: in channel order, codebook values or the integer codes, AB dequantized
// with its per-block scale (p1) and zero (p2)).
#if defined(__AVX512F__)
// Channels 16h .. 16h+15 of a group of 32 codes of BITS bits at p as int32 lanes: the
// word that holds each 8 channels (4 bits, 3 bits) or 16 (2 bits) spread over its lanes,
// shifted per lane, masked. (GCC lowers byte-to-int vector conversions of the generic
// vector types element by element, so the AVX-512 build spells them out.)
template <int BITS>
static inline __m512i codes16(const uint8_t *p, int h) {
  __m512i w, sh;
  if constexpr (BITS == 4) {
    w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)u32(p + 8 * h))),
                           _mm256_set1_epi32((int)u32(p + 8 * h + 4)), 1);
    sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  } else if constexpr (BITS == 2) {
    w = _mm512_set1_epi32((int)u32(p + 4 * h));
    sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  } else {  // 3 bits: 8 channels in 3 bytes, never past the group's 12 bytes
    const uint32_t w0 = h ? u32(p + 6) : u32(p), w1 = h ? u32(p + 8) >> 8 : u32(p + 3);
    w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)w0)), _mm256_set1_epi32((int)w1), 1);
    sh = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
  }
  return _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32((1 << BITS) - 1));
}
#endif

template <int KIND>
static inline __attribute__((always_inline)) void load32(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                                         int64_t b, const f16v &cb, f16v &x0, f16v &x1) {
#if defined(__AVX512F__)
  if (KIND == F32) {
    x0 = ld((const float *)p0 + 32 * b); x1 = ld((const float *)p0 + 32 * b + 16);
  } else if (KIND == F16) {
    x0 = ld_f16(p0 + 64 * b); x1 = ld_f16(p0 + 64 * b + 32);
  } else if (KIND == BF16) {
    const __m512i h0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p0 + 64 * b)));
    const __m512i h1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p0 + 64 * b + 32)));
    x0 = (f16v)_mm512_slli_epi32(h0, 16); x1 = (f16v)_mm512_slli_epi32(h1, 16);
  } else if (KIND == Q8_0) {
    const __m512 d = _mm512_set1_ps(f16s(p1 + 2 * b));
    const uint8_t *p = p0 + 32 * b;
    x0 = (f16v)_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))), d);
    x1 = (f16v)_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16)))), d);
  } else if (KIND == Q4_0 || KIND == TQ4) {  // q4_0: low nibbles channels 0..15, high 16..31; tq4: the same lanes
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p0 + 16 * b)));
    const __m512i lo = _mm512_and_si512(c, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(c, 4);
    if (KIND == TQ4) {
      x0 = (f16v)_mm512_permutexvar_ps(lo, (__m512)cb);
      x1 = (f16v)_mm512_permutexvar_ps(hi, (__m512)cb);
    } else {
      const __m512 d = _mm512_set1_ps(f16s(p1 + 2 * b)), e = _mm512_set1_ps(8.0f);
      x0 = (f16v)_mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(lo), e), d);
      x1 = (f16v)_mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(hi), e), d);
    }
  } else {
    constexpr int B = code_bits(KIND);
    const uint8_t *p = p0 + 4 * B * b;
    const __m512i c0 = codes16<B>(p, 0), c1 = codes16<B>(p, 1);
    if constexpr (is_cb(KIND)) {
      x0 = (f16v)_mm512_permutexvar_ps(c0, (__m512)cb);
      x1 = (f16v)_mm512_permutexvar_ps(c1, (__m512)cb);
    } else {
      x0 = (f16v)_mm512_cvtepi32_ps(c0);
      x1 = (f16v)_mm512_cvtepi32_ps(c1);
    }
    if constexpr (is_ab(KIND)) {
      const __m512 d = _mm512_set1_ps(f16s(p1 + 2 * b)), z = _mm512_set1_ps(f16s(p2 + 2 * b));
      x0 = (f16v)_mm512_fmadd_ps((__m512)x0, d, z);
      x1 = (f16v)_mm512_fmadd_ps((__m512)x1, d, z);
    }
  }
#else
  if (KIND == F32) {
    x0 = ld((const float *)p0 + 32 * b); x1 = ld((const float *)p0 + 32 * b + 16);
  } else if (KIND == F16) {
    x0 = ld_f16(p0 + 64 * b); x1 = ld_f16(p0 + 64 * b + 32);
  } else if (KIND == BF16) {
    x0 = ld_bf16(p0 + 64 * b); x1 = ld_bf16(p0 + 64 * b + 32);
  } else if (KIND == Q8_0) {
    const f16v d = splat(f16s(p1 + 2 * b));
    x0 = ld_i8(p0 + 32 * b) * d; x1 = ld_i8(p0 + 32 * b + 16) * d;
  } else if (KIND == Q4_0) {  // llama.cpp's block: low nibbles channels 0..15, high 16..31
    const f16v d = splat(f16s(p1 + 2 * b));
    u8x16 by; memcpy(&by, p0 + 16 * b, 16);
    const i16v c = __builtin_convertvector(by, i16v);
    x0 = __builtin_convertvector((c & 15) - 8, f16v) * d;
    x1 = __builtin_convertvector((c >> 4) - 8, f16v) * d;
  } else if constexpr (KIND != TQ4) {
    constexpr int B = code_bits(KIND);
    const uint8_t *p = p0 + 4 * B * b;
    i16v c0, c1;
    for (int i = 0; i < 16; i++) { c0[i] = code_at<B>(p, i); c1[i] = code_at<B>(p, 16 + i); }
    if constexpr (is_cb(KIND)) {
      for (int i = 0; i < 16; i++) { x0[i] = cb[c0[i]]; x1[i] = cb[c1[i]]; }
    } else {
      x0 = __builtin_convertvector(c0, f16v);
      x1 = __builtin_convertvector(c1, f16v);
    }
    if constexpr (is_ab(KIND)) {
      const f16v d = splat(f16s(p1 + 2 * b)), z = splat(f16s(p2 + 2 * b));
      x0 = x0 * d + z;
      x1 = x1 * d + z;
    }
  } else {
    u8x16 by; memcpy(&by, p0 + 16 * b, 16);
    i16v c = __builtin_convertvector(by, i16v);
    i16v lo = c & 15, hi = (c >> 4) & 15;
    for (int i = 0; i < 16; i++) { x0[i] = cb[lo[i]]; x1[i] = cb[hi[i]]; }
  }
#endif
}

// Channels 16c .. 16c+15 of a stored vector as one float32 vector: the tail of a head dim
// that is an odd multiple of 16 (80: two 32-channel blocks, then this), or every group of
// KIVI values whose scales run per 16 channels (scale index si). tq4 lanes: the 8 low
// nibbles (even channels), then the 8 high ones. Plain vector code for the AVX-512 and
// portable builds alike; q8_0 and q4_0 never get here (their blocks are 32 channels).
template <int KIND>
static inline f16v load16(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, int64_t c, int64_t si,
                          const f16v &cb) {
  f16v x{};
  if constexpr (KIND == F32) {
    x = ld((const float *)p0 + 16 * c);
  } else if constexpr (KIND == F16) {
    x = ld_f16(p0 + 32 * c);
  } else if constexpr (KIND == BF16) {
    x = ld_bf16(p0 + 32 * c);
  } else if constexpr (KIND == TQ4) {
    const uint8_t *p = p0 + 8 * c;
    for (int i = 0; i < 8; i++) { x[i] = cb[p[i] & 15]; x[8 + i] = cb[p[i] >> 4]; }
  } else if constexpr (KIND != Q8_0 && KIND != Q4_0) {
    constexpr int B = code_bits(KIND);
    const uint8_t *p = p0 + 2 * B * c;
    for (int i = 0; i < 16; i++) x[i] = is_cb(KIND) ? cb[code_at<B>(p, i)] : (float)code_at<B>(p, i);
    if constexpr (is_ab(KIND)) x = x * f16s(p1 + 2 * si) + f16s(p2 + 2 * si);
  }
  return x;
}

template <int KIND>
static inline float vec_scale(const uint8_t *p1) { return has_mult(KIND) && p1 ? f16s(p1) : 1.0f; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TK_I8 1
// Lane k of the result = the sum of the 16 lanes of a[k].
static inline __m512i hsum16(const __m512i *a) {
  __m512i b[8], c[4], d[2];
  for (int i = 0; i < 8; i++)
    b[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                            _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; i++)
    c[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                            _mm512_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
  for (int i = 0; i < 2; i++)
    d[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0x88),
                            _mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(d[0], d[1], 0x88), _mm512_shuffle_i32x4(d[0], d[1], 0xDD));
}

// Integer dots of NR int8 query rows (D bytes apart; per 128 channels: the 64 even
// channels, then the 64 odd ones) with n <= 16 tq4 keys: each key's 64 code bytes per
// 128 channels split into low and high nibbles, mapped through the u8 codebook by
// one byte shuffle each, then multiplied by VNNI dot instructions.
template <int NR>
static inline __attribute__((always_inline)) void dots_tq4_i8(const int8_t *q8, const uint8_t *k0, int64_t kt0,
                                                              int64_t n, int64_t D, const uint8_t *lutp,
                                                              int32_t *dots /* (NR, 16) */) {
  const __m512i lut = _mm512_loadu_si512(lutp), m4 = _mm512_set1_epi8(15);
  __m512i acc[NR][16];
  for (int k = 0; k < 16; k++) {
    __m512i a[NR];
    for (int u = 0; u < NR; u++) a[u] = _mm512_setzero_si512();
    if (k < n) {
      const uint8_t *p = k0 + k * kt0;
      for (int64_t c = 0; c < D / 128; c++) {
        const __m512i by = _mm512_loadu_si512(p + 64 * c);
        const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(by, m4));
        const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(by, 4), m4));
        for (int u = 0; u < NR; u++) {
          a[u] = _mm512_dpbusd_epi32(a[u], lo, _mm512_loadu_si512(q8 + u * D + 128 * c));
          a[u] = _mm512_dpbusd_epi32(a[u], hi, _mm512_loadu_si512(q8 + u * D + 128 * c + 64));
        }
      }
    }
    for (int u = 0; u < NR; u++) acc[u][k] = a[u];
  }
  for (int u = 0; u < NR; u++) _mm512_storeu_si512(dots + 16 * u, hsum16(acc[u]));
}

// out rows (NR, W apart, lanes in the int8 value order) += sum_j w[u][j] v_j over n
// tq4 value vectors: weights quantized to u8 per row (scale max/255), four tokens'
// code bytes interleaved so that one VNNI instruction sums 4 tokens x 16 channels.
// Lane p = 128c + 32g + 16h + 4L + i holds channel 128c + 2(16L + 4g + i) + h.
template <int NR>
static inline __attribute__((always_inline)) void add_values_tq4_i8(float *o, int64_t W, const float *w,
                                                                   const uint8_t *v0, int64_t vt0, int64_t n,
                                                                   int64_t Dv, const uint8_t *lutp, float vstep) {
  static_assert(BT == 32, "two weight vectors per block");
  alignas(64) uint8_t wq[NR][BT];
  float wsc[NR];
  const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1),
                  m1 = (__mmask16)(n >= 32 ? 0xFFFF : n <= 16 ? 0 : (1u << (n - 16)) - 1);
  for (int u = 0; u < NR; u++) {  // weights >= 0 to u8, rounded, with the block's max at 255
    const __m512 w0 = _mm512_max_ps(_mm512_maskz_loadu_ps(m0, w + u * BT), _mm512_setzero_ps());
    const __m512 w1 = _mm512_max_ps(_mm512_maskz_loadu_ps(m1, w + u * BT + 16), _mm512_setzero_ps());
    const float mx = _mm512_reduce_max_ps(_mm512_max_ps(w0, w1));
    const __m512 inv = _mm512_set1_ps(mx > 0 ? 255.f / mx : 0.f);
    _mm_storeu_si128((__m128i *)wq[u], _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(w0, inv))));
    _mm_storeu_si128((__m128i *)(wq[u] + 16), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(w1, inv))));
    wsc[u] = mx / 255.f * vstep;
  }
  const __m512i lut = _mm512_loadu_si512(lutp), m4 = _mm512_set1_epi8(15);
  for (int64_t c = 0; c < Dv / 128; c++) {
    __m512i acc[NR][8];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 8; i++) acc[u][i] = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; j += 4) {
      __m512i t[4];
      for (int i = 0; i < 4; i++)
        t[i] = j + i < n ? _mm512_loadu_si512(v0 + (j + i) * vt0 + 64 * c) : _mm512_setzero_si512();
      const __m512i al = _mm512_unpacklo_epi8(t[0], t[1]), ah = _mm512_unpackhi_epi8(t[0], t[1]);
      const __m512i bl = _mm512_unpacklo_epi8(t[2], t[3]), bh = _mm512_unpackhi_epi8(t[2], t[3]);
      const __m512i g4[4] = {_mm512_unpacklo_epi16(al, bl), _mm512_unpackhi_epi16(al, bl),
                             _mm512_unpacklo_epi16(ah, bh), _mm512_unpackhi_epi16(ah, bh)};
      __m512i wb[NR];
      for (int u = 0; u < NR; u++) {
        int32_t w4; memcpy(&w4, &wq[u][j], 4);
        wb[u] = _mm512_set1_epi32(w4);
      }
      for (int g = 0; g < 4; g++) {
        const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(g4[g], m4));
        const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(g4[g], 4), m4));
        for (int u = 0; u < NR; u++) {
          acc[u][2 * g] = _mm512_dpbusd_epi32(acc[u][2 * g], wb[u], lo);
          acc[u][2 * g + 1] = _mm512_dpbusd_epi32(acc[u][2 * g + 1], wb[u], hi);
        }
      }
    }
    for (int u = 0; u < NR; u++) {
      const __m512 s = _mm512_set1_ps(wsc[u]);
      float *ou = o + u * W + 128 * c;
      for (int i = 0; i < 8; i++)
        _mm512_storeu_ps(ou + 16 * i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[u][i]), s,
                                                      _mm512_loadu_ps(ou + 16 * i)));
    }
  }
}
#else
#define TK_I8 0
#endif

// Position of channel i in the value sums of the AVX2 integer path (4-bit codes interleaved
// per 32 bytes): per 64 channels, four runs of 16 (low nibbles
// of code bytes 0-7 and 16-23, then 8-15 and 24-31; then the high ones).
static inline int64_t av4_pos(int64_t i) {
  const int64_t k = (i % 64) / 2, run = 2 * (i % 2) + (k / 8) % 2;
  return i / 64 * 64 + 16 * run + (k < 8 ? k : k < 16 ? k - 8 : k < 24 ? k - 8 : k - 16);
}

// Position of channel i in a value accumulator of the int8 tq4 path (see above).
static inline int64_t i8v_pos(int64_t i) {
  const int64_t c = i / 128, r = i % 128, h = r % 2, k = r / 2;
  return 128 * c + 32 * ((k % 16) / 4) + 16 * h + 4 * (k / 16) + k % 4;
}

// C (n, m) = A (n, k) @ B (k, m), all row-major and contiguous, m % 16 == 0: 8 rows x
// 32 columns of C in registers (16 for the last of m % 32 == 16), one broadcast of A and
// two loads of B per step.
template <int NR, int NV = 2>
static inline void mm_block(const float *A, const float *B, float *C, int64_t k, int64_t m, int64_t j) {
  f16v c[NR][NV];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) c[r][v] = f16v{};
  for (int64_t i = 0; i < k; i++) {
    f16v b[NV];
    for (int v = 0; v < NV; v++) b[v] = ld(B + i * m + j + 16 * v);
    for (int r = 0; r < NR; r++) {
      const f16v a = splat(A[r * k + i]);
      for (int v = 0; v < NV; v++) c[r][v] = fma(a, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) st(C + r * m + j + 16 * v, c[r][v]);
}
#if TK_AVX2
// AVX2 has 16 registers: up to 6 rows x 16 columns of C (12 accumulators) per block, two
// loads of B and a broadcast of A per step. Each element of C is the same chain of fmas
// over k in order whatever the rows of its block, so the blocking changes no bit.
template <int NR>
static inline void mm_block16(const float *A, const float *B, float *C, int64_t k, int64_t m, int64_t j) {
  __m256 c0[NR], c1[NR];
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i++) {
    const __m256 b0 = _mm256_loadu_ps(B + i * m + j), b1 = _mm256_loadu_ps(B + i * m + j + 8);
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
      const __m256 a = _mm256_broadcast_ss(A + r * k + i);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++) { _mm256_storeu_ps(C + r * m + j, c0[r]); _mm256_storeu_ps(C + r * m + j + 8, c1[r]); }
}
static void matmul(const float *A, const float *B, float *C, int64_t n, int64_t k, int64_t m) {
  for (int64_t r = 0; r < n; r += 6) {
    const float *a = A + r * k;
    float *c = C + r * m;
    for (int64_t j = 0; j < m; j += 16) {
      switch (n - r) {
        case 1: mm_block16<1>(a, B, c, k, m, j); break;
        case 2: mm_block16<2>(a, B, c, k, m, j); break;
        case 3: mm_block16<3>(a, B, c, k, m, j); break;
        case 4: mm_block16<4>(a, B, c, k, m, j); break;
        case 5: mm_block16<5>(a, B, c, k, m, j); break;
        default: mm_block16<6>(a, B, c, k, m, j);
      }
    }
  }
}
#else
static void matmul(const float *A, const float *B, float *C, int64_t n, int64_t k, int64_t m) {
  for (int64_t r = 0; r < n; r += 8)
    for (int64_t j = 0; j < m; j += 32) {
      if (m - j < 32) {
        if (n - r >= 8) mm_block<8, 1>(A + r * k, B, C + r * m, k, m, j);
        else for (int64_t q = r; q < n; q++) mm_block<1, 1>(A + q * k, B, C + q * m, k, m, j);
      } else if (n - r >= 8) {
        mm_block<8>(A + r * k, B, C + r * m, k, m, j);
      } else {
        for (int64_t q = r; q < n; q++) mm_block<1>(A + q * k, B, C + q * m, k, m, j);
      }
    }
}
#endif

#if defined(__AVX2__)
// dst rows a = 0..7 (ld apart) take column a of src's rows b = 0..7 (ls apart).
static inline void transpose8x8(const float *src, int64_t ls, float *dst, int64_t ld) {
  __m256 r[8], t[8];
  for (int b = 0; b < 8; b++) r[b] = _mm256_loadu_ps(src + b * ls);
  for (int b = 0; b < 8; b += 2) {
    t[b] = _mm256_unpacklo_ps(r[b], r[b + 1]);
    t[b + 1] = _mm256_unpackhi_ps(r[b], r[b + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // rows h..h+3: columns 0-1, 2-3 of each 128-bit half
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
  }
  for (int a = 0; a < 4; a++) {
    _mm256_storeu_ps(dst + a * ld, _mm256_permute2f128_ps(r[a], r[a + 4], 0x20));
    _mm256_storeu_ps(dst + (a + 4) * ld, _mm256_permute2f128_ps(r[a], r[a + 4], 0x31));
  }
}
#endif

// A block's decoded keys vt (BT, D) as the matmul's B: kT (D, BT).
static inline void transpose_block(const float *vt, float *kT, int64_t D) {
#if defined(__AVX2__)
  if (D % 8 == 0) {
    for (int64_t i = 0; i < D; i += 8)
      for (int64_t j = 0; j < BT; j += 8) transpose8x8(vt + j * D + i, D, kT + i * BT + j, BT);
    return;
  }
#endif
  for (int64_t i = 0; i < D; i++)
    for (int64_t j = 0; j < BT; j++) kT[i * BT + j] = vt[j * D + i];
}

#if TK_I8_FEW
// NR rows' softmax weights of a block (w: BT apart, n of them) as 7-bit integers q (the
// block's largest weight at 127, rounded to nearest) and each row's scale ws: w ~ q ws.
template <int NR>
static inline void weights_u7(const float *w, int64_t n, uint8_t q[][BT], float *ws) {
  for (int u = 0; u < NR; u++) {
    float mx = 0.f;
    for (int64_t j = 0; j < n; j++) mx = w[u * BT + j] > mx ? w[u * BT + j] : mx;
    const float inv = mx > 0 ? 127 / mx : 0.f;
    for (int64_t j = 0; j < BT; j++) q[u][j] = j < n ? (uint8_t)rnd(w[u * BT + j] * inv) : 0;
    ws[u] = mx / 127;
  }
}
#endif

#if TK_AVX2
// The same two loops in AVX2 registers (GCC lowers the 16-lane vector type through
// the stack here): 32 channels of a stored vector as four float vectors.
template <int KIND>
static inline __attribute__((always_inline)) void load32x(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                                          int64_t b, __m256 cb0, __m256 cb1, __m256 x[4]) {
  if (KIND == F32) {
    for (int i = 0; i < 4; i++) x[i] = _mm256_loadu_ps((const float *)p0 + 32 * b + 8 * i);
  } else if (KIND == F16) {
    for (int i = 0; i < 4; i++) x[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p0 + 64 * b + 16 * i)));
  } else if (KIND == BF16) {
    for (int i = 0; i < 4; i++)
      x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p0 + 64 * b + 16 * i))), 16));
  } else if (KIND == Q8_0) {
    const __m256 d = _mm256_set1_ps(f16s(p1 + 2 * b));
    for (int i = 0; i < 4; i++)
      x[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p0 + 32 * b + 8 * i)))), d);
  } else if (KIND == Q4_0) {
    const __m256 d = _mm256_set1_ps(f16s(p1 + 2 * b));
    const __m128i by = _mm_loadu_si128((const __m128i *)(p0 + 16 * b));
    const __m256i c0 = _mm256_cvtepu8_epi32(by), c1 = _mm256_cvtepu8_epi32(_mm_srli_si128(by, 8));
    const __m256i m = _mm256_set1_epi32(15), e = _mm256_set1_epi32(8);
    x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c0, m), e)), d);
    x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c1, m), e)), d);
    x[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(c0, 4), e)), d);
    x[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(c1, 4), e)), d);
  } else if constexpr (KIND != TQ4) {
    constexpr int B = code_bits(KIND);
    const uint8_t *p = p0 + 4 * B * b;
    for (int i = 0; i < 4; i++) {
      const __m256i c = codes8<B>(p, i);
      x[i] = is_cb(KIND) ? lut16(c, cb0, cb1) : _mm256_cvtepi32_ps(c);
    }
    if constexpr (is_ab(KIND)) {
      const __m256 d = _mm256_set1_ps(f16s(p1 + 2 * b)), z = _mm256_set1_ps(f16s(p2 + 2 * b));
      for (int i = 0; i < 4; i++) x[i] = _mm256_fmadd_ps(x[i], d, z);
    }
  } else {  // tq4: lanes 0..15 the low nibbles of the 16 bytes, 16..31 the high ones
    const __m128i by = _mm_loadu_si128((const __m128i *)(p0 + 16 * b));
    const __m256i c0 = _mm256_cvtepu8_epi32(by), c1 = _mm256_cvtepu8_epi32(_mm_srli_si128(by, 8));
    const __m256i m = _mm256_set1_epi32(15);
    x[0] = lut16(_mm256_and_si256(c0, m), cb0, cb1);
    x[1] = lut16(_mm256_and_si256(c1, m), cb0, cb1);
    x[2] = lut16(_mm256_srli_epi32(c0, 4), cb0, cb1);
    x[3] = lut16(_mm256_srli_epi32(c1, 4), cb0, cb1);
  }
}

// Channels 16c .. 16c+15 as two float vectors (see load16: the same lanes).
template <int KIND>
static inline __attribute__((always_inline)) void load16x(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                                          int64_t c, int64_t si, __m256 cb0, __m256 cb1, __m256 x[2]) {
  if (KIND == F32) {
    for (int i = 0; i < 2; i++) x[i] = _mm256_loadu_ps((const float *)p0 + 16 * c + 8 * i);
  } else if (KIND == F16) {
    for (int i = 0; i < 2; i++) x[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p0 + 32 * c + 16 * i)));
  } else if (KIND == BF16) {
    for (int i = 0; i < 2; i++)
      x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p0 + 32 * c + 16 * i))), 16));
  } else if (KIND == TQ4) {
    const __m256i by = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p0 + 8 * c)));
    x[0] = lut16(_mm256_and_si256(by, _mm256_set1_epi32(15)), cb0, cb1);
    x[1] = lut16(_mm256_srli_epi32(by, 4), cb0, cb1);
  } else if constexpr (KIND != Q8_0 && KIND != Q4_0) {
    constexpr int B = code_bits(KIND);
    const uint8_t *p = p0 + 2 * B * c;
    for (int i = 0; i < 2; i++) {
      const __m256i cd = codes8<B, true>(p, i);
      x[i] = is_cb(KIND) ? lut16(cd, cb0, cb1) : _mm256_cvtepi32_ps(cd);
    }
    if constexpr (is_ab(KIND)) {
      const __m256 d = _mm256_set1_ps(f16s(p1 + 2 * si)), z = _mm256_set1_ps(f16s(p2 + 2 * si));
      for (int i = 0; i < 2; i++) x[i] = _mm256_fmadd_ps(x[i], d, z);
    }
  } else {  // q8_0, q4_0: never called (the kernel refuses their kinds with a tail)
    x[0] = x[1] = _mm256_setzero_ps();
  }
}

template <int KIND, int NR>
static inline __attribute__((always_inline)) void dot_key(const float *q, const uint8_t *k0, const uint8_t *k1,
                                                          int64_t D, const f16v &cb, float *dots) {
  const __m256 cb0 = _mm256_loadu_ps((const float *)&cb), cb1 = _mm256_loadu_ps((const float *)&cb + 8);
  __m256 acc[NR][2];
  for (int u = 0; u < NR; u++) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < D / 32; b++) {
    __m256 x[4];
    load32x<KIND>(k0, k1, nullptr, b, cb0, cb1, x);
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++)
        acc[u][i & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + u * D + 32 * b + 8 * i), x[i], acc[u][i & 1]);
  }
  if (D % 32) {  // the 16-channel tail
    __m256 x[2];
    load16x<KIND>(k0, k1, nullptr, D / 16 - 1, 0, cb0, cb1, x);
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 2; i++) acc[u][i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + u * D + D - 16 + 8 * i), x[i], acc[u][i]);
  }
  for (int u = 0; u < NR; u++) _mm256_storeu_ps(dots + 64 * u, _mm256_add_ps(acc[u][0], acc[u][1]));
}

// out rows (NR, W apart) += sum_j w[u][j] * vt_j over n decoded value vectors (vt: n, Dv), 32
// channels at a time with the NR rows' sums in registers.
template <int NR>
static inline void add_decoded(float *o, int64_t W, const float *w, const float *vt, int64_t n, int64_t Dv) {
  if (Dv % 32) {  // the 16-channel tail
    const int64_t b = Dv - 16;
    __m256 acc[NR][2];
#pragma GCC unroll 4
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 2; i++) acc[u][i] = _mm256_loadu_ps(o + u * W + b + 8 * i);
    for (int64_t j = 0; j < n; j++)
#pragma GCC unroll 4
      for (int u = 0; u < NR; u++) {
        const __m256 pw = _mm256_broadcast_ss(w + u * BT + j);
        for (int i = 0; i < 2; i++) acc[u][i] = _mm256_fmadd_ps(pw, _mm256_loadu_ps(vt + j * Dv + b + 8 * i), acc[u][i]);
      }
#pragma GCC unroll 4
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 2; i++) _mm256_storeu_ps(o + u * W + b + 8 * i, acc[u][i]);
  }
  for (int64_t b = 0; b + 32 <= Dv; b += 32) {
    __m256 acc[NR][4];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) acc[u][i] = _mm256_loadu_ps(o + u * W + b + 8 * i);
    for (int64_t j = 0; j < n; j++) {
      const float *v = vt + j * Dv + b;
      for (int u = 0; u < NR; u++) {
        const __m256 pw = _mm256_broadcast_ss(w + u * BT + j);
        for (int i = 0; i < 4; i++) acc[u][i] = _mm256_fmadd_ps(pw, _mm256_loadu_ps(v + 8 * i), acc[u][i]);
      }
    }
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + u * W + b + 8 * i, acc[u][i]);
  }
}

// Lane k of the result: the sum of the 8 lanes of v[k] (8 keys' dots reduced at once).
static inline __m256 lane_sums8(const float *v) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8));
  const __m256 h1 = _mm256_hadd_ps(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24));
  const __m256 h2 = _mm256_hadd_ps(_mm256_loadu_ps(v + 32), _mm256_loadu_ps(v + 40));
  const __m256 h3 = _mm256_hadd_ps(_mm256_loadu_ps(v + 48), _mm256_loadu_ps(v + 56));
  const __m256 h4 = _mm256_hadd_ps(h0, h1), h5 = _mm256_hadd_ps(h2, h3);
  return _mm256_add_ps(_mm256_permute2f128_ps(h4, h5, 0x20), _mm256_permute2f128_ps(h4, h5, 0x31));
}

// Integer dots of NR int8 query rows (D apart, in nibble order: per 64 channels the 32 even
// ones, then the 32 odd ones) with one key's 4-bit codes, as llama.cpp's AVX2 dots do: each
// 32 code bytes split into low and high nibbles (u8), multiplied by maddubs, pairs summed
// by madd, times the 64 channels' query scale qs. Out: 8 float lanes per row (64 floats
// apart), to be summed by lane_sums8.
template <int NR>
static inline __attribute__((always_inline)) void dot_key_i8(const int8_t *q8, const float *qs, const uint8_t *k0,
                                                             int64_t D, float *dots) {
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[NR];
  for (int u = 0; u < NR; u++) acc[u] = _mm256_setzero_ps();
  for (int64_t c = 0; c < D / 64; c++) {
    const __m256i by = _mm256_loadu_si256((const __m256i *)(k0 + 32 * c));
    const __m256i lo = _mm256_and_si256(by, m4), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m4);
    for (int u = 0; u < NR; u++) {
      const __m256i *q = (const __m256i *)(q8 + u * D + 64 * c);
      const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(q)),
                                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256(q + 1)));
      acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(t, ones)), _mm256_set1_ps(qs[u * (D / 64) + c]),
                               acc[u]);
    }
  }
  for (int u = 0; u < NR; u++) _mm256_storeu_ps(dots + 64 * u, acc[u]);
}

// The same for tq4 keys: each key's 32 code bytes per 64 channels split into nibbles and
// mapped through the 7-bit codebook (codebook / kstep + 64, below 128 so that no pair of
// maddubs saturates int16) by one byte shuffle each; the rows' int8 queries have one scale
// each, so the dots stay int32 over the whole key. Out: the 8 lanes times the row's qm;
// the caller takes off the offset (64 x the query's byte sum x qm).
template <int NR>
static inline __attribute__((always_inline)) void dot_key_tq4_i8(const int8_t *q8, const float *qm, const uint8_t *k0,
                                                                 int64_t D, const uint8_t *lut16, float *dots) {
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut16));
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256i acc[NR];
  for (int u = 0; u < NR; u++) acc[u] = _mm256_setzero_si256();
  for (int64_t c = 0; c < D / 64; c++) {
    const __m256i by = _mm256_loadu_si256((const __m256i *)(k0 + 32 * c));
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(by, m4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(by, 4), m4));
    for (int u = 0; u < NR; u++) {
      const __m256i *q = (const __m256i *)(q8 + u * D + 64 * c);
      acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(q)), ones));
      acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256(q + 1)), ones));
    }
  }
  for (int u = 0; u < NR; u++) _mm256_storeu_ps(dots + 64 * u, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[u]), _mm256_set1_ps(qm[u])));
}

// out rows (NR, W apart, lanes in av4_pos order) += sum_j w[u][j] (code_j - 8) over n <= BT
// tokens of 4-bit codes (vt0 bytes apart; the caller adds 8 sum_j w[u][j]): the weights
// quantized to 7 bits per row (scale max / 127), two tokens' centred codes interleaved per
// channel so that one maddubs sums 2 tokens x 16 channels in int16 (at most 127 * 8 * 32
// over the block, so one widening to float per block). Centred, the codes' common part
// stays out of the weights' rounding (it would come back as one error in every channel).
template <int NR>
static inline void add_values_av4_i8(float *o, int64_t W, const float *w, const uint8_t *v0, int64_t vt0, int64_t n,
                                     int64_t Dv) {
  alignas(32) uint16_t wp[NR][BT / 2];  // each pair of tokens' weights as one 16-bit word
  uint8_t q[NR][BT];
  float ws[NR];
  weights_u7<NR>(w, n, q, ws);
  for (int u = 0; u < NR; u++)
    for (int p = 0; p < BT / 2; p++) wp[u][p] = (uint16_t)(q[u][2 * p] | q[u][2 * p + 1] << 8);
  const __m256i m4 = _mm256_set1_epi8(15), e8 = _mm256_set1_epi8(8);
  for (int64_t c = 0; c < Dv / 64; c++) {
    __m256i acc[NR][4];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) acc[u][i] = _mm256_setzero_si256();
    for (int64_t j = 0; j < n; j += 2) {
      const __m256i a = _mm256_loadu_si256((const __m256i *)(v0 + j * vt0 + 32 * c));
      const __m256i b = j + 1 < n ? _mm256_loadu_si256((const __m256i *)(v0 + (j + 1) * vt0 + 32 * c)) : a;
      const __m256i alo = _mm256_sub_epi8(_mm256_and_si256(a, m4), e8);
      const __m256i ahi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), e8);
      const __m256i blo = _mm256_sub_epi8(_mm256_and_si256(b, m4), e8);
      const __m256i bhi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), e8);
      const __m256i x[4] = {_mm256_unpacklo_epi8(alo, blo), _mm256_unpackhi_epi8(alo, blo),
                            _mm256_unpacklo_epi8(ahi, bhi), _mm256_unpackhi_epi8(ahi, bhi)};
      for (int u = 0; u < NR; u++) {
        const __m256i wpv = _mm256_set1_epi16((int16_t)wp[u][j / 2]);
        for (int i = 0; i < 4; i++) acc[u][i] = _mm256_add_epi16(acc[u][i], _mm256_maddubs_epi16(wpv, x[i]));
      }
    }
    for (int u = 0; u < NR; u++) {  // widen: lanes 0-7 and 8-15 of each run to float
      const __m256 sc = _mm256_set1_ps(ws[u]);
      float *ou = o + u * W + 64 * c;
      for (int i = 0; i < 4; i++) {
        const __m256 l0 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc[u][i])));
        const __m256 l1 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc[u][i], 1)));
        _mm256_storeu_ps(ou + 16 * i, _mm256_fmadd_ps(l0, sc, _mm256_loadu_ps(ou + 16 * i)));
        _mm256_storeu_ps(ou + 16 * i + 8, _mm256_fmadd_ps(l1, sc, _mm256_loadu_ps(ou + 16 * i + 8)));
      }
    }
  }
}

template <int KIND, int NR>
static inline __attribute__((always_inline)) void add_values(float *o, int64_t W, const float *w, const uint8_t *v0,
                                                             const uint8_t *v1, const uint8_t *v2, int64_t vt0,
                                                             int64_t vt1, int64_t vt2, int64_t n, int64_t Dv,
                                                             const f16v &cb) {
  const __m256 cb0 = _mm256_loadu_ps((const float *)&cb), cb1 = _mm256_loadu_ps((const float *)&cb + 8);
  for (int64_t b = 0; b < Dv / 32; b++) {
    __m256 acc[NR][4];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) acc[u][i] = _mm256_loadu_ps(o + u * W + 32 * b + 8 * i);
    for (int64_t j = 0; j < n; j++) {
      __m256 x[4];
      load32x<KIND>(v0 + j * vt0, v1 ? v1 + j * vt1 : nullptr, v2 ? v2 + j * vt2 : nullptr, b, cb0, cb1, x);
      for (int u = 0; u < NR; u++) {
        const __m256 pw = _mm256_broadcast_ss(w + u * BT + j);
        for (int i = 0; i < 4; i++) acc[u][i] = _mm256_fmadd_ps(pw, x[i], acc[u][i]);
      }
    }
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + u * W + 32 * b + 8 * i, acc[u][i]);
  }
  if (Dv % 32) {  // the 16-channel tail (dense kinds only: codes are decoded first)
    const int64_t c = Dv / 16 - 1;
    __m256 acc[NR][2];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 2; i++) acc[u][i] = _mm256_loadu_ps(o + u * W + 16 * c + 8 * i);
    for (int64_t j = 0; j < n; j++) {
      __m256 x[2];
      load16x<KIND>(v0 + j * vt0, v1 ? v1 + j * vt1 : nullptr, v2 ? v2 + j * vt2 : nullptr, c, c, cb0, cb1, x);
      for (int u = 0; u < NR; u++) {
        const __m256 pw = _mm256_broadcast_ss(w + u * BT + j);
        for (int i = 0; i < 2; i++) acc[u][i] = _mm256_fmadd_ps(pw, x[i], acc[u][i]);
      }
    }
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 2; i++) _mm256_storeu_ps(o + u * W + 16 * c + 8 * i, acc[u][i]);
  }
}
#else
// Scores of NR query rows (q rows D apart) against one stored key, decoded 32
// channels at a time straight into the dot products.
template <int KIND, int NR>
static inline __attribute__((always_inline)) void dot_key(const float *q, const uint8_t *k0, const uint8_t *k1,
                                                          int64_t D, const f16v &cb, float *dots) {
  f16v a0[NR], a1[NR];
  for (int u = 0; u < NR; u++) a0[u] = a1[u] = f16v{};
  for (int64_t b = 0; b < D / 32; b++) {
    f16v x0, x1;
    load32<KIND>(k0, k1, nullptr, b, cb, x0, x1);
    for (int u = 0; u < NR; u++) {
      a0[u] = fma(ld(q + u * D + 32 * b), x0, a0[u]);
      a1[u] = fma(ld(q + u * D + 32 * b + 16), x1, a1[u]);
    }
  }
  if (D % 32) {  // the 16-channel tail
    const f16v x = load16<KIND>(k0, k1, nullptr, D / 16 - 1, 0, cb);
    for (int u = 0; u < NR; u++) a0[u] = fma(ld(q + u * D + D - 16), x, a0[u]);
  }
  for (int u = 0; u < NR; u++) dots[u] = hsum(a0[u] + a1[u]);
}

// out rows (NR, W apart) += sum_j w[u][j] * v_j over the n tokens of a block, 32
// channels at a time with the NR accumulators in registers.
template <int KIND, int NR>
static inline __attribute__((always_inline)) void add_values(float *o, int64_t W, const float *w, const uint8_t *v0,
                                                             const uint8_t *v1, const uint8_t *v2, int64_t vt0,
                                                             int64_t vt1, int64_t vt2, int64_t n, int64_t Dv,
                                                             const f16v &cb) {
  for (int64_t b = 0; b < Dv / 32; b++) {
    f16v a0[NR], a1[NR];
    for (int u = 0; u < NR; u++) { a0[u] = ld(o + u * W + 32 * b); a1[u] = ld(o + u * W + 32 * b + 16); }
    for (int64_t j = 0; j < n; j++) {
      f16v x0, x1;
      load32<KIND>(v0 + j * vt0, v1 ? v1 + j * vt1 : nullptr, v2 ? v2 + j * vt2 : nullptr, b, cb, x0, x1);
      for (int u = 0; u < NR; u++) {
        const f16v pw = bcast(w + u * BT + j);
        a0[u] = fma(pw, x0, a0[u]);
        a1[u] = fma(pw, x1, a1[u]);
      }
    }
    for (int u = 0; u < NR; u++) { st(o + u * W + 32 * b, a0[u]); st(o + u * W + 32 * b + 16, a1[u]); }
  }
  if (Dv % 32) {  // the 16-channel tail (not KIVI values: theirs are decoded first)
    const int64_t c = Dv / 16 - 1;
    f16v a[NR];
    for (int u = 0; u < NR; u++) a[u] = ld(o + u * W + 16 * c);
    for (int64_t j = 0; j < n; j++) {
      const f16v x = load16<KIND>(v0 + j * vt0, v1 ? v1 + j * vt1 : nullptr, nullptr, c, 0, cb);
      for (int u = 0; u < NR; u++) a[u] = fma(bcast(w + u * BT + j), x, a[u]);
    }
    for (int u = 0; u < NR; u++) st(o + u * W + 16 * c, a[u]);
  }
}

#if TK_NEON
// AVX2's integer paths on NEON with dot products. Every integer sum is the one AVX2's
// maddubs and madd give (integer sums do not depend on their order), by `sdot`
// (vdotq_s32: 16 signed bytes by 16, each 4 summed into an int32 lane) or by widening
// multiply-adds; only the float steps after them run in another order. The int8 queries
// and weights are AVX2's, in the same lane orders (q8src, av4_pos). Unlike AVX2's, the key
// dots give one float per row, not 8 lanes.

// dots[u] = the dot of row u's int8 query (q8, D apart, in nibble order: per 64 channels
// the 32 even ones, then the 32 odd ones; qs a scale per 64 channels) with one key's 4-bit
// codes (32 bytes per 64 channels: low nibbles the even channels, high the odd).
template <int NR>
static inline __attribute__((always_inline)) void dot_key_i8(const int8_t *q8, const float *qs, const uint8_t *k0,
                                                             int64_t D, float *dots) {
  const uint8x16_t m4 = vdupq_n_u8(15);
  float32x4_t acc[NR];
  for (int u = 0; u < NR; u++) acc[u] = vdupq_n_f32(0.f);
  for (int64_t c = 0; c < D / 64; c++) {
    const uint8x16_t b0 = vld1q_u8(k0 + 32 * c), b1 = vld1q_u8(k0 + 32 * c + 16);
    const int8x16_t x[4] = {vreinterpretq_s8_u8(vandq_u8(b0, m4)), vreinterpretq_s8_u8(vandq_u8(b1, m4)),
                            vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(b1, 4))};
    for (int u = 0; u < NR; u++) {
      const int8_t *q = q8 + u * D + 64 * c;
      int32x4_t s = vdupq_n_s32(0);
      for (int i = 0; i < 4; i++) s = vdotq_s32(s, x[i], vld1q_s8(q + 16 * i));
      acc[u] = vfmaq_n_f32(acc[u], vcvtq_f32_s32(s), qs[u * (D / 64) + c]);
    }
  }
  for (int u = 0; u < NR; u++) dots[u] = vaddvq_f32(acc[u]);
}

// The same for tq4 keys: the nibbles mapped through the 7-bit codebook (lut16: codebook /
// kstep + 64, below 128, so signed bytes) by `tbl`; one int32 sum over the whole key, times
// the row's multiplier qm. The caller takes off the offset (64 x the query's byte sum x qm).
template <int NR>
static inline __attribute__((always_inline)) void dot_key_tq4_i8(const int8_t *q8, const float *qm, const uint8_t *k0,
                                                                 int64_t D, const uint8_t *lut16, float *dots) {
  const uint8x16_t lut = vld1q_u8(lut16), m4 = vdupq_n_u8(15);
  int32x4_t acc[NR];
  for (int u = 0; u < NR; u++) acc[u] = vdupq_n_s32(0);
  for (int64_t c = 0; c < D / 64; c++) {
    const uint8x16_t b0 = vld1q_u8(k0 + 32 * c), b1 = vld1q_u8(k0 + 32 * c + 16);
    const int8x16_t x[4] = {vreinterpretq_s8_u8(vqtbl1q_u8(lut, vandq_u8(b0, m4))),
                            vreinterpretq_s8_u8(vqtbl1q_u8(lut, vandq_u8(b1, m4))),
                            vreinterpretq_s8_u8(vqtbl1q_u8(lut, vshrq_n_u8(b0, 4))),
                            vreinterpretq_s8_u8(vqtbl1q_u8(lut, vshrq_n_u8(b1, 4)))};
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 4; i++) acc[u] = vdotq_s32(acc[u], x[i], vld1q_s8(q8 + u * D + 64 * c + 16 * i));
  }
  for (int u = 0; u < NR; u++) dots[u] = (float)vaddvq_s32(acc[u]) * qm[u];
}

// out rows (NR, W apart, lanes in av4_pos order) += sum_j w[u][j] (code_j - 8) over n <= BT
// tokens of 4-bit codes (vt0 bytes apart; the caller adds 8 sum_j w[u][j]), the weights in
// 7 bits as on AVX2: each token's 64 centred codes per 32 bytes times its weight, widened
// and summed into int16 lanes (`smlal`; at most 127 x 8 x 32 over the block), then one
// conversion to float per block. Eight codes per int16 vector, in av4_pos's runs: the low
// nibbles of bytes 0-7 and 16-23, then 8-15 and 24-31; then the high nibbles alike.
template <int NR>
static inline void add_values_av4_i8(float *o, int64_t W, const float *w, const uint8_t *v0, int64_t vt0, int64_t n,
                                     int64_t Dv) {
  uint8_t q[NR][BT];
  float ws[NR];
  weights_u7<NR>(w, n, q, ws);
  const uint8x16_t m4 = vdupq_n_u8(15);
  const int8x16_t e8 = vdupq_n_s8(8);
  for (int64_t c = 0; c < Dv / 64; c++) {
    int16x8_t acc[NR][8];
    for (int u = 0; u < NR; u++)
      for (int i = 0; i < 8; i++) acc[u][i] = vdupq_n_s16(0);
    for (int64_t j = 0; j < n; j++) {
      const uint8x16_t a0 = vld1q_u8(v0 + j * vt0 + 32 * c), a1 = vld1q_u8(v0 + j * vt0 + 32 * c + 16);
      const int8x16_t l0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(a0, m4)), e8);
      const int8x16_t l1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(a1, m4)), e8);
      const int8x16_t h0 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(a0, 4)), e8);
      const int8x16_t h1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(a1, 4)), e8);
      const int8x8_t x[8] = {vget_low_s8(l0), vget_low_s8(l1), vget_high_s8(l0), vget_high_s8(l1),
                             vget_low_s8(h0), vget_low_s8(h1), vget_high_s8(h0), vget_high_s8(h1)};
      for (int u = 0; u < NR; u++) {
        const int8x8_t wv = vdup_n_s8((int8_t)q[u][j]);
        for (int i = 0; i < 8; i++) acc[u][i] = vmlal_s8(acc[u][i], x[i], wv);
      }
    }
    for (int u = 0; u < NR; u++) {  // widen to float: out += sums x the row's scale, one rounding (as AVX2's fmadd)
      const float32x4_t sc = vdupq_n_f32(ws[u]);
      float *ou = o + u * W + 64 * c;
      for (int i = 0; i < 8; i++) {
        const float32x4_t l = vcvtq_f32_s32(vmovl_s16(vget_low_s16(acc[u][i])));
        const float32x4_t h = vcvtq_f32_s32(vmovl_s16(vget_high_s16(acc[u][i])));
        vst1q_f32(ou + 8 * i, vfmaq_f32(vld1q_f32(ou + 8 * i), l, sc));
        vst1q_f32(ou + 8 * i + 4, vfmaq_f32(vld1q_f32(ou + 8 * i + 4), h, sc));
      }
    }
  }
}
#endif

// More rows than one dot_key or add_values call takes (a group of 7, a verification's
// positions), and on AVX-512 every few-row block's keys (score_decoded): each stored vector
// decoded once, as those calls decode it, into D floats, then every group of rows runs the
// same multiply-adds over the decoded floats. Decoding is exact, so a row sums bit for bit
// as it does from the codes.
template <int KIND>
static inline void decode_once(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, int64_t D, const f16v &cb,
                               float *out) {
  for (int64_t b = 0; b < D / 32; b++) {
    f16v x0, x1;
    load32<KIND>(p0, p1, p2, b, cb, x0, x1);
    st(out + 32 * b, x0);
    st(out + 32 * b + 16, x1);
  }
  if (D % 32) st(out + D - 16, load16<KIND>(p0, p1, nullptr, D / 16 - 1, 0, cb));
}

// dot_key's sums against a key decoded by decode_once.
template <int NR>
static inline __attribute__((always_inline)) void dot_decoded(const float *q, const float *kx, int64_t D, float *dots) {
  f16v a0[NR], a1[NR];
  for (int u = 0; u < NR; u++) a0[u] = a1[u] = f16v{};
  for (int64_t b = 0; b < D / 32; b++) {
    const f16v x0 = ld(kx + 32 * b), x1 = ld(kx + 32 * b + 16);
    for (int u = 0; u < NR; u++) {
      a0[u] = fma(ld(q + u * D + 32 * b), x0, a0[u]);
      a1[u] = fma(ld(q + u * D + 32 * b + 16), x1, a1[u]);
    }
  }
  if (D % 32) {
    const f16v x = ld(kx + D - 16);
    for (int u = 0; u < NR; u++) a0[u] = fma(ld(q + u * D + D - 16), x, a0[u]);
  }
  for (int u = 0; u < NR; u++) dots[u] = hsum(a0[u] + a1[u]);
}

// add_values' sums over n values decoded by decode_once (vt: n, Dv).
template <int NR>
static inline __attribute__((always_inline)) void add_values_decoded(float *o, int64_t W, const float *w,
                                                                     const float *vt, int64_t n, int64_t Dv) {
  for (int64_t b = 0; b < Dv / 32; b++) {
    f16v a0[NR], a1[NR];
    for (int u = 0; u < NR; u++) { a0[u] = ld(o + u * W + 32 * b); a1[u] = ld(o + u * W + 32 * b + 16); }
    for (int64_t j = 0; j < n; j++) {
      const f16v x0 = ld(vt + j * Dv + 32 * b), x1 = ld(vt + j * Dv + 32 * b + 16);
      for (int u = 0; u < NR; u++) {
        const f16v pw = bcast(w + u * BT + j);
        a0[u] = fma(pw, x0, a0[u]);
        a1[u] = fma(pw, x1, a1[u]);
      }
    }
    for (int u = 0; u < NR; u++) { st(o + u * W + 32 * b, a0[u]); st(o + u * W + 32 * b + 16, a1[u]); }
  }
  if (Dv % 32) {
    const int64_t c = Dv / 16 - 1;
    f16v a[NR];
    for (int u = 0; u < NR; u++) a[u] = ld(o + u * W + 16 * c);
    for (int64_t j = 0; j < n; j++) {
      const f16v x = ld(vt + j * Dv + 16 * c);
      for (int u = 0; u < NR; u++) a[u] = fma(bcast(w + u * BT + j), x, a[u]);
    }
    for (int u = 0; u < NR; u++) st(o + u * W + 16 * c, a[u]);
  }
}

#if defined(__AVX512F__)
// Every row's sums (out: nrows, W apart) over n values decoded once (vt: n, Dv), ONCE_ROWS rows
// at a time (more chains in flight than VROWS), each row's as add_values_decoded sums it alone.
static void add_rows_decoded(float *out, int64_t W, const float *sc, const float *vt, const char *alive,
                             int64_t nrows, int64_t n, int64_t Dv) {
  for (int64_t r0 = 0; r0 < nrows; r0 += ONCE_ROWS) {
    const int64_t nr = nrows - r0 < ONCE_ROWS ? nrows - r0 : ONCE_ROWS;
    bool any = false;
    for (int64_t u = 0; u < nr; u++) any |= alive[r0 + u];
    if (!any) continue;
    float *o = out + r0 * W;
    const float *wr = sc + r0 * BT;
    switch (nr) {
      case 1: add_values_decoded<1>(o, W, wr, vt, n, Dv); break;
      case 2: add_values_decoded<2>(o, W, wr, vt, n, Dv); break;
      case 3: add_values_decoded<3>(o, W, wr, vt, n, Dv); break;
      case 4: add_values_decoded<4>(o, W, wr, vt, n, Dv); break;
      case 5: add_values_decoded<5>(o, W, wr, vt, n, Dv); break;
      case 6: add_values_decoded<6>(o, W, wr, vt, n, Dv); break;
      case 7: add_values_decoded<7>(o, W, wr, vt, n, Dv); break;
      default: add_values_decoded<ONCE_ROWS>(o, W, wr, vt, n, Dv); break;
    }
  }
}
#endif

#if defined(__AVX512F__)
// Scores of rows (q: D apart) against n keys decoded by decode_once (kx: n, D), ks[j] each
// key's scale, kb[r] a per-row offset (or null): 16 keys of a row at a time, each dot summed as
// dot_key sums it (two chains, the tail into the first, their sum, then hsum's pairs: hsum16),
// then the offset, the scale, the bias and what the row sees as vectors, one store per 16.
template <int DD>  // the head dim where known when compiled (0: D)
static void score_decoded_d(const float *q, const float *kx, const float *ks, const float *kb, const float *bias,
                            const int64_t *lo, const int64_t *hi, const char *alive, int64_t nrows, int64_t j0,
                            int64_t n, int64_t Drt, float *sc) {
  const int64_t D = DD ? DD : Drt;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < nrows; r++) {
    const float *qr = q + r * D;
    for (int64_t g = 0; g < n; g += 16) {
      if (!alive[r]) {  // sees none of the block
        _mm512_storeu_ps(sc + r * BT + g, ninf);
        continue;
      }
      __m512 v[16];
      for (int k0 = 0; k0 < 16; k0 += 4) {  // 4 keys at a time: 8 chains in flight
        const float *kk = kx + (g + k0) * D;
        __m512 a0[4], a1[4];
        for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm512_setzero_ps();
        if (g + k0 < n) {
          for (int64_t b = 0; b < D / 32; b++) {
            const __m512 q0 = _mm512_loadu_ps(qr + 32 * b), q1 = _mm512_loadu_ps(qr + 32 * b + 16);
            for (int i = 0; i < 4; i++) {
              a0[i] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(kk + i * D + 32 * b), a0[i]);
              a1[i] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(kk + i * D + 32 * b + 16), a1[i]);
            }
          }
          if (D % 32) {
            const __m512 qt = _mm512_loadu_ps(qr + D - 16);
            for (int i = 0; i < 4; i++) a0[i] = _mm512_fmadd_ps(qt, _mm512_loadu_ps(kk + i * D + D - 16), a0[i]);
          }
        }
        for (int i = 0; i < 4; i++) v[k0 + i] = _mm512_add_ps(a0[i], a1[i]);
      }
      __m512 s = hsum16(v);
      if (kb) s = _mm512_add_ps(s, _mm512_set1_ps(kb[r]));
      s = _mm512_mul_ps(s, _mm512_loadu_ps(ks + g));
      if (bias) s = _mm512_add_ps(s, _mm512_set1_ps(bias[r]));
      const __m512i tok = _mm512_add_epi32(_mm512_set1_epi32((int)(j0 + g)), iota);
      const __mmask16 in = _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32((int)lo[r])) &
                           _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32((int)hi[r]));
      _mm512_storeu_ps(sc + r * BT + g, _mm512_mask_blend_ps(in, ninf, s));
    }
  }
}

static void score_decoded(const float *q, const float *kx, const float *ks, const float *kb, const float *bias,
                          const int64_t *lo, const int64_t *hi, const char *alive, int64_t nrows, int64_t j0,
                          int64_t n, int64_t D, float *sc) {
  switch (D) {
    case 64: return score_decoded_d<64>(q, kx, ks, kb, bias, lo, hi, alive, nrows, j0, n, D, sc);
    case 128: return score_decoded_d<128>(q, kx, ks, kb, bias, lo, hi, alive, nrows, j0, n, D, sc);
    case 256: return score_decoded_d<256>(q, kx, ks, kb, bias, lo, hi, alive, nrows, j0, n, D, sc);
    default: return score_decoded_d<0>(q, kx, ks, kb, bias, lo, hi, alive, nrows, j0, n, D, sc);
  }
}
#endif

// out rows (NR, W apart) += sum_j w[u][j] * vt_j over n decoded value vectors (vt: n, Dv).
template <int NR>
static inline void add_decoded(float *o, int64_t W, const float *w, const float *vt, int64_t n, int64_t Dv) {
  for (int64_t j = 0; j < n; j++)
    for (int u = 0; u < NR; u++) {
      const float pw = w[u * BT + j];
      float *ou = o + u * W;
      for (int64_t i = 0; i < Dv; i++) ou[i] += pw * vt[j * Dv + i];
    }
}

#endif

#if TK_AVX2
// vexp on 8 lanes, the same steps as the 16-lane one
static inline __m256 vexp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f), zero = _mm256_setzero_ps();
  const __m256 t = _mm256_mul_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(1.44269504088896341f));
  const __m256 half = _mm256_blendv_ps(_mm256_set1_ps(-0.5f), _mm256_set1_ps(0.5f), _mm256_cmp_ps(t, zero, _CMP_GE_OQ));
  const __m256i n = _mm256_cvttps_epi32(_mm256_add_ps(t, half));
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, _mm256_cvtepi32_ps(n)), _mm256_set1_ps(0.69314718055994531f));
  const float c[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  for (int i = 0; i < 7; i++) p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(c[i]));
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)));
  return _mm256_blendv_ps(r, zero, _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}
#endif

// Fold one row's block of BT scores (srow, -inf where unseen) into its running state
// o = (acc[Dv], max, sum); the scores become the softmax weights. False if the row
// saw nothing in the block.
static inline bool softmax_block(float *srow, float *o, int64_t Dv) {
#if TK_AVX2
  __m256 sv[4];
  for (int i = 0; i < 4; i++) sv[i] = _mm256_loadu_ps(srow + 8 * i);
  const float bm = hmax8(_mm256_max_ps(_mm256_max_ps(sv[0], sv[1]), _mm256_max_ps(sv[2], sv[3])));
#else
  const f16v s0 = ld(srow), s1 = ld(srow + 16);
  const float bm = hmax(s0 > s1 ? s0 : s1);
#endif
  if (bm == -INFINITY) return false;
  const float m = o[Dv], mn = bm > m ? bm : m;
  if (mn > m && m != -INFINITY) {
    const float alpha = vexp(splat(m - mn))[0];
    for (int64_t i = 0; i < Dv; i++) o[i] *= alpha;
    o[Dv + 1] *= alpha;
  } else if (m == -INFINITY) {
    o[Dv + 1] = 0.f;
  }
  o[Dv] = mn;
#if TK_AVX2
  __m256 sum = _mm256_setzero_ps();
  for (int i = 0; i < 4; i++) {
    const __m256 e = vexp8(_mm256_sub_ps(sv[i], _mm256_set1_ps(mn)));
    _mm256_storeu_ps(srow + 8 * i, e);
    sum = _mm256_add_ps(sum, e);
  }
  o[Dv + 1] += hsum8(sum);
#else
  const f16v p0 = vexp(s0 - mn), p1 = vexp(s1 - mn);
  st(srow, p0);
  st(srow + 16, p1);
  o[Dv + 1] += hsum(p0 + p1);
#endif
  return true;
}

// One stored vector of D channels decoded to float32 (tq4: in the code domain's
// permuted lane order, without its scale).
// A head dim that is an odd multiple of 16 ends in a 16-channel tail; KIVI values then
// have a scale per 16 channels, so theirs are decoded 16 channels at a time throughout.
template <int KIND>
static inline void decode_vec(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, int64_t D, const f16v &cb,
                              float *out) {
  const int64_t full = is_ab(KIND) && D % 32 ? 0 : D / 32;
#if TK_AVX2
  const __m256 cb0 = _mm256_loadu_ps((const float *)&cb), cb1 = _mm256_loadu_ps((const float *)&cb + 8);
  for (int64_t b = 0; b < full; b++) {
    __m256 x[4];
    load32x<KIND>(p0, p1, p2, b, cb0, cb1, x);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + 32 * b + 8 * i, x[i]);
  }
  for (int64_t c = 2 * full; c < D / 16; c++) {
    __m256 x[2];
    load16x<KIND>(p0, p1, p2, c, c, cb0, cb1, x);
    for (int i = 0; i < 2; i++) _mm256_storeu_ps(out + 16 * c + 8 * i, x[i]);
  }
#else
  for (int64_t b = 0; b < full; b++) {
    f16v x0, x1;
    load32<KIND>(p0, p1, p2, b, cb, x0, x1);
    st(out + 32 * b, x0);
    st(out + 32 * b + 16, x1);
  }
  for (int64_t c = 2 * full; c < D / 16; c++) st(out + 16 * c, load16<KIND>(p0, p1, p2, c, c, cb));
#endif
}

// What the blocks of one chunk share (set up by chunk_fn_attn).
struct Work {
  const Ctx *x;
  const Seg *s;
  int64_t nrows, hr0;
  const float *q, *bias;  // the rows' queries (scaled; a body's in its code domain), score biases
  float *part;            // (nrows, Dv + 2): acc, m, l
  float *sc;              // (nrows, BT): scores, then softmax weights
  const int64_t *lo, *hi;  // each row's visible tokens within the chunk
  const char *alive;
  bool many;                   // many rows (prefill): a block's keys and values decoded once, scored by matmul
  bool once;                   // AVX-512 and portable builds, more than 4 rows: each value (portable: key) decoded once into vt
  float *kT, *kscl, *vt, *pv;  // many rows: a key block transposed and its scales, a value block, the rows' sums
  float *lanes;                // AVX2 few rows: (rows, 8 keys, 8 lanes) dots
  const uint8_t *k[4], *v[4];  // this head's fields
  float *qt, *kb;   // affine keys: the queries times the group's channel scales A, their dots with its B
  int64_t kgroup;   // the group qt holds (-1: none yet)
  float *tmp, *z;   // KVarN values: a block's sums in code units (nrows, Dv + 2), its zero-point sums
  float *cv;        // KVarN values: the channel scales of tile vtile (Dv)
  int64_t vtile;    // the tile cv holds (-1: none yet)
  int8_t *q8;       // AVX2's integer keys: 4-bit affine, qt per row in nibble order, its scale per 64
  float *q8s;       // channels; tq4, prep_rows' int8 query and its multiplier per row
};

// Affine keys, x = (code * A[g] + B[g]) * m[t]: q.x = (q*A[g] . code + q.B[g]) * m[t].
static void affine_query(Work &w, int64_t j0) {
  const Seg &s = *w.s;
  const int64_t g = j0 / s.kd2, D = w.x->D;
  if (g == w.kgroup) return;
  w.kgroup = g;
  const uint8_t *a = w.k[2] + g * s.kt2, *b = w.k[3] + (j0 / s.kd3) * s.kt3;
  float A[1024], B[1024];
  for (int64_t i = 0; i < D; i++) { A[i] = f16s(a + 2 * i); B[i] = f16s(b + 2 * i); }
  for (int64_t r = 0; r < w.nrows; r++) {
    const float *qr = w.q + r * D;
    float *o = w.qt + r * D, d = 0.f;
    for (int64_t i = 0; i < D; i++) { o[i] = qr[i] * A[i]; d += qr[i] * B[i]; }
    w.kb[r] = d;
#if TK_I8_FEW
    if (w.q8) {  // int8 with a scale per 64 channels: the 32 even ones, then the 32 odd ones (the codes' nibbles)
      for (int64_t c = 0; c < D / 64; c++) {
        float mx = 0.f;
        for (int64_t i = 64 * c; i < 64 * c + 64; i++) mx = fabsf(o[i]) > mx ? fabsf(o[i]) : mx;
        const float inv = mx > 0 ? 127 / mx : 0.f;
        int8_t *q8 = w.q8 + r * D + 64 * c;
        for (int64_t i = 0; i < 64; i++) q8[(i % 2) * 32 + i / 2] = (int8_t)rnd(o[64 * c + i] * inv);
        w.q8s[r * (D / 64) + c] = mx / 127;
      }
    }
#endif
  }
}

#if TK_AVX2
// Scores of a few rows (decode), AVX2: each key decoded once per 4 rows; each row's dots with
// 8 keys stay in 8 lanes until one transposed sum reduces them together. I8: 4-bit affine
// keys against the rows' int8 queries (w.q8).
template <int KK, bool I8>
static void score_few(Work &w, int64_t j0, int64_t n, const float *q, const float *kb) {
  const Ctx *x = w.x;
  const Seg &s = *w.s;
  const int64_t D = x->D, nrows = w.nrows;
  const uint8_t *kb0 = w.k[0], *kb1 = w.k[1];
  const float *bias = w.bias;
  const int64_t *lo = w.lo, *hi = w.hi;
  float *sc = w.sc;
  float *lanes = w.lanes;  // (rows, 8 keys, 8 lanes)
  for (int64_t g = 0; g < n; g += 8) {
    const int ng = n - g < 8 ? (int)(n - g) : 8;
    alignas(32) float ks[8] = {};
    for (int k = 0; k < 8; k++) {
      const int64_t tok = j0 + g + k;
      float *lk = lanes + 8 * k;
      if (k >= ng) {
        for (int64_t r = 0; r < nrows; r++) memset(lk + 64 * r, 0, 32);
        continue;
      }
      const uint8_t *k0 = kb0 + tok * s.kt0, *k1 = kb1 ? kb1 + tok * s.kt1 : nullptr;
      ks[k] = vec_scale<KK>(k1);
      for (int64_t r0 = 0; r0 < nrows; r0 += 4) {
        const int nr = nrows - r0 < 4 ? (int)(nrows - r0) : 4;
        with_rows(nr, [&](auto NR) ALWAYS_INLINE_LAMBDA {
          if constexpr (I8 && KK == TQ4) dot_key_tq4_i8<NR>(w.q8 + r0 * D, w.q8s + r0, k0, D, x->klut, lk + 64 * r0);
          else if constexpr (I8) dot_key_i8<NR>(w.q8 + r0 * D, w.q8s + r0 * (D / 64), k0, D, lk + 64 * r0);
          else dot_key<KK, NR>(q + r0 * D, k0, k1, D, x->kcb, lk + 64 * r0);
        });
      }
    }
    const __m256 ksv = _mm256_load_ps(ks), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i tokv = _mm256_add_epi32(_mm256_set1_epi32((int)(j0 + g)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t r = 0; r < nrows; r++) {
      __m256 v = lane_sums8(lanes + 64 * r);
      if (kb) v = _mm256_add_ps(v, _mm256_set1_ps(kb[r]));
      v = _mm256_mul_ps(v, ksv);
      if (bias) v = _mm256_add_ps(v, _mm256_set1_ps(bias[r]));
      const __m256i seen = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)lo[r]), tokv),
                                               _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi[r]), tokv));
      _mm256_storeu_ps(sc + r * BT + g, _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(seen)));
    }
  }
}
#endif

// Scores of the rows for tokens j0 .. j0+n-1 into w.sc; -inf where a row cannot see.
template <int KK>
static void score_block(Work &w, int64_t j0, int64_t n) {
  const Ctx *x = w.x;
  const Seg &s = *w.s;
  const int64_t D = x->D, nrows = w.nrows;
  const uint8_t *kb0 = w.k[0], *kb1 = w.k[1];
  const float *q = w.q, *kb = nullptr, *bias = w.bias;
  const int64_t *lo = w.lo, *hi = w.hi;
  const char *alive = w.alive;
  float *sc = w.sc;
  if constexpr (is_ak(KK)) {
    affine_query(w, j0);
    q = w.qt;
    kb = w.kb;
  }
#if TK_I8
  if (KK == TQ4 && x->i8k) {
    const int8_t *q8 = x->q8 + w.hr0 * D;
    alignas(64) int32_t dots[4 * 16];
    for (int64_t g0 = 0; g0 < n; g0 += 16) {
      const int64_t ng = n - g0 < 16 ? n - g0 : 16;
      const uint8_t *k0 = kb0 + (j0 + g0) * s.kt0;
      const __mmask16 live = (__mmask16)((1u << ng) - 1);
      const uint8_t *nrm = kb1 + (j0 + g0) * s.kt1;
      __m512 ks;
      if (s.kt1 == 2) {
        ks = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, nrm));
      } else {
        alignas(64) float tmp[16] = {};
        for (int64_t k = 0; k < ng; k++) tmp[k] = f16s(nrm + k * s.kt1);
        ks = _mm512_load_ps(tmp);
      }
      const __m512i tok = _mm512_add_epi32(_mm512_set1_epi32((int)(j0 + g0)),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      for (int64_t r0 = 0; r0 < nrows; r0 += 4) {
        const int nr = nrows - r0 < 4 ? (int)(nrows - r0) : 4;
        if (!(alive[r0] | alive[r0 + 1] | alive[r0 + 2] | alive[r0 + 3])) {
          for (int u = 0; u < nr; u++) _mm512_storeu_ps(sc + (r0 + u) * BT + g0, _mm512_set1_ps(-INFINITY));
          continue;
        }
        with_rows(nr, [&](auto NR) ALWAYS_INLINE_LAMBDA { dots_tq4_i8<NR>(q8 + r0 * D, k0, s.kt0, ng, D, x->klut, dots); });
        for (int u = 0; u < nr; u++) {
          const int64_t r = r0 + u, hr = w.hr0 + r;
          const __m512i di = _mm512_sub_epi32(_mm512_load_si512(dots + 16 * u), _mm512_set1_epi32(x->q8sum[hr]));
          const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(di), _mm512_set1_ps(x->q8mul[hr])), ks,
                                           _mm512_set1_ps(bias[r]));
          const __mmask16 in = _mm512_cmpge_epi32_mask(tok, _mm512_set1_epi32((int)lo[r])) &
                               _mm512_cmplt_epi32_mask(tok, _mm512_set1_epi32((int)hi[r])) & live;
          _mm512_storeu_ps(sc + r * BT + g0, _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), v));
        }
      }
    }
    return;
  }
#endif
  if (w.many) {  // many rows (prefill): the block's keys decoded, transposed, one matmul
    float *vt = w.vt, *kT = w.kT, *kscl = w.kscl;
    for (int64_t j = 0; j < BT; j++) {
      const uint8_t *k0 = kb0 + (j0 + j) * s.kt0, *k1 = kb1 ? kb1 + (j0 + j) * s.kt1 : nullptr;
      if (j < n) decode_vec<KK>(k0, k1, nullptr, D, x->kcb, vt + j * D);  // (BT, D), then transposed
      else memset(vt + j * D, 0, D * sizeof(float));
      kscl[j] = j < n ? vec_scale<KK>(k1) : 0.f;
    }
    transpose_block(vt, kT, D);
    matmul(q, kT, sc, nrows, D, BT);
    for (int64_t r = 0; r < nrows; r++) {  // the row's visible keys [a, b): (dot + kb) * scale + bias
      float *sr = sc + r * BT;
      const int64_t a = lo[r] > j0 ? (lo[r] < j0 + n ? lo[r] - j0 : n) : 0,
                    b = hi[r] < j0 + n ? (hi[r] > j0 ? hi[r] - j0 : 0) : n;
      const float kr = kb ? kb[r] : 0.f, br = bias ? bias[r] : 0.f;
      if (kb) for (int64_t j = a; j < b; j++) sr[j] += kr;
      for (int64_t j = a; j < b; j++) sr[j] *= kscl[j];
      if (bias) for (int64_t j = a; j < b; j++) sr[j] += br;
      for (int64_t j = 0; j < n; j++) sr[j] = j < a || j >= b ? -INFINITY : sr[j];
    }
    return;
  }
#if TK_AVX2
  if (KK == AK4 && w.q8) score_few<KK, true>(w, j0, n, q, kb);
  else if (KK == TQ4 && w.q8) score_few<KK, true>(w, j0, n, q, w.kb);  // kb: the codebook offset per row
  else score_few<KK, false>(w, j0, n, q, kb);
  (void)alive;
#elif defined(__AVX512F__)
  {  // few rows (decode, a verification): the block's keys decoded once, 16 scored a row at a time
    alignas(64) float ks[BT] = {};
    for (int64_t j = 0; j < n; j++) {
      const uint8_t *k0 = kb0 + (j0 + j) * s.kt0, *k1 = kb1 ? kb1 + (j0 + j) * s.kt1 : nullptr;
      decode_once<KK>(k0, k1, nullptr, D, x->kcb, w.vt + j * D);
      ks[j] = vec_scale<KK>(k1);
    }
    if (n % 4) memset(w.vt + n * D, 0, (4 - n % 4) * D * sizeof(float));  // the last 4 keys' tail, scored unseen
    score_decoded(q, w.vt, ks, kb, bias, lo, hi, alive, nrows, j0, n, D, sc);
  }
#else
  // NEON: 4-bit affine and tq4 keys against the rows' int8 queries (w.q8; tq4's kb: the codebook offset per row)
  const bool i8 = TK_NEON && (is_ak(KK) || KK == TQ4) && w.q8;
  if (i8 && KK == TQ4) kb = w.kb;
  for (int64_t j = 0; j < n; j++) {  // few rows (decode): each key decoded once per 4 rows, or once (w.once)
    const int64_t tok = j0 + j;
    const uint8_t *k0 = kb0 + tok * s.kt0, *k1 = kb1 ? kb1 + tok * s.kt1 : nullptr;
    const float ks = vec_scale<KK>(k1);
    if (w.once && !i8) decode_once<KK>(k0, k1, nullptr, D, x->kcb, w.vt);
    for (int64_t r0 = 0; r0 < nrows; r0 += 4) {
      const int nr = nrows - r0 < 4 ? (int)(nrows - r0) : 4;
      float dots[4] = {0.f, 0.f, 0.f, 0.f};
      if (alive[r0] | alive[r0 + 1] | alive[r0 + 2] | alive[r0 + 3])
        with_rows(nr, [&](auto NR) ALWAYS_INLINE_LAMBDA {
#if TK_NEON
          if constexpr (KK == TQ4) if (i8) return dot_key_tq4_i8<NR>(w.q8 + r0 * D, w.q8s + r0, k0, D, x->klut, dots);
          if constexpr (KK == AK4) if (i8) return dot_key_i8<NR>(w.q8 + r0 * D, w.q8s + r0 * (D / 64), k0, D, dots);
#endif
          if (w.once) dot_decoded<NR>(q + r0 * D, w.vt, D, dots);
          else dot_key<KK, NR>(q + r0 * D, k0, k1, D, x->kcb, dots);
        });
      for (int u = 0; u < nr; u++) {
        const int64_t r = r0 + u;
        float v = dots[u];
        if (kb) v += kb[r];
        v *= ks;
        if (bias) v += bias[r];
        if (tok < lo[r] || tok >= hi[r]) v = -INFINITY;
        sc[r * BT + j] = v;
      }
    }
  }
#endif
}

#if defined(__AVX512F__)
// A 16 x 16 tile of floats transposed in registers: r[k] becomes column k.
static inline void transpose16(__m512 *r) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) {
      t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xDD);
    }
  for (int k = 0; k < 8; k++) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
  }
}
#endif

// KVarN values: each row's zero-point sum z[r] = sum_j sc[r][j] zs[j] over a block, the
// products rounded, then added in order from 0, as a scalar loop adds them. AVX-512: 16 rows
// at a time, rows in lanes (their products transposed), so that no lane is extracted to be
// added (a scalar loop's in-order vector reduction extracts each one); the same sums.
static void zero_point_sums(const float *sc, const float *zs, int64_t nrows, float *z) {
#if defined(__AVX512F__)
  const __m512 z0 = _mm512_loadu_ps(zs), z1 = _mm512_loadu_ps(zs + 16);
  for (int64_t r0 = 0; r0 < nrows; r0 += 16) {
    const int64_t nr = nrows - r0 < 16 ? nrows - r0 : 16;
    __m512 a[16], b[16];  // products 0-15 and 16-31 of each row, then of each column
    for (int k = 0; k < 16; k++) {
      a[k] = k < nr ? _mm512_mul_ps(_mm512_loadu_ps(sc + (r0 + k) * BT), z0) : _mm512_setzero_ps();
      b[k] = k < nr ? _mm512_mul_ps(_mm512_loadu_ps(sc + (r0 + k) * BT + 16), z1) : _mm512_setzero_ps();
    }
    transpose16(a);
    transpose16(b);
    __m512 s = _mm512_setzero_ps();
    for (int j = 0; j < 16; j++) s = _mm512_add_ps(s, a[j]);
    for (int j = 0; j < 16; j++) s = _mm512_add_ps(s, b[j]);
    _mm512_mask_storeu_ps(z + r0, (__mmask16)((1u << nr) - 1), s);
  }
#else
  for (int64_t r = 0; r < nrows; r++) {
    float zr = 0.f;
    for (int64_t j = 0; j < BT; j++) zr += sc[r * BT + j] * zs[j];
    z[r] = zr;
  }
#endif
}

// The rows' states += their softmax weights (w.sc) times the values of tokens j0 .. j0+n-1.
template <int VK>
static void value_block(Work &w, int64_t j0, int64_t n) {
  const Ctx *x = w.x;
  const Seg &s = *w.s;
  const int64_t Dv = x->Dv, W = Dv + 2, nrows = w.nrows;
  const char *alive = w.alive;
  float *sc = w.sc, *out = w.part;  // out: where the block's sums go
  const uint8_t *v0 = w.v[0] + j0 * s.vt0, *v1 = w.v[1] ? w.v[1] + j0 * s.vt1 : nullptr;
  const uint8_t *v2 = is_ab(VK) ? w.v[2] + j0 * s.vt2 : nullptr;
  if constexpr (has_mult(VK)) {  // weights times each token's own multiplier
    alignas(64) float vs[BT] = {};
    for (int64_t j = 0; j < n; j++) vs[j] = f16s(v1 + j * s.vt1);
    if constexpr (is_av(VK)) {  // KVarN: the zero points' sum per row first, and the sums in code units
      const uint8_t *zp = w.v[2] + j0 * s.vt2;
      alignas(64) float zs[BT] = {};
      for (int64_t j = 0; j < n; j++) zs[j] = f16s(zp + j * s.vt2);
      zero_point_sums(sc, zs, nrows, w.z);
      if (!w.many) {  // many rows: the matmul's own output (pv) holds the sums
        out = w.tmp;
        memset(out, 0, nrows * W * sizeof(float));
      }
    }
    for (int64_t r = 0; r < nrows; r++)
      for (int64_t j = 0; j < BT; j++) sc[r * BT + j] *= vs[j];
  }
#if TK_I8
  if (VK == TQ4 && x->i8v) {
    for (int64_t r0 = 0; r0 < nrows; r0 += 2) {
      if (!(alive[r0] | alive[r0 + 1])) continue;
      float *o = out + r0 * W;
      const float *wr = sc + r0 * BT;
      if (nrows - r0 == 1) add_values_tq4_i8<1>(o, W, wr, v0, s.vt0, n, Dv, x->vlut, x->vstep);
      else add_values_tq4_i8<2>(o, W, wr, v0, s.vt0, n, Dv, x->vlut, x->vstep);
    }
    return;
  }
#endif
  if (w.many) {  // many rows (prefill): the block's values decoded once, one matmul
    float *vt = w.vt, *pv = w.pv;
    for (int64_t j = 0; j < BT; j++) {
      if (j < n)
        decode_vec<VK>(v0 + j * s.vt0, v1 ? v1 + j * s.vt1 : nullptr, v2 ? v2 + j * s.vt2 : nullptr, Dv, x->vcb,
                       vt + j * Dv);
      else memset(vt + j * Dv, 0, Dv * sizeof(float));
    }
    matmul(sc, vt, pv, nrows, BT, Dv);  // (rows, BT) @ (BT, Dv)
    if constexpr (!is_av(VK))
      for (int64_t r = 0; r < nrows; r++) {
        if (!alive[r]) continue;
        float *o = out + r * W;
        const float *a = pv + r * Dv;
        for (int64_t i = 0; i < Dv; i++) o[i] += a[i];
      }
#if TK_I8_FEW
  } else if (VK == AV4 && x->i8av) {  // KVarN 4-bit values: integer sums, two rows at a time
    for (int64_t r = 0; r < nrows; r++) {  // the codes' centre: 8 times the weights' sum
      float sw = 0.f;
      for (int64_t j = 0; j < n; j++) sw += sc[r * BT + j];
      w.z[r] += 8 * sw;
    }
    for (int64_t r0 = 0; r0 < nrows; r0 += 2) {
      if (!(alive[r0] | alive[r0 + 1])) continue;
      if (nrows - r0 == 1) add_values_av4_i8<1>(out + r0 * W, W, sc + r0 * BT, v0, s.vt0, n, Dv);
      else add_values_av4_i8<2>(out + r0 * W, W, sc + r0 * BT, v0, s.vt0, n, Dv);
    }
#endif
#if TK_AVX2
  } else if constexpr (VK != F32 && VK != F16 && VK != BF16) {  // codes: each token decoded once, for all rows
#else
  } else if (is_ab(VK) && Dv % 32) {  // KIVI values with a scale per 16 channels: decoded first
#endif
    float *vt = w.vt;
    for (int64_t j = 0; j < n; j++)
      decode_vec<VK>(v0 + j * s.vt0, v1 ? v1 + j * s.vt1 : nullptr, v2 ? v2 + j * s.vt2 : nullptr, Dv, x->vcb,
                     vt + j * Dv);
    for (int64_t r0 = 0; r0 < nrows; r0 += 3) {
      const int nr = nrows - r0 < 3 ? (int)(nrows - r0) : 3;
      if (!(alive[r0] | alive[r0 + 1] | alive[r0 + 2])) continue;
      float *o = out + r0 * W;
      const float *wr = sc + r0 * BT;
      switch (nr) {
        case 1: add_decoded<1>(o, W, wr, vt, n, Dv); break;
        case 2: add_decoded<2>(o, W, wr, vt, n, Dv); break;
        default: add_decoded<3>(o, W, wr, vt, n, Dv); break;
      }
    }
  } else {
#if !TK_AVX2
    if (w.once)
      for (int64_t j = 0; j < n; j++)
        decode_once<VK>(v0 + j * s.vt0, v1 ? v1 + j * s.vt1 : nullptr, v2 ? v2 + j * s.vt2 : nullptr, Dv, x->vcb,
                        w.vt + j * Dv);
#endif
#if defined(__AVX512F__)
    if (w.once) add_rows_decoded(out, W, sc, w.vt, alive, nrows, n, Dv);
    else
#endif
    for (int64_t r0 = 0; r0 < nrows; r0 += VROWS) {
      const int nr = nrows - r0 < VROWS ? (int)(nrows - r0) : VROWS;
      if (!(alive[r0] | alive[r0 + 1] | alive[r0 + 2] | alive[r0 + 3])) continue;
      float *o = out + r0 * W;
      const float *wr = sc + r0 * BT;
      with_rows(nr, [&](auto NR) ALWAYS_INLINE_LAMBDA {
#if !TK_AVX2
        if (w.once) return add_values_decoded<NR>(o, W, wr, w.vt, n, Dv);
#endif
        add_values<VK, NR>(o, W, wr, v0, v1, v2, s.vt0, s.vt1, s.vt2, n, Dv, x->vcb);
      });
    }
  }
  if constexpr (is_av(VK)) {  // KVarN: the block's code-unit sums times the tile's channel scales
    float *C = w.cv;  // in the sums' lane order, kept while the tile lasts
    if (j0 / s.vd3 != w.vtile) {
      w.vtile = j0 / s.vd3;
      const uint8_t *cs = w.v[3] + w.vtile * s.vt3;
      for (int64_t i = 0; i < Dv; i++) C[i] = f16s(cs + 2 * x->vch[i]);
    }
    for (int64_t r = 0; r < nrows; r++) {
      if (!alive[r]) continue;
      float *o = w.part + r * W;
      const float *t = w.many ? w.pv + r * Dv : w.tmp + r * W, zr = w.z[r];
      for (int64_t i = 0; i < Dv; i++) o[i] += C[i] * (t[i] + zr);
    }
  }
}

typedef void (*block_fn)(Work &, int64_t, int64_t);
static const block_fn SCORE[NKINDS] = {
    score_block<F32>, score_block<F16>, score_block<BF16>, score_block<Q8_0>, score_block<TQ4>, score_block<Q4_0>,
    score_block<TQ3>, score_block<TQ2>, score_block<AK4>, score_block<AK3>, score_block<AK2>};
static const block_fn VALUE[NKINDS] = {
    value_block<F32>, value_block<F16>, value_block<BF16>, value_block<Q8_0>, value_block<TQ4>, value_block<Q4_0>,
    value_block<TQ3>, value_block<TQ2>, nullptr, nullptr, nullptr, value_block<AV4>, value_block<AV3>,
    value_block<AV2>, value_block<AB4>, value_block<AB3>, value_block<AB2>};

// One chunk: its rows over one segment's tokens [a, e), 32-token blocks aligned to the
// segment's start (so a block never straddles a KVarN tile or KIVI group), each scored,
// folded into the rows' online softmax and its values summed.
static void chunk_fn_attn(const void *p, int64_t c) {
  const Ctx *x = (const Ctx *)p;
  const int64_t *ch = x->chunks + CH * c;
  const Seg &s = x->segs[ch[0]];
  const int64_t h = ch[1], a = ch[2], e = ch[3], ra = ch[4], nrows = ch[5] - ch[4];
  const int64_t R = x->R, T = x->T, D = x->D, Dv = x->Dv, W = Dv + 2;
  Work w = {};
  w.x = x; w.s = &s; w.nrows = nrows; w.hr0 = h * R + ra; w.kgroup = -1;
  w.q = (s.body ? x->qb : x->qx) + w.hr0 * D;
  w.bias = s.body ? x->bias + w.hr0 : nullptr;
  w.part = x->part + x->poff[c];
  for (int64_t r = 0; r < nrows; r++) {
    float *o = w.part + r * W;
    for (int64_t i = 0; i < Dv; i++) o[i] = 0.f;
    o[Dv] = -INFINITY; o[Dv + 1] = 0.f;
  }
  const bool many = (x->prow ? x->prow : nrows) >= PRE_ROWS;
  const bool once = !TK_AVX2 && !many && nrows > VROWS;
  const bool decoded = many || once || TK_AVX2 || TK_512 || (is_ab(s.vkind) && Dv % 32);  // a block decoded first
  avec<float> sc(nrows * BT), kT(many ? D * BT : 0), kscl(BT), vt(decoded ? BT * (D > Dv ? D : Dv) : 0),
      pv(many ? nrows * Dv : 0), qt(is_ak(s.kkind) ? nrows * D : 0), kb(nrows),
      tmp(is_av(s.vkind) && !many ? nrows * W : 0), z(nrows), lanes(TK_AVX2 && !many ? nrows * 64 : 0),
      cv(is_av(s.vkind) ? Dv : 0);
  std::vector<int64_t> lo(nrows), hi(nrows);
  std::vector<char> alive(nrows + 4, 0);
  const int64_t *rg = x->ranges + ch[0] * T * 2;
  for (int64_t r = 0; r < nrows; r++) {
    const int64_t t = (ra + r) % T;
    // a steps call's piece k of a row: [lo + k step, lo + (k + 1) step) of its own range, as its decode step splits it
    const int64_t a_r = ch[6] < 0 ? a : rg[2 * t] + ch[6] * x->step, e_r = ch[6] < 0 ? e : a_r + x->step;
    lo[r] = rg[2 * t] > a_r ? rg[2 * t] : a_r;
    hi[r] = rg[2 * t + 1] < e_r ? rg[2 * t + 1] : e_r;
  }
  w.sc = sc.data(); w.kT = kT.data(); w.kscl = kscl.data(); w.vt = vt.data(); w.pv = pv.data();
  w.qt = qt.data(); w.kb = kb.data(); w.tmp = tmp.data(); w.z = z.data(); w.cv = cv.data(); w.vtile = -1;
  w.many = many; w.once = once; w.lanes = lanes.data();
  const bool i8ak = x->i8ak && s.kkind == AK4 && !many && s.kd2 >= 128;  // not per 32 tokens (KIVI): too few to pay
  avec<int8_t> q8(i8ak ? nrows * D : 0);
  avec<float> q8s(i8ak ? nrows * (D / 64) : 0);
  if (i8ak) { w.q8 = q8.data(); w.q8s = q8s.data(); }
  if (TK_I8_FEW && x->i8k && s.kkind == TQ4 && !many) {  // tq4 keys: the int8 queries of prep_rows
    w.q8 = x->q8 + w.hr0 * D; w.q8s = x->q8mul + w.hr0;
    for (int64_t r = 0; r < nrows; r++) w.kb[r] = -(float)x->q8sum[w.hr0 + r] * x->q8mul[w.hr0 + r];
  }
  w.lo = lo.data(); w.hi = hi.data(); w.alive = alive.data();
  const uint8_t *kp[4] = {s.k0, s.k1, s.k2, s.k3}, *vp[4] = {s.v0, s.v1, s.v2, s.v3};
  const int64_t kh[4] = {s.kh0, s.kh1, s.kh2, s.kh3}, vh[4] = {s.vh0, s.vh1, s.vh2, s.vh3};
  for (int i = 0; i < 4; i++) {
    w.k[i] = kp[i] ? kp[i] + h * kh[i] : nullptr;
    w.v[i] = vp[i] ? vp[i] + h * vh[i] : nullptr;
  }
  const block_fn score = SCORE[s.kkind], value = VALUE[s.vkind];
  for (int64_t j0 = a - a % BT; j0 < e; j0 += BT) {
    const int64_t j1 = j0 + BT < e ? j0 + BT : e, n = j1 - j0;
    bool any = false;
    for (int64_t r = 0; r < nrows; r++) {
      alive[r] = (lo[r] > j0 ? lo[r] : j0) < (hi[r] < j1 ? hi[r] : j1);
      any |= alive[r];
    }
    if (!any) continue;
    score(w, j0, n);
    for (int64_t r = 0; r < nrows; r++) {  // online softmax per row (the block's tail as -inf)
      float *sr = sc.data() + r * BT;
      for (int64_t j = n; j < BT; j++) sr[j] = -INFINITY;
      if (alive[r]) alive[r] = softmax_block(sr, w.part + r * W, Dv);
      if (!alive[r]) for (int64_t j = 0; j < BT; j++) sr[j] = 0.f;
    }
    value(w, j0, n);
  }
}
}  // namespace attn

// Which sides may take the int8 tq4 path: bit 0 keys, bit 1 values (default both).
static int g_int8_mask = 3;
extern "C" int tk_attn_int8(int mask) {
  if (mask >= 0) g_int8_mask = mask;
  return TK_I8 || TK_I8_FEW ? g_int8_mask : 0;
}

namespace attn {
static const int64_t PREP_ROWS = 16;

// Rows x (n, D) times R^T (to the code domain: H of x * signs) or R (back: H of x, then
// * signs), R = H diag(signs) / sqrt(hb) per block: a fast Walsh-Hadamard transform.
static void rotate_rows(float *x, int64_t n, int64_t D, const float *signs, int64_t hb, bool to_code) {
  const float norm = 1.0f / sqrtf((float)hb);
  for (int64_t r = 0; r < n; r++) {
    float *v = x + r * D;
    if (to_code) for (int64_t i = 0; i < D; i++) v[i] *= signs[i];
    hadamard_blocks(v, D, hb);
    for (int64_t i = 0; i < D; i++) v[i] *= to_code ? norm : norm * signs[i];
  }
}

// Rows hr = 16c .. 16c+15: the exact-domain query (scaled), the code-domain query
// (kscale, rotation, scale; tq4 lanes permuted even|odd per 32), its int8 form, the bias q.kcenter.
static void prep_rows(const void *p, int64_t c) {
  const Ctx *x = (const Ctx *)p;
  const int64_t D = x->D, n = x->Hkv * x->R, h0 = c * PREP_ROWS;
  const int64_t nb = n - h0 < PREP_ROWS ? n - h0 : PREP_ROWS;
  avec<float> a(PREP_ROWS * D), rot(PREP_ROWS * D);
  for (int64_t k = 0; k < nb; k++) {
    const int64_t hr = h0 + k, h = hr / x->R;
    const float *qr = x->q + hr * D;
    float *ox = x->qx + hr * D;
    for (int64_t i = 0; i < D; i++) ox[i] = qr[i] * x->scale;
    for (int64_t i = 0; i < D; i++) a[k * D + i] = x->kscale ? qr[i] * x->kscale[h * D + i] : qr[i];
  }
  if (!x->any_body) return;
  rot = a;
  if (x->ksigns) rotate_rows(rot.data(), nb, D, x->ksigns, x->khb, true);  // (q * kscale) R_k^T
  for (int64_t k = 0; k < nb; k++) {
    const int64_t hr = h0 + k, h = hr / x->R;
    const float *qr = x->q + hr * D, *tmp = rot.data() + k * D;
    float *ob = x->qb + hr * D;
    for (int64_t i = 0; i < D; i++) ob[i] = tmp[x->ksrc[i]] * x->scale;
    if (x->i8k) {  // int8 query in nibble order (q8src), its byte sum times the codebook's offset
      float mx = 0.f;
      for (int64_t i = 0; i < D; i++) mx = fabsf(tmp[i]) > mx ? fabsf(tmp[i]) : mx;
      const float qs = mx > 0 ? mx * x->scale / 127 : 1.f, inv = x->scale / qs;
      int8_t *o8 = x->q8 + hr * D;
      int32_t sum = 0;
      for (int64_t i = 0; i < D; i++) {
        const int v = (int)lrintf(tmp[x->q8src[i]] * inv);
        o8[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        sum += o8[i];
      }
      x->q8sum[hr] = LUT_OFF * sum;
      x->q8mul[hr] = qs * x->kstep;
    }
    if (x->kcenter) {
      float b = 0.f;
      for (int64_t i = 0; i < D; i++) b += qr[i] * x->kcenter[h * D + i];
      x->bias[hr] = b * x->scale;
    }
  }
}

// Rows hr = 16c .. 16c+15: merge their chunks' partial states by log-sum-exp; the
// body's sum is un-permuted, rotated back (acc_c R_v), scaled and centred once.
static void merge_rows(const void *p, int64_t c) {
  const Ctx *x = (const Ctx *)p;
  const int64_t Dv = x->Dv, W = Dv + 2, n = x->Hkv * x->R, h0 = c * PREP_ROWS;
  const int64_t nb = n - h0 < PREP_ROWS ? n - h0 : PREP_ROWS;
  avec<float> accs(PREP_ROWS * Dv), accc(Dv), cperm(PREP_ROWS * Dv, 0.f), y(PREP_ROWS * Dv), ls(2 * PREP_ROWS);
  // pass 1: each row's exact-domain sum (accs), its code-domain sum un-permuted (cperm), l and l_c
  for (int64_t k = 0; k < nb; k++) {
    const int64_t hr = h0 + k;
    const int64_t h = hr / x->R, r = hr % x->R, tile = h * ((x->R + x->rt - 1) / x->rt) + r / x->rt;
    const int64_t *mine = x->row_chunks + x->row_first[tile], nm = x->row_first[tile + 1] - x->row_first[tile];
    float m = -INFINITY;
    for (int64_t kk = 0; kk < nm; kk++) {
      const int64_t ci = mine[kk];
      const float mc = x->part[x->poff[ci] + (r - x->chunks[CH * ci + 4]) * W + Dv];
      m = mc > m ? mc : m;
    }
    const float sink = x->sinks ? x->sinks[hr / x->T] : -INFINITY;  // row hr: query head hr / T
    m = sink > m ? sink : m;
    float l = x->sinks ? expf(sink - m) : 0.f, lc = 0.f;
    float *acc = accs.data() + k * Dv;
    for (int64_t i = 0; i < Dv; i++) acc[i] = accc[i] = 0.f;
    for (int64_t kk = 0; kk < nm; kk++) {
      const int64_t ci = mine[kk];
      const float *pc = x->part + x->poff[ci] + (r - x->chunks[CH * ci + 4]) * W;
      if (pc[Dv] == -INFINITY) continue;
      const float w = expf(pc[Dv] - m);
      const bool body = x->segs[x->chunks[CH * ci]].body;
      float *dst = body ? accc.data() : acc;
      for (int64_t i = 0; i < Dv; i++) dst[i] += w * pc[i];
      l += w * pc[Dv + 1];
      if (body) lc += w * pc[Dv + 1];
    }
    if (x->any_body)
      for (int64_t i = 0; i < Dv; i++) cperm[k * Dv + i] = accc[x->vsrc[i]];
    ls[2 * k] = l; ls[2 * k + 1] = lc;
  }
  // pass 2: y = acc_c @ R_v for the block's rows at once, then scale, centre and normalize
  if (x->any_body) {
    y = cperm;
    if (x->vsigns) rotate_rows(y.data(), nb, Dv, x->vsigns, x->vhb, false);  // acc_c R_v
  }
  for (int64_t k = 0; k < nb; k++) {
    const int64_t hr = h0 + k, h = hr / x->R;
    float *acc = accs.data() + k * Dv, *o = x->out + hr * Dv;
    if (x->any_body)
      for (int64_t i = 0; i < Dv; i++) {
        float v = y[k * Dv + i] * (x->vscale ? x->vscale[h * Dv + i] : 1.f);
        if (x->vcenter) v += ls[2 * k + 1] * x->vcenter[h * Dv + i];
        acc[i] += v;
      }
    const float inv = ls[2 * k] > 0 ? 1.f / ls[2 * k] : 0.f;
    for (int64_t i = 0; i < Dv; i++) o[i] = acc[i] * inv;
  }
}
}  // namespace attn

// Returns 0, or 1 for an unsupported shape. Decode (R <= ROW_TILE rows per KV head):
// chunks split each segment's tokens; prefill: chunks are (segment, head, row tile)
// over the tile's whole visible range, and rows skip the blocks they cannot see.
extern "C" int tk_attn(const attn::AttnArgs *args) {
  using namespace attn;
  const float *q = args->q, *ksigns = args->ksigns, *kscale = args->kscale, *kcenter = args->kcenter;
  const float *vsigns = args->vsigns, *vscale = args->vscale, *vcenter = args->vcenter, *kcb = args->kcb,
              *vcb = args->vcb;
  const int64_t Hkv = args->Hkv, R = args->R, T = args->T, D = args->D, Dv = args->Dv, khb = args->khb,
                vhb = args->vhb, nseg = args->nseg, chunk_tokens = args->chunk_tokens;
  const int64_t *ranges = args->ranges;
  const float scale = args->scale;
  float *out = args->out;
  const int nth = args->nth;
  if (D % 16 || Dv % 16 || D > 1024 || Dv > 1024 || R < 1 || T < 1 || R % T) return 1;
  Ctx cx = {};
  if ((ksigns && (khb < 1 || (khb & (khb - 1)) || D % khb)) || (vsigns && (vhb < 1 || (vhb & (vhb - 1)) || Dv % vhb)))
    return 1;
  cx.q = q; cx.ksigns = ksigns; cx.khb = khb; cx.kscale = kscale; cx.kcenter = kcenter; cx.vsigns = vsigns;
  cx.vhb = vhb; cx.vscale = vscale;
  cx.vcenter = vcenter; cx.scale = scale; cx.Hkv = Hkv; cx.R = R; cx.T = T; cx.D = D; cx.Dv = Dv;
  cx.segs = args->segs; cx.ranges = ranges;
  for (int64_t i = 0; i < nseg; i++) {
    const Seg &sg = cx.segs[i];
    if (sg.kkind < 0 || sg.kkind >= NKINDS || sg.vkind < 0 || sg.vkind >= NKINDS || !SCORE[sg.kkind] || !VALUE[sg.vkind])
      return 1;
    const bool k32 = sg.kkind == Q8_0 || sg.kkind == Q4_0, v32 = sg.vkind == Q8_0 || sg.vkind == Q4_0;
    if ((k32 && D % 32) || (v32 && Dv % 32)) return 1;  // llama.cpp's blocks are 32 channels
  }
  for (int64_t i = 0; i < nseg; i++)
    if (cx.segs[i].body) { cx.any_body = true; cx.kperm |= cx.segs[i].kkind == TQ4; cx.vperm |= cx.segs[i].vkind == TQ4; }
  // A steps call (a speculative verification) computes each query position as a decode step
  // of it alone would: all rows in one tile, each row's tokens split in pieces as its decode
  // step splits them (from the first token the row sees in each segment, wherever a sliding
  // window starts it), and every path chosen for the rows of one position (prow), not for the
  // rows of the call. Each row's sums then run the same operations in the same order (a row's
  // arithmetic never depends on the rows beside it).
  const int64_t ROW_TILE = 64, PARALLEL_MACS = 1 << 18;
  const int64_t rt = args->steps || R <= ROW_TILE ? R : ROW_TILE, prow = args->steps ? R / T : rt;
  cx.prow = args->steps ? prow : 0;
  // tq4 keys: VNNI in decode and prefill; AVX2 and NEON in decode steps (few rows per tile)
  cx.i8k = (g_int8_mask & 1) && cx.kperm && (TK_I8 ? D % 128 == 0 : TK_I8_FEW && D % 64 == 0 && prow < PRE_ROWS);
  cx.i8v = TK_I8 && (g_int8_mask & 2) && cx.vperm && Dv % 128 == 0;
  // AVX2 and NEON integer paths for 4-bit affine keys and KVarN values: decode steps (few rows per tile)
  bool av4 = false;
  for (int64_t i = 0; i < nseg; i++) av4 |= cx.segs[i].body && cx.segs[i].vkind == AV4;
  cx.i8ak = TK_I8_FEW && (g_int8_mask & 1) && D % 64 == 0 && prow < PRE_ROWS;
  // values: each pair of rows unpacks the codes again, so beyond 4 rows decoding once wins
  cx.i8av = TK_I8_FEW && (g_int8_mask & 2) && Dv % 64 == 0 && prow <= 4 && av4;
  const int64_t rows = Hkv * R;
  std::vector<int32_t> ksrc(D), q8src(D), vsrc(Dv);
  // tq4 lanes: per block of w = 32 channels (16 in a tail) the even channels, then the odd
  for (int64_t i = 0; i < D; i++) {
    const int64_t b0 = i / 32 * 32, h = b0 + 32 <= D ? 16 : 8, l = i - b0;
    ksrc[i] = cx.kperm ? b0 + (l < h ? 2 * l : 2 * (l - h) + 1) : i;
    q8src[i] = (i / Q8_RUN) * Q8_RUN + 2 * (i % (Q8_RUN / 2)) + (i % Q8_RUN) / (Q8_RUN / 2);
  }
  std::vector<int32_t> vch(Dv);
  for (int64_t i = 0; i < Dv; i++) {
    const int64_t b0 = i / 32 * 32, h = b0 + 32 <= Dv ? 16 : 8, l = i - b0;
    vsrc[i] = cx.i8v ? i8v_pos(i) : cx.i8av ? av4_pos(i) : cx.vperm ? b0 + (l % 2 ? h + l / 2 : l / 2) : i;
    vch[vsrc[i]] = (int32_t)i;
  }
  cx.vch = vch.data();
  cx.ksrc = ksrc.data(); cx.q8src = q8src.data(); cx.vsrc = vsrc.data();
  avec<float> qx(rows * D), qb(cx.any_body ? rows * D : 0), bias(rows, 0.f), q8mul(rows, 0.f);
  avec<int8_t> q8(cx.i8k ? rows * D : 0);
  std::vector<int32_t> q8sum(rows, 0);
  float kstep = 0.f, vstep = 0.f;
  for (int i = 0; i < 16 && kcb; i++) kstep = fabsf(kcb[i]) > kstep ? fabsf(kcb[i]) : kstep;
  for (int i = 0; i < 16 && vcb; i++) vstep = fabsf(vcb[i]) > vstep ? fabsf(vcb[i]) : vstep;
  cx.kstep = kstep = kstep > 0 ? kstep / (LUT_OFF - 1) : 1.f;
  cx.vstep = vstep = vstep > 0 ? vstep / 127 : 1.f;
  cx.qx = qx.data(); cx.qb = qb.data(); cx.bias = bias.data(); cx.q8 = q8.data(); cx.q8sum = q8sum.data();
  cx.q8mul = q8mul.data();
  // per-row work is shared out only when there are many rows (prefill): for a decode
  // step it is tiny, and each pool round-trip costs a wake-up
  const int64_t nprep = (rows + PREP_ROWS - 1) / PREP_ROWS, nth_rows = rows >= 256 ? nth : 1;
  run_chunks(prep_rows, &cx, nprep, nth_rows);
  // chunks: per segment, head and row tile, the tile's visible token range, split in
  // pieces of chunk_tokens while a single tile holds all rows (decode). A steps call splits
  // each row's own range from its first token (a sliding window starts a token later at each
  // position): piece k of every row in one chunk, over the union of those pieces.
  const int64_t ntiles = (R + rt - 1) / rt;
  const bool split = ntiles == 1;
  std::vector<int64_t> chunks, poff;
  std::vector<std::vector<int64_t>> per_tile(Hkv * ntiles);
  int64_t total = 0, work = 0;  // work: token-row pairs scored
  auto add_chunk = [&](int64_t sgi, int64_t ti, int64_t c0, int64_t c1, int64_t r0, int64_t r1, int64_t k) {
    for (int64_t h = 0; h < Hkv; h++) {
      per_tile[h * ntiles + ti].push_back((int64_t)chunks.size() / CH);
      const int64_t v[CH] = {sgi, h, c0, c1, r0, r1, k};
      chunks.insert(chunks.end(), v, v + CH);
      poff.push_back(total);
      total += (r1 - r0) * (Dv + 2);
      work += (c1 - c0) * (r1 - r0);
    }
  };
  for (int64_t sgi = 0; sgi < nseg; sgi++)
    for (int64_t ti = 0; ti < ntiles; ti++) {
      const int64_t r0 = ti * rt, r1 = r0 + rt < R ? r0 + rt : R;
      const int64_t *rg = ranges + sgi * T * 2;
      int64_t a = INT64_MAX, e = 0, pieces = 0;
      for (int64_t t = 0; t < (r1 - r0 < T ? r1 - r0 : T); t++) {  // the positions' ranges (rows r and r + T alike)
        const int64_t lo = rg[2 * ((r0 + t) % T)], hi = rg[2 * ((r0 + t) % T) + 1];
        if (hi <= lo) continue;
        a = lo < a ? lo : a; e = hi > e ? hi : e;
        const int64_t np = (hi - lo + chunk_tokens - 1) / chunk_tokens;
        pieces = np > pieces ? np : pieces;
      }
      if (e <= a) continue;
      if (!args->steps) {
        const int64_t step = split ? chunk_tokens : e - a;
        for (int64_t c0 = a; c0 < e; c0 += step) add_chunk(sgi, ti, c0, c0 + step < e ? c0 + step : e, r0, r1, -1);
        continue;
      }
      for (int64_t k = 0; k < pieces; k++) {  // piece k's union over the rows that have one
        int64_t c0 = INT64_MAX, c1 = 0;
        for (int64_t t = 0; t < T; t++) {
          const int64_t lo = rg[2 * t], hi = rg[2 * t + 1], p0 = lo + k * chunk_tokens;
          if (hi <= p0) continue;
          c0 = p0 < c0 ? p0 : c0;
          const int64_t p1 = p0 + chunk_tokens < hi ? p0 + chunk_tokens : hi;
          c1 = p1 > c1 ? p1 : c1;
        }
        add_chunk(sgi, ti, c0, c1, r0, r1, k);
      }
    }
  cx.step = chunk_tokens;
  const int64_t nch = (int64_t)chunks.size() / CH;
  std::vector<int64_t> row_chunks, row_first(1, 0);
  for (auto &v : per_tile) { row_chunks.insert(row_chunks.end(), v.begin(), v.end()); row_first.push_back(row_chunks.size()); }
  avec<float> part(total);
  memset(&cx.kcb, 0, 64); memset(&cx.vcb, 0, 64);
  if (kcb) memcpy(&cx.kcb, kcb, 64);
  if (vcb) memcpy(&cx.vcb, vcb, 64);
  for (int i = 0; i < 64; i++) {
    const int ck = kcb ? (int)lrintf(kcb[i % 16] / kstep) : 0, cv = vcb ? (int)lrintf(vcb[i % 16] / vstep) : 0;
    cx.klut[i] = (uint8_t)(ck + LUT_OFF);
    cx.vlut[i] = (uint8_t)(int8_t)cv;
  }
  cx.chunks = chunks.data(); cx.poff = poff.data(); cx.part = part.data();
  cx.row_chunks = row_chunks.data(); cx.row_first = row_first.data(); cx.rt = rt; cx.out = out;
  cx.sinks = args->sinks;
  // a short history (a decode step at small depth) is scored on this thread: the pool's
  // round-trip would cost more than the split saves
  run_chunks(chunk_fn_attn, &cx, nch, nch > 1 && work * (D + Dv) >= PARALLEL_MACS ? nth : 1);
  run_chunks(merge_rows, &cx, nprep, nth_rows);
  return 0;
}
