// Quantized matmul kernels: GGML blocks x float32 activations, and small per-token ops.
#include "gemv.h"

// The tables a type needs (lowbit.h); 0 for the types that need none.
static unsigned need_tables(int type) {
#define NEED(T) T::NEED
  static const unsigned need[] = {NEED(lowbit::IQ4_NL), NEED(lowbit::IQ4_XS), NEED(lowbit::Q1_0), NEED(lowbit::Q2_0),
                                  NEED(lowbit::TQ1_0), NEED(lowbit::TQ2_0), NEED(lowbit::IQ2_XXS), NEED(lowbit::IQ2_XS),
                                  NEED(lowbit::IQ2_S), NEED(lowbit::IQ3_XXS), NEED(lowbit::IQ3_S), NEED(lowbit::IQ1_S),
                                  NEED(lowbit::IQ1_M), NEED(lowbit::MXFP4), NEED(lowbit::NVFP4)};
  static_assert(sizeof(need) / sizeof(need[0]) == NTYPES - 10, "a table entry per IQ/FP4 type");
  return type >= 10 && type < NTYPES ? need[type - 10] : 0;
}

// Hand over lowbit.h's table `which` (once per loaded library, before any IQ/FP4 type runs).
extern "C" int tk_lowbit_table(int which, const void *data, int64_t nbytes) { return lowbit::set_table(which, data, nbytes); }

// 1 where every table type `type` needs is in place.
extern "C" int tk_lowbit_ready(int type) { return (need_tables(type) & ~lowbit::loaded) == 0; }

// 512, 256, 128 or 0: the SIMD width this build uses (AVX-512, AVX2, NEON with dot products,
// plain C).
extern "C" int tk_simd() {
#if defined(__AVX512F__)
  return 512;
#elif defined(__AVX2__) && defined(__FMA__)
  return 256;
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
  return 128;
#else
  return 0;
#endif
}

// 1 where tk_gemv quantizes the activations to int8 (groups of 32; blocks of 256 for Q4_K,
// Q5_K and Q6_K), 0 for float32.
extern "C" int tk_gemv_int8() { return TK_GEMV_I8; }

static chunk_fn bind_type(int type, PartCtx &g, const uint8_t *w, int64_t ldw, int64_t N, const Act &a, int64_t m0,
                          int mb, float *y, int64_t ldy, int nth) {
  auto group = type < 5 ? bind_legacy : type < 10 ? bind_kquants : type < 16 ? bind_lowbit : bind_grids;
  return group(type, g, w, ldw, N, a, m0, mb, y, ldy, nth);
}

// The activations of one call as its parts' kernels take them: the float rows (M, K); on the
// integer path their int8 groups of 32, and where a k-quant part takes them (Q4_K, Q5_K,
// Q6_K), blocks of 256 as llama.cpp's Q8_K. The buffers are the calling thread's, until its
// next call.
static bool blocks_of_256(int type) { return type >= 7 && type <= 9; }  // Q4_K, Q5_K, Q6_K (i8::KBlock)

#if TK_GEMM
std::atomic<uint64_t> i8::gemm_epoch{0};
// calls of this many rows or more take i8::gemm_rows: on VNNI more than a decode batch's most
// (gemv_max_rows, 40); on AVX2 from 96, where its unpacking of the weights pays (Gemma 3 270M's
// weights, ms per row at 25 / 32 / 64 / 96 / 512 rows: 1.56 / 1.43 / 1.14 / 1.15 / 0.93, the
// row kernel 1.2 at every count; bench/bench_qmatmul.py --crossover, Zen 5 capped to AVX2)
static const int64_t GEMM_ROWS = TK_GEMV_512 ? 41 : 96;
#else
static const int64_t GEMM_ROWS = 0;
#endif

// The fewest rows of a call that the GEMM takes; 0 where this build has none (it needs AVX2;
// AVX-512 builds without VNNI have none).
extern "C" int tk_gemm_rows() { return (int)GEMM_ROWS; }

// 1 where a call of weight type `type` and tk_gemm_rows() rows or more takes the GEMM: every
// block type with VNNI; on AVX2 the 32-weight types and the k-quants (types 0-9, i8::GemmSums),
// not the IQ and FP4 types, whose prompts take float32 tiles there.
extern "C" int tk_gemm_type(int type) {
  if (!GEMM_ROWS || type < 0 || type >= NTYPES) return 0;
  return TK_GEMM == 1 || type < 10;
}

