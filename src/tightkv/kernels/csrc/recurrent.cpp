// ---------------------------------------------------------------------------
// One decode token of a Gated DeltaNet layer (models/deltanet.py), for one sequence: the
// short convolution over the last inputs, the per-head l2 norms, the gated delta rule on
// the state S, and the gated RMS norm of the output, in one call. S is read twice and
// written once: with u = k^T S and c = q^T S of the state before the token,
//   delta = beta (v - e^g u),  o = e^g c + (q . k) delta,  S' = e^g S + k delta^T,
// the same state and output as the three steps one by one (tests/test_deltanet.py).
// ---------------------------------------------------------------------------
#include <math.h>

#include "common.h"

namespace gdn {
struct Step {
  const float *q, *k, *v;  // (Hk, Dk), (Hk, Dk), (Hv, Dv): after the convolution and norms
  const float *decay, *beta;  // (Hv,)
  float *S;  // (Hv, Dk, Dv)
  const float *z, *norm;  // (Hv, Dv), (Dv,)
  float eps;
  int64_t Hk, Dk, Dv;
  float *out;  // (Hv, Dv)
};

static void head(const void *p, int64_t h) {
  const Step *s = (const Step *)p;
  const int64_t Dk = s->Dk, Dv = s->Dv, kh = h % s->Hk;  // value head h reads key head h mod Hk
  const float *q = s->q + kh * Dk, *k = s->k + kh * Dk, *v = s->v + h * Dv;
  float *S = s->S + h * Dk * Dv, *o = s->out + h * Dv;
  float u[1024], c[1024], delta[1024];
  for (int64_t j = 0; j < Dv; j++) u[j] = c[j] = 0.0f;
  float qk = 0.0f;
  for (int64_t i = 0; i < Dk; i++) {
    const float *row = S + i * Dv;
    const float ki = k[i], qi = q[i];
    qk += qi * ki;
    for (int64_t j = 0; j < Dv; j++) {
      u[j] += ki * row[j];
      c[j] += qi * row[j];
    }
  }
  const float e = s->decay[h], b = s->beta[h];
  for (int64_t j = 0; j < Dv; j++) {
    delta[j] = b * (v[j] - e * u[j]);
    o[j] = e * c[j] + qk * delta[j];
  }
  for (int64_t i = 0; i < Dk; i++) {
    float *row = S + i * Dv;
    const float ki = k[i];
    for (int64_t j = 0; j < Dv; j++) row[j] = e * row[j] + ki * delta[j];
  }
  double ss = 0.0;  // the gated RMS norm: rms_norm(o) * norm * silu(z)
  for (int64_t j = 0; j < Dv; j++) ss += (double)o[j] * o[j];
  const float inv = (float)(1.0 / sqrt(ss / (double)Dv + (double)s->eps));
  const float *z = s->z + h * Dv;
  for (int64_t j = 0; j < Dv; j++) o[j] = o[j] * inv * s->norm[j] * (z[j] / (1.0f + exp_f(-z[j])));
}

static void l2norm(float *x, int64_t n, float eps, float scale) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const double norm = sqrt(ss);
  const float inv = (float)((double)scale / (norm > eps ? norm : (double)eps));
  for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
}  // namespace gdn

// qkv (C,): the token's projection before the convolution (q, k: Hk heads of Dk; v: Hv of
// Dv); conv (K - 1, C): the last inputs, shifted in place; wt (K, C): the convolution; z (Hv
// Dv), b and a (Hv,): the gate, beta and decay projections; dt (Hv,): the decay's bias;
// A (Hv,): -exp(A_log); S (Hv, Dk, Dv): the state, updated in place; norm (Dv,), eps;
// scratch (C,); out (Hv, Dv). 0 on success, 1 for a head dim over 1024.
extern "C" int tk_gdn_step(const float *qkv, float *conv, const float *wt, int64_t C, int64_t K, const float *z,
                           const float *b, const float *a, const float *dt, const float *A, float *S, int64_t Hk,
                           int64_t Hv, int64_t Dk, int64_t Dv, const float *norm, float eps, float *scratch,
                           float *out, int nth) {
  if (Dv > 1024) return 1;
  for (int64_t c = 0; c < C; c++) scratch[c] = conv[c] * wt[c];  // the causal convolution, tap by tap
  for (int64_t j = 1; j < K; j++) {
    const float *in = j < K - 1 ? conv + j * C : qkv, *wj = wt + j * C;
    for (int64_t c = 0; c < C; c++) scratch[c] += in[c] * wj[c];
  }
  for (int64_t c = 0; c < C; c++) scratch[c] = scratch[c] / (1.0f + exp_f(-scratch[c]));  // silu
  memmove(conv, conv + C, (K - 2) * C * sizeof(float));  // the kept inputs move up one
  memcpy(conv + (K - 2) * C, qkv, C * sizeof(float));
  float *q = scratch, *k = scratch + Hk * Dk, *v = scratch + 2 * Hk * Dk;
  for (int64_t h = 0; h < Hk; h++) {
    gdn::l2norm(q + h * Dk, Dk, eps, 1.0f / sqrtf((float)Dk));
    gdn::l2norm(k + h * Dk, Dk, eps, 1.0f);
  }
  float decay[4096], beta[4096];
  if (Hv > 4096) return 1;
  for (int64_t h = 0; h < Hv; h++) {
    const float x = a[h] + dt[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));  // softplus
    decay[h] = expf(sp * A[h]);
    beta[h] = 1.0f / (1.0f + expf(-b[h]));
  }
  gdn::Step s = {q, k, v, decay, beta, S, z, norm, eps, Hk, Dk, Dv, out};
  run_chunks(gdn::head, &s, Hv, nth);
  return 0;
}
