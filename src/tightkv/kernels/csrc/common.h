// Shared by every kernel source: headers, the thread pool's entry point, helpers.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Run fn(ctx, c) for c in [0, nchunks) on up to nth threads (pool.cpp).
typedef void (*chunk_fn)(const void *ctx, int64_t chunk);
void run_chunks(chunk_fn fn, const void *ctx, int64_t nchunks, int nth);

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define ALWAYS_INLINE_LAMBDA __attribute__((always_inline))
static inline float h2f(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }
static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