static Act activations(const float *x, int64_t M, int64_t K, int n, const int *types) {
  Act a = {x, nullptr, nullptr, nullptr, nullptr, K, nullptr, nullptr, nullptr, nullptr};
#if TK_GEMV_I8
  thread_local avec<int8_t> q, kq;
  thread_local avec<float> d, hs, d8, kd;
  thread_local avec<int16_t> kbs;
  int kquants = 0;
  for (int i = 0; i < n; i++) kquants += blocks_of_256(types[i]);
  const bool gemm = GEMM_ROWS && M >= GEMM_ROWS;  // a prompt: every type takes the GEMM, on groups of 32
  if (kquants < n || gemm) {
    q.resize(M * K); d.resize(M * K / 32); hs.resize(M * K / 16);
    if (TK_GEMV_512) d8.resize((M * K / 64 + 1) * 32);  // whole pairs of groups
    i8::quantize_rows(x, M, K, q.data(), d.data(), hs.data(), TK_GEMV_512 ? d8.data() : nullptr);
    a.q = q.data(); a.d = d.data(); a.hs = hs.data(); a.d8 = TK_GEMV_512 ? d8.data() : nullptr;
  }
  if (kquants && K % 256 == 0 && !gemm) {
    kq.resize(M * K); kd.resize(M * K / 256); kbs.resize(M * K / 16);
    i8::quantize_rows_k(x, M, K, kq.data(), kd.data(), kbs.data());
    a.kq = kq.data(); a.kd = kd.data(); a.kbs = kbs.data();
  }
#if TK_GEMM
  if (gemm) {  // the activations as unsigned bytes for the GEMM
    thread_local avec<uint8_t> qu;
    qu.resize(M * K);
    const int8_t *src = q.data();  // plain pointers: a thread_local's every access is a TLS lookup
    uint8_t *dst = qu.data();
    for (int64_t i = 0; i < M * K; i++) dst[i] = (uint8_t)(src[i] ^ 0x80);
    a.qu = dst;
    i8::gemm_epoch.fetch_add(1, std::memory_order_relaxed);
  }
#endif
#endif
  return a;
}

// Chunks of the parts of one product, numbered one after another. A chunk (a range of one
// part's weight rows) runs every group of MB activation rows in turn, so that its weights
// are read from memory once and stay in cache while a prompt's rows pass over them; each
// (weight row, activation row) pair computes as it would in a call of its group alone.
static const int MAX_PARTS = 16;  // (gate and up of 8 routed experts)
struct Parts {
  int n, groups;        // parts, groups of activation rows
  const chunk_fn *fn;   // (n, groups)
  const PartCtx *ctx;   // (n, groups)
  int64_t nchunks[MAX_PARTS];
};
static void parts_chunk(const void *p, int64_t c) {
  const Parts *s = (const Parts *)p;
  int i = 0;
  while (c >= s->nchunks[i]) c -= s->nchunks[i++];
  for (int k = i * s->groups; k < (i + 1) * s->groups; k++) s->fn[k](&s->ctx[k], c);
}

// y (M, sum N) = x (M, K) times the n weight matrices (N_i, K) side by side: the
// activations are quantized once and every part's rows share one pass of the pool.
// 0 on success; 1 a bad shape, 2 an unknown type, 3 a type's tables not loaded.
extern "C" int tk_gemv_parts(int n, const int *types, const uint8_t *const *ws, const int64_t *ldws, const int64_t *Ns,
                             int64_t K, const float *x, int64_t M, float *y, int nth) {
  if (n < 1 || n > MAX_PARTS || K % 32) return 1;
  int64_t ldy = 0;
  for (int i = 0; i < n; i++) {
    if (types[i] < 0 || types[i] >= NTYPES) return 2;
    if (!tk_lowbit_ready(types[i])) return 3;
    ldy += Ns[i];
  }
  if (M < 1) return 0;
  const Act a = activations(x, M, K, n, types);
  const int groups = (int)((M + MB - 1) / MB);
  thread_local std::vector<PartCtx> ctx;
  thread_local std::vector<chunk_fn> fn;
  ctx.resize((size_t)n * groups);
  fn.resize((size_t)n * groups);
  Parts s = {n, groups, fn.data(), ctx.data(), {}};
  int64_t col = 0, total = 0;
  for (int i = 0; i < n; i++) {
    for (int g = 0; g < groups; g++) {
      const int64_t m0 = g * MB, k = (int64_t)i * groups + g;
      fn[k] = bind_type(types[i], ctx[k], ws[i], ldws[i], Ns[i], a, m0, (int)(M - m0 < MB ? M - m0 : MB), y + col, ldy, nth);
      if (!fn[k]) return 1;
    }
    const int64_t rows = ctx[(size_t)i * groups].rows;
    s.nchunks[i] = (Ns[i] + rows - 1) / rows;
    col += Ns[i];
    total += s.nchunks[i];
  }
  if (n == 1 && groups == 1)
    run_chunks(fn[0], &ctx[0], total, nth);
  else
    run_chunks(parts_chunk, &s, total, nth);
  return 0;
}

// y (n, N): row i = weight matrix i (N, K) times row i of x (n, K), for n parts that each take
// their own activations (the routed experts' down projections, each over its own expert's
// gated unit): the rows are quantized once and every part's rows share one pass of the pool,
// with the arithmetic of tk_gemv_parts on each row. 0 on success; as tk_gemv_parts otherwise.
extern "C" int tk_gemv_each(int n, const int *types, const uint8_t *const *ws, const int64_t *ldws, int64_t N,
                            int64_t K, const float *x, float *y, int nth) {
  if (n < 1 || n > MAX_PARTS || K % 32) return 1;
  for (int i = 0; i < n; i++) {
    if (types[i] < 0 || types[i] >= NTYPES) return 2;
    if (!tk_lowbit_ready(types[i])) return 3;
  }
  const Act a = activations(x, n, K, n, types);
  PartCtx ctx[MAX_PARTS];
  chunk_fn fn[MAX_PARTS];
  Parts s = {n, 1, fn, ctx, {}};
  int64_t total = 0;
  for (int i = 0; i < n; i++) {  // part i: activation row i into output row i (y + i * N)
    fn[i] = bind_type(types[i], ctx[i], ws[i], ldws[i], N, a, i, 1, y, N, nth);
    if (!fn[i]) return 1;
    s.nchunks[i] = (N + ctx[i].rows - 1) / ctx[i].rows;
    total += s.nchunks[i];
  }
  run_chunks(parts_chunk, &s, total, nth);
  return 0;
}

extern "C" int tk_gemv(int type, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, const float *x, int64_t M, float *y, int nth) {
  return tk_gemv_parts(1, &type, &w, &ldw, &N, K, x, M, y, nth);
}

// Per-token ops, for every row count (a row computes the same alone, in a batch or in a
// prompt chunk). out (rows, d) = x / rms(x) * w; the sum of squares in double (8 lanes, then
// added pairwise: it vectorizes), so that it loses nothing against torch's blocked float one.
extern "C" void tk_rms_norm(const float *x, const float *w, int64_t rows, int64_t d, float eps, float *out) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *o = out + r * d;
    double lane[8] = {};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      for (int k = 0; k < 8; k++) lane[k] += (double)xr[i + k] * xr[i + k];
    for (; i < d; i++) lane[i % 8] += (double)xr[i] * xr[i];
    const double ss = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    const float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t i = 0; i < d; i++) o[i] = xr[i] * inv * w[i];
  }
}

// The residual step between sublayers: xo = x + rms_norm(h) * hw (x + h where hw is null),
// then y = rms_norm(xo) * nw, the next sublayer's input; rows of d, the float operations of
// tk_rms_norm and one add each, in one call.
extern "C" void tk_add_rms_norm(const float *x, const float *h, const float *hw, const float *nw, int64_t rows,
                                int64_t d, float eps, float *xo, float *y) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d, *hr = h + r * d;
    float *o = xo + r * d;
    if (hw) {
      tk_rms_norm(hr, hw, 1, d, eps, o);
      for (int64_t i = 0; i < d; i++) o[i] = xr[i] + o[i];
    } else {
      for (int64_t i = 0; i < d; i++) o[i] = xr[i] + hr[i];
    }
    tk_rms_norm(o, nw, 1, d, eps, y + r * d);
  }
}

