// ---------------------------------------------------------------------------
// Codec encoders for the compressed cache: TurboQuant (2-4 bits) and KVarN
// (2-4 bits), the same steps as kv/codecs.py per vector or tile, packed as
// kv/bits.py does. Inputs are already centred and scaled by the cache.
// ---------------------------------------------------------------------------
#include <vector>

#include "common.h"

namespace enc {
// y = x R^T for R = H diag(signs) / sqrt(hb) per block of hb channels (the rotation of
// kv/rotation.py), in double: a fast Walsh-Hadamard transform per block.
static void rotate(const double *x, const float *signs, int64_t hb, int64_t D, double *y) {
  const double norm = 1.0 / sqrt((double)hb);
  for (int64_t i = 0; i < D; i++) y[i] = x[i] * (double)signs[i];
  hadamard_blocks(y, D, hb);
  for (int64_t i = 0; i < D; i++) y[i] *= norm;
}

// n codes of `bits` bits (n % 8 == 0) packed along the vector, low bits first.
static void pack(const int *code, int64_t n, int bits, uint8_t *out) {
  if (bits == 3) {
    for (int64_t g = 0; g < n / 8; g++) {
      uint32_t v = 0;
      for (int i = 0; i < 8; i++) v |= (uint32_t)code[8 * g + i] << (3 * i);
      out[3 * g] = (uint8_t)v; out[3 * g + 1] = (uint8_t)(v >> 8); out[3 * g + 2] = (uint8_t)(v >> 16);
    }
    return;
  }
  const int per = 8 / bits;
  for (int64_t j = 0; j < n / per; j++) {
    int v = 0;
    for (int i = 0; i < per; i++) v |= code[per * j + i] << (bits * i);
    out[j] = (uint8_t)v;
  }
}

static inline half_t f16(float v) { return (half_t)(v > 65504.f ? 65504.f : v < -65504.f ? -65504.f : v); }

// --- TurboQuant ------------------------------------------------------------------
// Per vector: norm, unit vector, rotation in double, codes = number of thresholds
// below each coordinate, scale = norm (paper) or the least-squares norm <y, c> / <c, c>.
struct TqCtx {
  const float *x, *rot, *thr, *cb;  // rot: R^T (D, D) row-major, used when signs is null
  const float *signs;
  int64_t hb, n, D, per;
  int bits, paper;
  uint8_t *idx;
  half_t *norm;
};

static void tq_chunk(const void *p, int64_t c) {
  const TqCtx *e = (const TqCtx *)p;
  const int64_t D = e->D, nthr = (1 << e->bits) - 1;
  std::vector<double> u(D), yd(D);
  std::vector<int> code(D);
  for (int64_t v = c * e->per; v < (c + 1) * e->per && v < e->n; v++) {
    const float *xv = e->x + v * D;
    double ss = 0;
    for (int64_t i = 0; i < D; i++) ss += (double)xv[i] * xv[i];
    const float nrm = (float)sqrt(ss), den = nrm > 1e-30f ? nrm : 1e-30f;
    for (int64_t i = 0; i < D; i++) u[i] = (double)(xv[i] / den);
    if (e->signs) {
      rotate(u.data(), e->signs, e->hb, D, yd.data());
    } else {
      for (int64_t j = 0; j < D; j++) yd[j] = 0;
      for (int64_t i = 0; i < D; i++) {  // yd = u R^T, rows of R^T: independent lanes, vectorized
        const float *row = e->rot + i * D;
        const double ui = u[i];
        for (int64_t j = 0; j < D; j++) yd[j] += ui * (double)row[j];
      }
    }
    double yc = 0, cc = 0;
    for (int64_t j = 0; j < D; j++) {
      const float yj = (float)yd[j];
      int k = 0;
      while (k < nthr && e->thr[k] < yj) k++;
      code[j] = k;
      yc += (double)yj * e->cb[k];
      cc += (double)e->cb[k] * e->cb[k];
    }
    float sc = nrm;
    if (!e->paper) sc = (float)((double)nrm * yc / (cc > 1e-30 ? cc : 1e-30));
    e->norm[v] = f16(sc);
    pack(code.data(), D, e->bits, e->idx + v * (D * e->bits / 8));
  }
}

// --- KVarN -----------------------------------------------------------------------
// Per tile of G tokens x D channels: rotation, Sinkhorn balancing (the iteration of
// lowest imbalance: row and column standard deviations, computed from the separable
// scales exp(-lt[t]) exp(-lc[c]) in double), then affine codes per channel (keys) or
// per token (values) with fp16 scales and zeros.
struct KvCtx {
  const float *x, *signs;
  int64_t hb, G, D, iters;
  int bits, role_v;
  uint8_t *q;
  half_t *s_col, *zp, *s_row;  // K: s_col, zp (D) per tile, s_row (G); V: s_col (D), zp, s_row (G)
};

// Standard deviations of the rows (over channels) and columns (over tokens) of t * eu[t] * ew[c],
// t (G, D) in double; four channels per vector (D % 8 == 0).
typedef double d4 __attribute__((vector_size(32)));
static inline d4 ld4(const double *p) { d4 r; memcpy(&r, p, 32); return r; }
static inline void st4(double *p, d4 a) { memcpy(p, &a, 32); }

static void stds(const double *t, const double *eu, const double *ew, int64_t G, int64_t D, double *srow,
                 double *scol, double *cs, double *cq) {
  for (int64_t c = 0; c < D; c++) cs[c] = cq[c] = 0;
  for (int64_t r = 0; r < G; r++) {
    const double *tr = t + r * D;
    const d4 u = d4{} + eu[r];
    d4 s = {}, sq = {};
    for (int64_t c = 0; c < D; c += 4) {
      const d4 x = ld4(tr + c), a = x * ld4(ew + c), b = x * u;
      s += a; sq += a * a;
      st4(cs + c, ld4(cs + c) + b);
      st4(cq + c, ld4(cq + c) + b * b);
    }
    const double m = (s[0] + s[1] + s[2] + s[3]) / D, var = (sq[0] + sq[1] + sq[2] + sq[3]) / D - m * m;
    srow[r] = eu[r] * sqrt(var > 0 ? var : 0);
  }
  for (int64_t c = 0; c < D; c++) {
    const double m = cs[c] / G, var = cq[c] / G - m * m;
    scol[c] = ew[c] * sqrt(var > 0 ? var : 0);
  }
}

static inline double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static double imbalance(const double *srow, const double *scol, int64_t G, int64_t D) {
  double a = INFINITY, b = 0, c = INFINITY, d = 0;
  for (int64_t r = 0; r < G; r++) { const double v = srow[r] > 1e-12 ? srow[r] : 1e-12; a = v < a ? v : a; b = v > b ? v : b; }
  for (int64_t k = 0; k < D; k++) { const double v = scol[k] > 1e-12 ? scol[k] : 1e-12; c = v < c ? v : c; d = v > d ? v : d; }
  return b / a + d / c;
}

static void kvarn_tile(const void *p, int64_t tile) {
  const KvCtx *e = (const KvCtx *)p;
  const int64_t G = e->G, D = e->D, levels = (1 << e->bits) - 1;
  std::vector<float> t(G * D);
  std::vector<double> td(G * D), xd(D), yd(D), beu(G), bew(D), eu(G), ew(D), srow(G), scol(D), cs(D), cq(D);
  for (int64_t r = 0; r < G; r++) {  // rotation, as the codec's encode_in (double, then float)
    const float *xv = e->x + (tile * G + r) * D;
    for (int64_t i = 0; i < D; i++) xd[i] = xv[i];
    rotate(xd.data(), e->signs, e->hb, D, yd.data());
    for (int64_t i = 0; i < D; i++) td[r * D + i] = t[r * D + i] = (float)yd[i];
  }
  // the scales as eu = exp(-lt), ew = exp(-lc): lt += log(std) clamped to [-0.3, 10] is eu /= std
  // clamped to [exp(-10), exp(0.3)]
  const double elo = exp(-10.0), ehi = exp(0.3);
  double best = INFINITY;
  for (int64_t r = 0; r < G; r++) eu[r] = beu[r] = 1.0;
  for (int64_t c = 0; c < D; c++) ew[c] = bew[c] = 1.0;
  stds(td.data(), eu.data(), ew.data(), G, D, srow.data(), scol.data(), cs.data(), cq.data());
  for (int64_t it = 0; it < e->iters; it++) {
    for (int64_t r = 0; r < G; r++) eu[r] = clampd(eu[r] / clampd(srow[r], 1e-3, 1e3), elo, ehi);
    stds(td.data(), eu.data(), ew.data(), G, D, srow.data(), scol.data(), cs.data(), cq.data());
    for (int64_t c = 0; c < D; c++) ew[c] = clampd(ew[c] / clampd(scol[c], 1e-3, 1e3), elo, ehi);
    stds(td.data(), eu.data(), ew.data(), G, D, srow.data(), scol.data(), cs.data(), cq.data());
    const double imb = imbalance(srow.data(), scol.data(), G, D);
    if (imb < best) { best = imb; beu = eu; bew = ew; }
  }
  // the affine codes, in float as the codec does: b = t / s_tok / s_ch
  std::vector<float> stok(G), sch(D), lo(e->role_v ? G : D, INFINITY), hi(e->role_v ? G : D, -INFINITY);
  for (int64_t r = 0; r < G; r++) stok[r] = (float)(1.0 / beu[r]);  // exp(lt), exp(lc) of the step of lowest imbalance
  for (int64_t c = 0; c < D; c++) sch[c] = (float)(1.0 / bew[c]);
  for (int64_t r = 0; r < G; r++)
    for (int64_t c = 0; c < D; c++) {
      const float b = t[r * D + c] / stok[r] / sch[c];
      const int64_t k = e->role_v ? r : c;
      lo[k] = b < lo[k] ? b : lo[k];
      hi[k] = b > hi[k] ? b : hi[k];
    }
  half_t *s_col = e->s_col + tile * (e->role_v ? D : D), *s_row = e->s_row + tile * G;
  half_t *zp = e->zp + tile * (e->role_v ? G : D);
  std::vector<float> A(e->role_v ? G : D), Z(e->role_v ? G : D), div(e->role_v ? D : G);
  if (!e->role_v) {
    for (int64_t c = 0; c < D; c++) {
      s_col[c] = f16(sch[c] * (hi[c] - lo[c]) / (float)levels);
      zp[c] = f16(sch[c] * lo[c]);
      A[c] = (float)s_col[c]; Z[c] = (float)zp[c];
    }
    for (int64_t r = 0; r < G; r++) { s_row[r] = f16(stok[r]); div[r] = (float)s_row[r]; }
  } else {
    for (int64_t r = 0; r < G; r++) {
      s_row[r] = f16(stok[r] * (hi[r] - lo[r]) / (float)levels);
      zp[r] = f16(stok[r] * lo[r]);
      A[r] = (float)s_row[r]; Z[r] = (float)zp[r];
    }
    for (int64_t c = 0; c < D; c++) { s_col[c] = f16(sch[c]); div[c] = (float)s_col[c]; }
  }
  std::vector<int> code(D);
  const int64_t P = D * e->bits / 8;
  for (int64_t r = 0; r < G; r++) {
    for (int64_t c = 0; c < D; c++) {
      const float xv = e->role_v ? t[r * D + c] / div[c] : t[r * D + c] / div[r];
      const int64_t k = e->role_v ? r : c;
      const float s = A[k], z = Z[k];
      float v = s > 0 ? nearbyintf((xv - z) / s) : 0.f;
      v = v < 0 ? 0 : v > (float)levels ? (float)levels : v;
      code[c] = (int)v;
    }
    pack(code.data(), D, e->bits, e->q + (tile * G + r) * P);
  }
}
}  // namespace enc

