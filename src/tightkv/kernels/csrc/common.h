// Shared by every kernel source: headers, the thread pool's entry point, helpers.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <new>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

// Run fn(ctx, c) for c in [0, nchunks) on up to nth threads (pool.cpp).
typedef void (*chunk_fn)(const void *ctx, int64_t chunk);
void run_chunks(chunk_fn fn, const void *ctx, int64_t nchunks, int nth);

// Scratch buffers start on a 64-byte boundary, so a kernel's 64-byte loads of a row never
// straddle two cache lines (such loads run at half rate; which buffers did was chance).
template <class T>
struct Aligned64 {
  typedef T value_type;
  Aligned64() = default;
  template <class U> Aligned64(const Aligned64<U> &) {}
  T *allocate(size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T *p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U> bool operator==(const Aligned64<U> &) const { return true; }
  template <class U> bool operator!=(const Aligned64<U> &) const { return false; }
};
template <class T>
using avec = std::vector<T, Aligned64<T>>;

// IEEE half precision: GCC's and clang's C++ call it _Float16 on x86-64, __fp16 on ARM
// (where it converts to and from float in hardware, as F16C does on x86).
#if defined(__aarch64__) || defined(__arm__)
typedef __fp16 half_t;
#else
typedef _Float16 half_t;
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define ALWAYS_INLINE_LAMBDA __attribute__((always_inline))
static inline float h2f(const uint8_t *p) { half_t h; memcpy(&h, p, 2); return (float)h; }
static inline float bf2f(uint16_t b) { const uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

// v (D) := v H per block of hb channels (H the unnormalized Hadamard matrix, hb a power of
// two dividing D): the butterflies of a fast Walsh-Hadamard transform, in place.
template <typename T>
static inline void hadamard_stages(T *v, int64_t D, int64_t hb, int64_t first) {  // butterflies of len >= first
  for (int64_t b0 = 0; b0 < D; b0 += hb)
    for (int64_t len = first; len < hb; len *= 2)
      for (int64_t i = b0; i < b0 + hb; i += 2 * len)
        for (int64_t j = i; j < i + len; j++) {
          const T a = v[j], b = v[j + len];
          v[j] = a + b; v[j + len] = a - b;
        }
}
template <typename T>
static inline void hadamard_blocks(T *v, int64_t D, int64_t hb) { hadamard_stages(v, D, hb, 1); }

// The same on floats, the butterflies within 16 (AVX-512) or 8 lanes (AVX2) in registers:
// lane j's partner j ^ len taken by a permute, a + b where bit len of j is clear and a - b
// where it is set, as the loops compute them (the same sums, bit for bit).
static inline void hadamard_blocks(float *v, int64_t D, int64_t hb) {
#if defined(__AVX512F__)
  if (hb % 16 == 0) {
    for (int64_t i = 0; i < D; i += 16) {
      __m512 x = _mm512_loadu_ps(v + i), p;
      p = _mm512_permute_ps(x, 0xB1), x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), 0xAAAA, p, x);
      p = _mm512_permute_ps(x, 0x4E), x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), 0xCCCC, p, x);
      p = _mm512_shuffle_f32x4(x, x, 0xB1), x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), 0xF0F0, p, x);
      p = _mm512_shuffle_f32x4(x, x, 0x4E), x = _mm512_mask_sub_ps(_mm512_add_ps(x, p), 0xFF00, p, x);
      _mm512_storeu_ps(v + i, x);
    }
    return hadamard_stages(v, D, hb, 16);
  }
#elif defined(__AVX2__)
  if (hb % 8 == 0) {
    for (int64_t i = 0; i < D; i += 8) {
      __m256 x = _mm256_loadu_ps(v + i), p;
      p = _mm256_permute_ps(x, 0xB1), x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xAA);
      p = _mm256_permute_ps(x, 0x4E), x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xCC);
      p = _mm256_permute2f128_ps(x, x, 0x01), x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xF0);
      _mm256_storeu_ps(v + i, x);
    }
    return hadamard_stages(v, D, hb, 8);
  }
#endif
  hadamard_stages(v, D, hb, 1);
}

// e^x within about an ulp, for any float x (clamped to [-87, 88], where e^x stays a normal
// float): x = n ln2 + r, ln2 in two parts (Cody and Waite) so r is exact, e^r by its Taylor
// series to r^7 (|r| <= ln2/2: the next term is below 1e-8), 2^n put in the exponent bits.
// Plain float operations, no branches: the loops over it vectorize, every lane alike.
static inline float exp_f(float x) {
  x = x < -87.f ? -87.f : x > 88.f ? 88.f : x;
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round to nearest
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, 4);
  return p * two_n;
}

#if defined(__AVX2__)
// The sum of the 8 lanes of an AVX2 float vector.
static inline float hsum8(__m256 s) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif
