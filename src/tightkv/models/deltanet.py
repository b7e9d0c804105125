"""Gated DeltaNet, the linear attention of Qwen3.5 / Qwen3.6 hybrids, as llama.cpp reads
the GGUF (`qwen35.cpp`, `delta-net-base.cpp`):

    qkv, z, b, a = attn_qkv(x), attn_gate(x), ssm_beta(x), ssm_alpha(x)
    qkv = silu(causal depthwise conv(qkv, ssm_conv1d))        # over the last K - 1 inputs too
    q, k, v = split(qkv); q, k = l2norm(q), l2norm(k)           # Hk key heads, Hv value heads
    beta = sigmoid(b); g = ssm_a * softplus(a + ssm_dt.bias)    # ssm_a = -exp(A_log) < 0
    per value head h (its key head: h mod Hk, the converter's tiled order), state S (Dk, Dv):
        S = exp(g_t) S;  S += k_t (beta_t (v_t - k_t S))^T;  o_t = (q_t / sqrt(Dk)) S
    out = ssm_out(rms_norm(o, ssm_norm) * silu(z))

The state (conv inputs and S) is the layer's cache entry (`kv.recurrent.RecurrentState`),
float32. A decode row takes the step form (one kernel call, `tk_gdn_step`); a prompt chunk the chunked form (`chunked`,
chunks of 64 as llama.cpp), which gives the same state and outputs as the steps
(`reference`, token by token; tests/test_deltanet.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import build
from ..kernels import qmatmul as qm
from ..kv.cache import BatchLayer
from .base import BaseModelArgs, Weights, rms_norm

CHUNK = 64  # the chunked form's block of tokens (llama.cpp's)
STEP_MAX = 8  # rows up to which the step form runs (it is exact and cheap for a few)


class GatedDeltaNet(torch.nn.Module):
    """A linear-attention mixer: `forward` takes the block's normed rows (T, hidden) and
    returns (T, Hv Dv) before the output projection `wo` (ssm_out), as `decoder.Attention` does."""

    def __init__(self, args: BaseModelArgs, w: Weights, i: int):
        super().__init__()
        p = f"blk.{i}."
        L = args.recurrent_layout()
        self.hk, self.hv, self.dk, self.dv = args.ssm_groups, L.heads, L.key_dim, L.value_dim
        self.kernel = L.conv_kernel
        self.eps = args.rms_norm_eps
        self.sizes = [2 * self.hk * self.dk + self.hv * self.dv, self.hv * self.dv, self.hv, self.hv]
        self.offsets = [sum(self.sizes[:i]) for i in range(4)]
        d = args.hidden_size
        # qkv, z, beta, alpha: one product over the same rows
        names = [p + n + ".weight" for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")]
        self.proj = w.stacked(names, [(n, d) for n in self.sizes])
        self.conv = w.vector(p + "ssm_conv1d.weight", (self.sizes[0], self.kernel))  # (channels, K)
        self.conv_t = self.conv.t().contiguous()  # (K, channels): the step kernel's layout
        self.dt_bias = w.vector(p + "ssm_dt.bias", (self.hv,))
        self.a = w.vector(p + "ssm_a", (self.hv,))  # -exp(A_log)
        self.norm = w.vector(p + "ssm_norm.weight", (self.dv,))
        self.wo = w.linear(p + "ssm_out.weight", (d, self.hv * self.dv))

    def forward(self, x: torch.Tensor, cos, sin, cache) -> torch.Tensor:
        proj = self.proj(x)  # (T, qkv + z + b + a)
        if not isinstance(cache, BatchLayer):
            return self._run(proj, cache)
        outs, s = [], 0  # N sequences: each its rows on its own state
        for c, n in zip(cache.layers, cache.rows):
            outs.append(self._run(proj[s : s + n], c))
            s += n
        return torch.cat(outs)

    __call__ = forward

    def _run(self, proj: torch.Tensor, state) -> torch.Tensor:
        """One sequence's projected rows (T, .) through its state -> (T, Hv Dv)."""
        T = proj.shape[0]
        lib = qm.small_ops(proj)
        if T == 1 and lib is not None:
            return self._step(lib, proj, state)
        qkv, z, b, a = proj.split(self.sizes, dim=-1)
        beta = torch.sigmoid(b)  # (T, Hv)
        g = F.softplus(a + self.dt_bias) * self.a  # (T, Hv), log decay
        o = self._mix(qkv, beta, g, state)  # (T, Hv, Dv)
        o = rms_norm(o, self.norm, self.eps) * F.silu(z.reshape(T, self.hv, self.dv))
        return o.reshape(T, self.hv * self.dv)

    def _step(self, lib, proj: torch.Tensor, state) -> torch.Tensor:
        """A decode row in one kernel call (`tk_gdn_step`): the convolution, the delta rule
        and the gated norm, the state updated in place."""
        conv, ssm = state.writable()
        proj = proj.contiguous()
        at = [proj.data_ptr() + 4 * o for o in self.offsets]
        out, scratch = torch.empty(1, self.hv * self.dv), torch.empty(self.sizes[0])
        if lib.tk_gdn_step(
            at[0],
            conv.data_ptr(),
            self.conv_t.data_ptr(),
            self.sizes[0],
            self.kernel,
            at[1],
            at[2],
            at[3],
            self.dt_bias.data_ptr(),
            self.a.data_ptr(),
            ssm.data_ptr(),
            self.hk,
            self.hv,
            self.dk,
            self.dv,
            self.norm.data_ptr(),
            self.eps,
            scratch.data_ptr(),
            out.data_ptr(),
            build.threads(),
        ):
            raise RuntimeError("tightkv kernel: the Gated DeltaNet step failed")
        state.advance(conv, ssm, 1)
        return out

    def _mix(self, qkv: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, state) -> torch.Tensor:
        """One sequence's rows through its convolution and delta rule -> o (T, Hv, Dv)."""
        T = qkv.shape[0]
        window = torch.cat([state.conv, qkv])  # (K - 1 + T, channels)
        conv = window[:T] * self.conv[:, 0]
        for j in range(1, self.kernel):  # causal: row t takes inputs t - K + 1 .. t
            conv += window[j : j + T] * self.conv[:, j]
        conv = F.silu(conv)  # (T, channels)
        q, k, v = conv.split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], dim=-1)
        q, k = (_l2norm(t.reshape(T, self.hk, self.dk), self.eps).repeat(1, self.hv // self.hk, 1) for t in (q, k))
        q = q * self.dk**-0.5
        v = v.reshape(T, self.hv, self.dv)
        if T <= STEP_MAX:
            o, ssm = reference(q, k, v, g, beta, state.writable()[1])
        else:
            o, ssm = chunked(q, k, v, g, beta, state.ssm)
        state.advance(window[T:].clone(), ssm, T)
        return o


def _unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower triangular A (..., C, C), by forward substitution, row by
    row over the whole batch (torch's batched triangular solve takes a LAPACK call per matrix)."""
    C = A.shape[-1]
    X = -A.clone()  # row i of (I + A)^-1 - I: -A[i] - sum_j<i A[i, j] X[j]
    for i in range(2, C):
        X[..., i, :i] += (X[..., i, None, :i] @ X[..., :i, :i]).squeeze(-2)
    return X + torch.eye(C)


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / max(|x|, eps) over the last dim (ggml_l2_norm)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def reference(q, k, v, g, beta, S):
    """The delta rule token by token: q, k (T, H, Dk), v (T, H, Dv), g and beta (T, H), the
    state S (H, Dk, Dv), updated in place -> the outputs (T, H, Dv) and S."""
    out = torch.empty(v.shape)
    decay = g.exp()[..., None, None]  # (T, H, 1, 1)
    for t in range(q.shape[0]):
        S *= decay[t]
        kv = (k[t].unsqueeze(1) @ S).squeeze(1)  # (H, Dv): k_t S
        delta = (v[t] - kv) * beta[t][:, None]
        S.baddbmm_(k[t].unsqueeze(2), delta.unsqueeze(1))  # S += k_t delta^T
        out[t] = (q[t].unsqueeze(1) @ S).squeeze(1)
    return out, S


def chunked(q, k, v, g, beta, S, chunk: int = CHUNK):
    """The same, a block of `chunk` tokens at a time (the WY form: within a block the updates
    are one triangular solve, across blocks the state carries them)."""
    T, H, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-T) % chunk
    q, k, v, g, beta = (F.pad(t, [0, 0] * (t.dim() - 1) + [0, pad]) for t in (q, k, v, g, beta))
    n = (T + pad) // chunk
    # (H, n, C, .): heads first, then blocks
    q, k, v = (t.reshape(n, chunk, H, -1).permute(2, 0, 1, 3) for t in (q, k, v))
    g, beta = (t.reshape(n, chunk, H).permute(2, 0, 1) for t in (g, beta))
    gam = g.cumsum(-1)  # (H, n, C): log decay from the block's start
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (H, n, C, C)
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    A = A.masked_fill(lower.logical_not() | torch.eye(chunk, dtype=torch.bool), 0.0)  # strictly lower
    Tinv = _unit_lower_inverse(A)  # (I + A)^-1
    value = Tinv @ (v * beta[..., None])  # (H, n, C, Dv)
    kdecay = Tinv @ (kb * gam.exp()[..., None])  # (H, n, C, Dk)
    local = (q @ k.transpose(-1, -2)) * decay  # (H, n, C, C), the diagonal included
    out = torch.empty(H, n, chunk, Dv)
    S = S.clone()
    for c in range(n):
        u = value[:, c] - kdecay[:, c] @ S  # (H, C, Dv)
        out[:, c] = (q[:, c] * gam[:, c, :, None].exp()) @ S + local[:, c] @ u
        last = gam[:, c, -1]  # (H,)
        S = (
            S * last.exp()[:, None, None]
            + (k[:, c] * (last[:, None] - gam[:, c]).exp()[..., None]).transpose(-1, -2) @ u
        )
    out = out.permute(1, 2, 0, 3).reshape(n * chunk, H, Dv)[:T]
    return out, S