extern "C" int tk_tq_encode(const float *x, int64_t n, int64_t D, int bits, const float *rot, const float *signs,
                            int64_t hb, const float *thr, const float *cb, int paper, uint8_t *idx, uint16_t *norm,
                            int nth) {
  using namespace enc;
  if (D % 8 || bits < 2 || bits > 4 || (signs && (hb < 1 || (hb & (hb - 1)) || D % hb))) return 1;
  TqCtx e = {x, rot, thr, cb, signs, hb, n, D, 8, bits, paper, idx, (half_t *)norm};
  const int64_t nch = (n + e.per - 1) / e.per;
  run_chunks(tq_chunk, &e, nch, nch > 1 ? nth : 1);
  return 0;
}

extern "C" int tk_kvarn_encode(const float *x, int64_t ntiles, int64_t G, int64_t D, int bits, int role_v,
                               int64_t iters, const float *signs, int64_t hb, uint8_t *q, uint16_t *s_col, uint16_t *zp,
                               uint16_t *s_row, int nth) {
  using namespace enc;
  if (D % 8 || bits < 2 || bits > 4 || hb < 1 || (hb & (hb - 1)) || D % hb) return 1;
  KvCtx e = {x, signs, hb, G, D, iters, bits, role_v, q, (half_t *)s_col, (half_t *)zp, (half_t *)s_row};
  run_chunks(kvarn_tile, &e, ntiles, ntiles > 1 ? nth : 1);
  return 0;
}
