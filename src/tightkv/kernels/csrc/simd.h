// 16-lane float (V) and int32 (VI) vectors for the block kernels, per instruction set; ld_f16
// and ld_bf16 widen 16 half or bfloat16 weights to a V.
#pragma once
#include "common.h"

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
static inline V ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline V ld_bf16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
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
static inline V ld_f16(const uint16_t *p) {
#if defined(__F16C__)
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
#else
  alignas(32) float f[16];
  for (int i = 0; i < 16; i++) f[i] = h2f((const uint8_t *)(p + i));
  return vld(f);
#endif
}
static inline V ld_bf16(const uint16_t *p) {
  __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))};
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
static inline V ld_f16(const uint16_t *p) {
  V r;
  for (int i = 0; i < 16; i++) r[i] = h2f((const uint8_t *)(p + i));
  return r;
}
static inline V ld_bf16(const uint16_t *p) {
  V r;
  for (int i = 0; i < 16; i++) r[i] = bf2f(p[i]);
  return r;
}
#endif