// The gated unit of a fused projection gu (rows, 2 ff), each row [gate | up]:
// out (rows, ff) = act(gate) * up, act silu (act 0: g sigmoid(g)) or GELU's tanh form
// (act 1: g sigmoid(2 u), u = sqrt(2/pi) (g + 0.044715 g^3), as 0.5 g (1 + tanh u) is), or
// gpt-oss's clamped SwiGLU (act 2: g' sigmoid(1.702 g') (u' + 1), g' = min(g, 7), u' = u
// clamped to [-7, 7]).
extern "C" void tk_glu(const float *gu, int64_t rows, int64_t ff, int act, float *out) {
  for (int64_t r = 0; r < rows; r++) {
    const float *g = gu + r * 2 * ff, *u = g + ff;
    float *o = out + r * ff;
    if (act == 0) {
      for (int64_t i = 0; i < ff; i++) o[i] = g[i] / (1.f + exp_f(-g[i])) * u[i];
    } else if (act == 2) {
      for (int64_t i = 0; i < ff; i++) {
        const float x = g[i] < 7.f ? g[i] : 7.f, y = u[i] < -7.f ? -7.f : u[i] > 7.f ? 7.f : u[i];
        o[i] = x / (1.f + exp_f(-1.702f * x)) * (y + 1.f);
      }
    } else {
      for (int64_t i = 0; i < ff; i++) {
        const float x = g[i], z = 1.5957691216f * (x + 0.044715f * x * x * x);  // 2 sqrt(2/pi) (...)
        o[i] = x / (1.f + exp_f(-z)) * u[i];
      }
    }
  }
}

// The router's logits p[e] = R[e] . x + rb[e], ROUTER_CHUNK experts a chunk of the pool
// (a 128-expert router of hidden 2048 is 1 MiB of float32 a layer); each logit summed alike
// whatever thread takes it.
const int64_t ROUTER_CHUNK = 8;
struct Router {
  const float *x, *R, *rb;
  int64_t K, E;
  float *p;
};
static void router_chunk(const void *ctx, int64_t c) {
  const Router &r = *(const Router *)ctx;
  const int64_t end = (c + 1) * ROUTER_CHUNK < r.E ? (c + 1) * ROUTER_CHUNK : r.E;
  for (int64_t e = c * ROUTER_CHUNK; e < end; e++) {
    const float *w = r.R + e * r.K;
    V acc = vzero();
    for (int64_t i = 0; i < r.K; i += 16) acc = vfma(vld(w + i), vld(r.x + i), acc);
    r.p[e] = vsum(acc) + (r.rb ? r.rb[e] : 0.f);
  }
}

// A block's routed experts (models/moe.py), as tk_moe_row and tk_moe_block read them: the
// router R (E, K) float32 and its bias rb (E,) or null; k experts used, their weights
// renormalized to sum 1 (as gpt-oss's softmax of the k largest logits is) and times `scale`
// (0: not); the experts' tables, indexed by expert: gate and up (E, 2) types,
// addresses and row strides, down's (E,); their width ff; the biases gb, ub (E, ff) and
// db (E, K), or null; act as tk_glu's.
struct MoePlan {
  const float *R, *rb;
  int64_t E, K, k, ff, act;
  const int32_t *gu_types;
  const uint8_t **gu_ws;
  const int64_t *gu_lds;
  const int32_t *d_types;
  const uint8_t **d_ws;
  const int64_t *d_lds;
  const float *gb, *ub, *db;
  double scale;
};
static_assert(sizeof(MoePlan) == 17 * 8, "experts plan");

// A decode row's routed experts, from its normed row x (K,): the router's logits R x + rb,
// their softmax, the k largest probabilities (the lower expert first on a tie), weighted
// as the plan says; then out (K,) = sum_j w_j (down_j(act(gate_j x + gb_j) * (up_j x + ub_j))
// + db_j), the j in order. ids and weights (k,): the choice, written. 0 on success, 1 a bad
// shape, else as tk_gemv_parts.
extern "C" int tk_moe_row(const MoePlan *m, const float *x, int32_t *ids, float *weights, float *out, int nth) {
  const int64_t E = m->E, K = m->K, ff = m->ff;
  const int k = (int)m->k;
  const float scale = (float)m->scale;
  if (k < 1 || 2 * k > MAX_PARTS || k > E || E > 4096 || K % 32 || ff % 32) return 1;
  float p[4096];
  const Router rt = {x, m->R, m->rb, K, E, p};
  run_chunks(router_chunk, &rt, (E + ROUTER_CHUNK - 1) / ROUTER_CHUNK, nth);
  float top = -INFINITY;
  for (int64_t e = 0; e < E; e++) top = p[e] > top ? p[e] : top;
  double total = 0.0;
  for (int64_t e = 0; e < E; e++) total += (p[e] = exp_f(p[e] - top));
  for (int64_t e = 0; e < E; e++) p[e] = (float)(p[e] / total);
  float sum = 0.f;
  for (int j = 0; j < k; j++) {  // the k largest, by selection (k is small)
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= ids[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    ids[j] = (int32_t)best;
    sum += (weights[j] = p[best]);
  }
  for (int j = 0; j < k; j++) {
    weights[j] /= sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    if (scale != 0.f && scale != 1.f) weights[j] *= scale;
  }
  int types[MAX_PARTS];
  const uint8_t *ws[MAX_PARTS];
  int64_t lds[MAX_PARTS], Ns[MAX_PARTS];
  for (int j = 0; j < k; j++)
    for (int g = 0; g < 2; g++) {  // gate, then up, of each routed expert
      const int64_t at = 2 * (int64_t)ids[j] + g;
      types[2 * j + g] = m->gu_types[at], ws[2 * j + g] = m->gu_ws[at], lds[2 * j + g] = m->gu_lds[at], Ns[2 * j + g] = ff;
    }
  thread_local avec<float> gu, h, ys;
  gu.resize(2 * k * ff); h.resize(k * ff); ys.resize(k * K);
  int rc = tk_gemv_parts(2 * k, types, ws, lds, Ns, K, x, 1, gu.data(), nth);
  if (rc) return rc;
  const float *gb = m->gb, *ub = m->ub, *db = m->db;
  for (int j = 0; j < k && gb; j++)
    for (int64_t i = 0; i < ff; i++) gu[2 * j * ff + i] += gb[ids[j] * ff + i], gu[(2 * j + 1) * ff + i] += ub[ids[j] * ff + i];
  tk_glu(gu.data(), k, ff, (int)m->act, h.data());
  for (int j = 0; j < k; j++) types[j] = m->d_types[ids[j]], ws[j] = m->d_ws[ids[j]], lds[j] = m->d_lds[ids[j]];
  if ((rc = tk_gemv_each(k, types, ws, lds, K, ff, h.data(), ys.data(), nth))) return rc;
  for (int j = 0; j < k && db; j++)
    for (int64_t i = 0; i < K; i++) ys[j * K + i] += db[ids[j] * K + i];
  for (int64_t i = 0; i < K; i++) {
    float o = 0.f;
    for (int j = 0; j < k; j++) o += weights[j] * ys[j * K + i];
    out[i] = o;
  }
  return 0;
}

// out[r] = the index of the first largest of the n floats of row r (rows ld apart), as
// torch.argmax gives it (a NaN is never the largest here): 16 running maxima, then a scan
// for the first equal one, blocks of 64 compared at once. Both loops vectorize.
extern "C" void tk_argmax(const float *x, int64_t rows, int64_t n, int64_t ld, int64_t *out) {
  for (int64_t r = 0; r < rows; r++) {
    const float *v = x + r * ld;
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; j++) lane[j] = v[i + j] > lane[j] ? v[i + j] : lane[j];
    float mx = -INFINITY;
    for (int j = 0; j < 16; j++) mx = lane[j] > mx ? lane[j] : mx;
    for (; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    for (i = 0; i + 64 <= n; i += 64) {
      int hit = 0;
      for (int j = 0; j < 64; j++) hit |= v[i + j] == mx;
      if (hit) break;
    }
    while (i < n && v[i] != mx) i++;
    out[r] = i < n ? i : 0;  // none equal: every value NaN (or n == 0)
  }
}

// NeoX RoPE of x (H, T, D) contiguous over the first `rot` dims: pairs (i, i + rot/2);
// cos, sin (T, rot/2).
extern "C" void tk_rope_neox(const float *x, const float *cs, const float *sn, int64_t H, int64_t T, int64_t D,
                             int64_t rot, float *out) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < H; h++)
    for (int64_t t = 0; t < T; t++) {
      const float *xr = x + (h * T + t) * D, *c = cs + t * half, *s = sn + t * half;
      float *o = out + (h * T + t) * D;
      for (int64_t i = 0; i < half; i++) {
        const float a = xr[i], b = xr[i + half];
        o[i] = a * c[i] - b * s[i];
        o[i + half] = b * c[i] + a * s[i];
      }
      for (int64_t i = rot; i < D; i++) o[i] = xr[i];
    }
}

// q, k and v of T rows of a fused projection qkv (T, (H + 2 Hkv) D) as heads: q (H, T, D)
// and k (Hkv, T, D), each head RMS-normed by qw / kw where given (Gemma 3, Qwen 3) and then
// NeoX-rotated over its first `rot` dims (cos, sin (T, rot/2)); v (Hkv, T, D) as it is. The
// float operations of tk_rms_norm and tk_rope_neox, in one call instead of a dozen small ops.
extern "C" void tk_qkv_heads(const float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *qw,
                             const float *kw, float eps, const float *cs, const float *sn, int64_t rot, float *q,
                             float *k, float *v) {
  float tmp[512];
  const int64_t W = (H + 2 * Hkv) * D;
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H + 2 * Hkv; h++) {
      const float *src = qkv + t * W + h * D;
      if (h >= H + Hkv) {
        memcpy(v + ((h - H - Hkv) * T + t) * D, src, D * sizeof(float));
        continue;
      }
      const bool isq = h < H;
      const float *w = isq ? qw : kw;
      float *dst = isq ? q + (h * T + t) * D : k + ((h - H) * T + t) * D;
      if (w) {
        tk_rms_norm(src, w, 1, D, eps, tmp);
        src = tmp;
      }
      tk_rope_neox(src, cs + t * (rot / 2), sn + t * (rot / 2), 1, 1, D, rot, dst);
    }
}

extern "C" int tk_dequant(int type, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, float *out, int nth) {
  if (!tk_lowbit_ready(type)) return 3;
  if (type < 0 || type >= NTYPES) return 2;
  auto group = type < 5 ? dequant_legacy : type < 10 ? dequant_kquants : type < 16 ? dequant_lowbit : dequant_grids;
  return group(type, w, ldw, N, K, out, nth);
}

// --- float weights (F16, BF16) -------------------------------------------------------------
// y (M, N) = x (M, K) times W (N, K) stored as IEEE half or bfloat16 (what GGUF's F16 and BF16
// tensors hold): each weight widened to float32 and multiplied with the float32 activations
// (llama.cpp rounds the activations to the weight's type first; we keep them exact, as the
// prompt's dequantized tiles do). Rows of W in chunks over the pool, MB activation rows a pass.
struct FloatCtx {
  const uint8_t *w;
  int64_t ldw, N, K, rows, M;
  const float *x;
  float *y;
};

template <bool BF, int MR>
static void float_rows(const FloatCtx *g, int64_t r0, int64_t r1, const float *x, float *y) {
  const int64_t K = g->K;
  for (int64_t r = r0; r < r1; r++) {
    const uint16_t *w = (const uint16_t *)(g->w + r * g->ldw);
    V acc[MR][2];
    for (int m = 0; m < MR; m++) acc[m][0] = acc[m][1] = vzero();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      const V w0 = BF ? ld_bf16(w + k) : ld_f16(w + k), w1 = BF ? ld_bf16(w + k + 16) : ld_f16(w + k + 16);
      for (int m = 0; m < MR; m++) {
        acc[m][0] = vfma(w0, vld(x + m * K + k), acc[m][0]);
        acc[m][1] = vfma(w1, vld(x + m * K + k + 16), acc[m][1]);
      }
    }
    if (k + 16 <= K) {
      const V w0 = BF ? ld_bf16(w + k) : ld_f16(w + k);
      for (int m = 0; m < MR; m++) acc[m][0] = vfma(w0, vld(x + m * K + k), acc[m][0]);
      k += 16;
    }
    for (int m = 0; m < MR; m++) {
      float s = vsum(vadd(acc[m][0], acc[m][1]));
      for (int64_t j = k; j < K; j++) s += (BF ? bf2f(w[j]) : h2f((const uint8_t *)(w + j))) * x[m * K + j];
      y[m * g->N + r] = s;
    }
  }
}

template <bool BF>
static void float_chunk(const void *p, int64_t c) {
  const FloatCtx *g = (const FloatCtx *)p;
  const int64_t r0 = c * g->rows, r1 = r0 + g->rows < g->N ? r0 + g->rows : g->N;
  for (int64_t m0 = 0; m0 < g->M; m0 += MB) {
    const float *x = g->x + m0 * g->K;
    float *y = g->y + m0 * g->N;
    switch (g->M - m0 < MB ? g->M - m0 : MB) {
      case 1: float_rows<BF, 1>(g, r0, r1, x, y); break;
      case 2: float_rows<BF, 2>(g, r0, r1, x, y); break;
      case 3: float_rows<BF, 3>(g, r0, r1, x, y); break;
      case 4: float_rows<BF, 4>(g, r0, r1, x, y); break;
      case 5: float_rows<BF, 5>(g, r0, r1, x, y); break;
      case 6: float_rows<BF, 6>(g, r0, r1, x, y); break;
      case 7: float_rows<BF, 7>(g, r0, r1, x, y); break;
      default: float_rows<BF, 8>(g, r0, r1, x, y); break;
    }
  }
}

// bf16: 0 for F16 weights, 1 for BF16. 0 on success, 1 a bad shape.
extern "C" int tk_gemv_float(int bf16, const uint8_t *w, int64_t ldw, int64_t N, int64_t K, const float *x, int64_t M,
                             float *y, int nth) {
  if (N < 1 || K < 1 || M < 0 || ldw < 2 * K) return 1;
  if (M == 0) return 0;
  const int64_t rows = chunk_rows(N, ldw, nth);
  FloatCtx g = {w, ldw, N, K, rows, M, x, y};
  run_chunks(bf16 ? float_chunk<true> : float_chunk<false>, &g, (N + rows - 1) / rows, nth);
  return 0;
}

// --- sublayers in one call (decode rows) --------------------------------------------------
// The same kernels as the calls one by one, in the same order, so the same numbers: a decode
// step makes two calls a layer instead of a dozen, with no Python between them.

// A product as the sublayer calls take it: n parts side by side (q, k and v; gate and up),
// their bytes in all, and per part its type, weights, row stride and rows. These structs and
// the plans below are mirrored by kernels/abi.py (tests/test_kernel_abi.py checks them).
struct Part {
  int64_t type;
  const uint8_t *w;
  int64_t ld, rows;
};
struct Product {
  int64_t n, bytes;
  Part part[3];
};
static_assert(sizeof(Product) == 14 * 8, "product");
static int run_product(const Product &p, int64_t K, const float *x, int64_t M, float *y, int nth, int64_t min_bytes) {
  int types[3];
  const uint8_t *ws[3];
  int64_t lds[3], Ns[3];
  for (int i = 0; i < p.n; i++) {
    types[i] = (int)p.part[i].type;
    ws[i] = p.part[i].w;
    lds[i] = p.part[i].ld;
    Ns[i] = p.part[i].rows;
  }
  return tk_gemv_parts((int)p.n, types, ws, lds, Ns, K, x, M, y, p.bytes * M >= min_bytes ? nth : 1);
}
static int64_t product_rows(const Product &p) {
  int64_t n = 0;
  for (int i = 0; i < p.n; i++) n += p.part[i].rows;
  return n;
}

// The output projection and the feed-forward half of a block, from the attention's rows a
// (M, width): o = a Wo; x1, y1 = add_rms_norm(x, o, post_attn_norm, ffn_norm); h =
// glu(y1 [Wgate | Wup]); xo, y = add_rms_norm(x1, h Wdown, post_ffn_norm, next_norm). x, xo,
// y (M, d). Norm pointers may be null where a family has none (post norms). 0 on success,
// else the failing product's code (tk_gemv_parts).
struct FfnPlan {
  int64_t d, ff, act, width;
  const float *post_attn_norm, *ffn_norm, *post_ffn_norm;
  Product wo, gate_up, down;
};
static_assert(sizeof(FfnPlan) == 49 * 8, "feed-forward plan");
extern "C" int tk_ffn_block(const FfnPlan *p, const float *a, const float *x, int64_t M, float eps,
                            const float *next_norm, float *xo, float *y, int nth, int64_t min_bytes) {
  if (product_rows(p->wo) != p->d || product_rows(p->gate_up) != 2 * p->ff || product_rows(p->down) != p->d) return 1;
  thread_local avec<float> o, x1, y1, gu, h;
  o.resize(M * p->d); x1.resize(M * p->d); y1.resize(M * p->d); gu.resize(M * 2 * p->ff); h.resize(M * p->ff);
  int rc = run_product(p->wo, p->width, a, M, o.data(), nth, min_bytes);
  if (rc) return rc;
  tk_add_rms_norm(x, o.data(), p->post_attn_norm, p->ffn_norm, M, p->d, eps, x1.data(), y1.data());
  if ((rc = run_product(p->gate_up, p->d, y1.data(), M, gu.data(), nth, min_bytes))) return rc;
  tk_glu(gu.data(), M, p->ff, (int)p->act, h.data());
  if ((rc = run_product(p->down, p->ff, h.data(), M, o.data(), nth, min_bytes))) return rc;
  tk_add_rms_norm(x1.data(), o.data(), p->post_ffn_norm, next_norm, M, p->d, eps, xo, y);
  return 0;
}

// A mixture-of-experts block's output projection and routed experts, from the attention's
// rows a (M, width): o = a Wo; x1, y1 = add_rms_norm(x, o, post_attn_norm, ffn_norm); each
// row of y1 through tk_moe_row; xo, y = add_rms_norm(x1, experts, post_ffn_norm, next_norm).
// p's wo and norms (its gate_up and down are not read), m the experts. 0 on success, else
// the failing call's code.
extern "C" int tk_moe_block(const FfnPlan *p, const MoePlan *m, const float *a, const float *x, int64_t M, float eps,
                            const float *next_norm, float *xo, float *y, int nth, int64_t min_bytes) {
  if (product_rows(p->wo) != p->d || m->K != p->d) return 1;
  thread_local avec<float> o, x1, y1;
  o.resize(M * p->d); x1.resize(M * p->d); y1.resize(M * p->d);
  int rc = run_product(p->wo, p->width, a, M, o.data(), nth, min_bytes);
  if (rc) return rc;
  tk_add_rms_norm(x, o.data(), p->post_attn_norm, p->ffn_norm, M, p->d, eps, x1.data(), y1.data());
  int32_t ids[MAX_PARTS];
  float weights[MAX_PARTS];
  for (int64_t r = 0; r < M; r++)
    if ((rc = tk_moe_row(m, y1.data() + r * p->d, ids, weights, o.data() + r * p->d, nth))) return rc;
  tk_add_rms_norm(x1.data(), o.data(), p->post_ffn_norm, next_norm, M, p->d, eps, xo, y);
  return 0;
}

// The attention's inputs from the block's normed rows y (M, K): qkv = y [Wq | Wk | Wv] + bias
// (bias null: none), then tk_qkv_heads (q, k (heads, M, D) normed per head where q_norm / k_norm
// are given, NeoX-rotated over `rot` dims by cos, sin (M, rot/2); v (Hkv, M, D)).
struct QkvPlan {
  int64_t H, Hkv, D, K;
  const float *bias, *q_norm, *k_norm;
  Product qkv;
};
static_assert(sizeof(QkvPlan) == 21 * 8, "q/k/v plan");
extern "C" int tk_qkv_block(const QkvPlan *p, const float *y, int64_t M, float eps, const float *cs, const float *sn,
                            int64_t rot, float *q, float *k, float *v, int nth, int64_t min_bytes) {
  const int64_t W = (p->H + 2 * p->Hkv) * p->D;
  if (product_rows(p->qkv) != W || p->D > 512) return 1;
  thread_local avec<float> qkv;
  qkv.resize(M * W);
  const int rc = run_product(p->qkv, p->K, y, M, qkv.data(), nth, min_bytes);
  if (rc) return rc;
  if (p->bias)
    for (int64_t m = 0; m < M; m++)
      for (int64_t i = 0; i < W; i++) qkv[m * W + i] += p->bias[i];
  tk_qkv_heads(qkv.data(), M, p->H, p->Hkv, p->D, p->q_norm, p->k_norm, eps, cs, sn, rot, q, k, v);
  return 0;
}
