"""Pieces shared by every model family: config from GGUF metadata, weight
loading that keeps blocks quantized, RMSNorm, RoPE and the family registry.

A family module (``models/<arch>.py``) defines ``ModelArgs``, what its architecture
changes in the one decoder (`decoder.Model`, which it re-exports as ``Model``), and is
found by the GGUF's ``general.architecture``.
"""

from __future__ import annotations

import functools
import importlib
import math
import warnings
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import GGUFError
from ..gguf.reader import GGUFFile
from ..kernels import qmatmul as qm
from ..kernels import sublayers
from ..kv.recurrent import RecurrentLayout

# GGUF architecture name -> module under tightkv.models
ARCHITECTURES = {
    "gemma3": "gemma3",
    "gemma4": "gemma4",
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "gpt-oss": "gptoss",
    "mistral3": "mistral3",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35moe",
    "phi3": "phi3",
}


SSM_KEYS = {
    "conv": "conv_kernel",
    "inner": "inner_size",
    "state": "state_size",
    "groups": "group_count",
    "heads": "time_step_rank",
}


@dataclass
class BaseModelArgs:
    """Hyper-parameters read from GGUF metadata (``{arch}.*`` keys), and what a family
    changes in the one decoder (`decoder.Model`): the class-level switches and the methods
    below, which a family's ModelArgs overrides (the defaults: no biases, no q/k norms, no
    post norms, SwiGLU, NeoX RoPE, every layer global)."""

    architecture: str
    vocab_size: int
    context_length: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scale: float = 1.0  # linear scaling of positions (1 / factor)
    rope_dim: int = 0  # rotated dims of each head (0: all of head_dim)
    rope_attn_factor: float = 1.0  # multiplies RoPE's cos and sin (Phi-3's LongRoPE; YaRN's, see `yarn_rope`)
    rope_yarn: tuple[int, float, float] | None = None  # YaRN: (original context, beta_fast, beta_slow)
    attn_temperature: tuple[float, int] | None = None  # q times 1 + a log(floor(pos / n) + 1): (a, n)
    num_experts: int = 0  # routed experts of a mixture-of-experts feed-forward (0: a dense one)
    experts_used: int = 0  # experts each token is routed to (top-k)
    expert_ff: int = 0  # an expert's width
    shared_ff: int = 0  # the shared expert's width (0: none)
    expert_weights_scale: float = 0.0  # multiplies the routing weights (0 or 1: not)
    ssm_conv: int = 0  # linear attention: the short convolution's width
    ssm_inner: int = 0  # linear attention: value heads x value dim
    ssm_state: int = 0  # linear attention: a key head's dim
    ssm_groups: int = 0  # linear attention: key heads
    ssm_heads: int = 0  # linear attention: value heads

    rope_style: ClassVar[str] = "neox"  # rotate pairs (i, i + R/2); "interleaved": (2i, 2i + 1)
    qkv_bias: ClassVar[bool] = False  # attn_{q,k,v}.bias added to the projections
    qk_norm: ClassVar[bool] = False  # each query and key head RMS-normed (attn_{q,k}_norm), before RoPE
    post_norms: ClassVar[bool] = False  # each sublayer's output RMS-normed before the residual add
    act: ClassVar[str] = "silu"  # the gated unit's activation: "silu", "gelu" (tanh form) or "swiglu_oai"
    fused_gate_up: ClassVar[bool] = False  # one ffn_up matrix: the gate rows, then the up rows
    rope_factor_tensors: ClassVar[dict[str, str]] = {}  # kind: tensor of RoPE frequency divisors, if present
    gated_attention: ClassVar[bool] = False  # attn_q gives each head's query, then its output gate (Qwen3.5)
    ffn_norm: ClassVar[str] = "ffn_norm"  # the tensor norming the feed-forward's input
    attention_sinks: ClassVar[bool] = False  # a learned logit per head in every softmax (attn_sinks)
    required: ClassVar[tuple[str, ...]] = ()  # metadata keys the family cannot run without (`{arch}.` left out)

    def cache_layout(self) -> list:
        """Per layer: (kv heads, key dim, value dim, sliding window or None); a recurrent
        layer's `kv.recurrent.RecurrentLayout` instead."""
        return [
            self.recurrent_layout()
            if self.recurrent(i)
            else (self.num_kv_heads, self.head_dim, self.head_dim, self.window(i))
            for i in range(self.num_layers)
        ]

    def recurrent(self, layer: int) -> bool:
        """Whether a layer is linear attention with a recurrent state (`models.deltanet`)."""
        return False

    def recurrent_layout(self) -> RecurrentLayout:
        """What a recurrent layer keeps: its convolution's inputs over q, k and v, and a state per value head."""
        key_width = self.ssm_groups * self.ssm_state
        return RecurrentLayout(
            2 * key_width + self.ssm_inner,
            self.ssm_conv,
            self.ssm_heads,
            self.ssm_state,
            self.ssm_inner // self.ssm_heads,
        )

    def window(self, layer: int) -> int | None:
        """The tokens a layer attends to (None: all)."""
        return None

    def rope(self, layer: int) -> tuple[float, float]:
        """A layer's RoPE base and position scale."""
        return self.rope_theta, self.rope_scale

    def rope_factors(self, context_length: int) -> str | None:
        """Which of `rope_factor_tensors` divides RoPE's frequencies in a context of that length."""
        return next(iter(self.rope_factor_tensors), None)

    @property
    def embed_scale(self) -> float | None:
        """What the embedding rows are multiplied by (None: nothing)."""
        return None

    @property
    def attention_scale(self) -> float:
        """What q . k is multiplied by before the softmax."""
        return 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def from_gguf(cls, g: GGUFFile, **extra: Any) -> "BaseModelArgs":
        """Build the config from metadata; keys a family does not know are ignored."""
        m, arch = g.metadata, g.architecture
        key = functools.partial(metadata_key, g)
        for name in cls.required:
            key(name)
        heads = key("attention.head_count")
        hidden = key("embedding_length")
        kv_heads = key("attention.head_count_kv", heads)
        values = dict(
            architecture=arch,
            vocab_size=len(m.get("tokenizer.ggml.tokens", [])) or int(g.tensors["token_embd.weight"].shape[0]),
            context_length=int(key("context_length")),
            hidden_size=int(hidden),
            num_layers=int(key("block_count")) - int(m.get(f"{arch}.nextn_predict_layers") or 0),  # (MTP blocks last)
            num_heads=int(heads),
            num_kv_heads=int(kv_heads),
            head_dim=int(key("attention.key_length", hidden // heads)),
            intermediate_size=int(key("feed_forward_length", 0 if m.get(f"{arch}.expert_count") else None)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            num_experts=int(m.get(f"{arch}.expert_count") or 0),
            experts_used=int(m.get(f"{arch}.expert_used_count") or 0),
            expert_ff=int(m.get(f"{arch}.expert_feed_forward_length") or 0),
            shared_ff=int(m.get(f"{arch}.expert_shared_feed_forward_length") or 0),
            expert_weights_scale=float(m.get(f"{arch}.expert_weights_scale") or 0.0),
            **{f"ssm_{k}": int(m.get(f"{arch}.ssm.{name}") or 0) for k, name in SSM_KEYS.items()},
        )
        if "rope_scale" not in extra:  # (a family reading it its own way gives it)
            values["rope_scale"] = linear_rope_scale(g)
            values.update(yarn_rope(g))
        values.update(extra)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def sliding_layers(g: GGUFFile, pattern: int) -> tuple[bool, ...]:
    """Which layers attend through a sliding window, as llama.cpp reads it: the array
    ``attention.sliding_window_pattern`` where the file has one, else every layer but the
    last of each `pattern` (the key's number where present; 0: every layer)."""
    m, arch = g.metadata, g.architecture
    n = int(metadata_key(g, "block_count")) - int(m.get(f"{arch}.nextn_predict_layers") or 0)
    given = m.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(given, (list, tuple)):
        return tuple(bool(x) for x in given[:n])
    pattern = int(given if given is not None else pattern)
    return tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n))


def metadata_key(g: GGUFFile, name: str, default: Any = None) -> Any:
    """The architecture's metadata value ``{arch}.{name}``; a one-line error naming the key
    where it is missing and has no default."""
    value = g.metadata.get(f"{g.architecture}.{name}", default)
    if value is None:
        raise GGUFError(f"{g.path}: missing metadata key {g.architecture}.{name}")
    return value


class Weights:
    """Tensor access over a GGUF: quantized matrices stay as blocks in the mmap."""

    def __init__(self, g: GGUFFile):
        self.g = g

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def vector(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        """A small float tensor (norm weights, biases), copied out as float32; `shape`, where
        given, is what it must have (else a one-line error naming it), as for each method."""
        from ..gguf import quants

        t = self._get(name, shape)
        raw = _as_torch(t.data)
        return quants.dequantize(raw, t.qtype, t.shape).reshape(t.shape).float().clone()

    def linear(self, name: str, shape: tuple | None = None):
        """A `QuantLinear` over the tensor's blocks, zero-copy from the file."""
        from ..gguf import quants
        from ..kernels.qmatmul import QuantLinear

        t = self._get(name, shape)
        quants.check_supported(t.qtype, name)
        out_features, in_features = t.shape
        return QuantLinear(_as_torch(t.data), t.qtype, in_features, out_features)

    def experts(self, name: str, shape: tuple | None = None) -> list:
        """A 3-D expert tensor (experts, out, in) as one `QuantLinear` per expert, each over
        its own rows of the file's blocks (zero-copy): a token reads only its experts'."""
        from ..gguf import quants
        from ..kernels.qmatmul import QuantLinear

        t = self._get(name, shape)
        if len(t.shape) != 3:
            raise GGUFError(f"{self.g.path}: tensor {name} has shape {t.shape}, expected (experts, rows, cols)")
        quants.check_supported(t.qtype, name)
        n, out_features, in_features = t.shape
        data = _as_torch(t.data).reshape(n, out_features, -1)
        return [QuantLinear(data[e], t.qtype, in_features, out_features) for e in range(n)]

    def stacked(self, names: list[str], shapes: list[tuple] | None = None):
        """A `StackedLinear`: the named matrices over one input, outputs side by side
        (one kernel call for q, k and v, or gate and up)."""
        from ..kernels.qmatmul import StackedLinear

        return StackedLinear([self.linear(n, s) for n, s in zip(names, shapes or [None] * len(names))])

    def _get(self, name: str, shape: tuple | None = None):
        t = self.g.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.g.path}: missing tensor {name}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise GGUFError(f"{self.g.path}: tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return t


def _as_torch(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mmap: we never write
        return torch.from_numpy(array)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., d) normalised by its root mean square, times weight (d)."""
    lib = qm.small_ops(x)
    if lib is None or weight.dtype != torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x = x.contiguous()  # a row's result must not depend on the layout (a batch's q is a transposed view)
    out = torch.empty_like(x)
    d = x.shape[-1]
    lib.tk_rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // d, d, eps, out.data_ptr())
    return out


def add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, h_norm: torch.Tensor | None, norm: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual step between sublayers: x + rms_norm(h, h_norm) (x + h where h_norm is
    None), and that sum normed by `norm` for the next sublayer: (x, y), both (T, d). One
    kernel call where the library is loaded, the same numbers as the ops one by one."""
    lib = qm.small_ops(x)
    weights = [w for w in (h_norm, norm) if w is not None]
    if lib is None or h.dtype != torch.float32 or any(w.dtype != torch.float32 for w in weights):
        x = x + (h if h_norm is None else rms_norm(h, h_norm, eps))
        return x, rms_norm(x, norm, eps)
    x, h = x.contiguous(), h.contiguous()
    xo, y = torch.empty_like(x), torch.empty_like(x)
    d = x.shape[-1]
    lib.tk_add_rms_norm(
        x.data_ptr(),
        h.data_ptr(),
        None if h_norm is None else h_norm.data_ptr(),
        norm.data_ptr(),
        x.numel() // d,
        d,
        eps,
        xo.data_ptr(),
        y.data_ptr(),
    )
    return xo, y


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    scale: float = 1.0,
    factors: torch.Tensor | None = None,
    mscale: float = 1.0,
    yarn: tuple[int, float, float] | None = None,
):
    """cos, sin (T, head_dim/2) at the given positions (T,).

    Frequency i is theta^(-2i/head_dim) * scale / factors[i] (linear scaling and
    llama.cpp's per-frequency divisors: Llama 3 `rope_freqs`, Phi-3 long/short
    factors); cos and sin are multiplied by mscale (Phi-3's attention factor). With
    yarn = (original context, beta_fast, beta_slow), YaRN as llama.cpp computes it: the
    frequencies that turn more than beta_fast times over the original context keep their
    unscaled value, those under beta_slow take the scaled one, a linear ramp between; and
    cos and sin grow by 1 + 0.1 ln(1 / scale).
    """
    inv_freq = _inv_freq(head_dim, theta)
    if factors is not None:
        inv_freq = inv_freq / factors.to(torch.float64)
    if yarn is None or scale == 1.0:
        angles = (positions.to(torch.float64)[:, None] * scale) * inv_freq[None, :]
    else:
        mix = _yarn_ramp(head_dim, theta, *yarn)  # (head_dim/2,): 1 keeps a frequency, 0 scales it
        angles = positions.to(torch.float64)[:, None] * (inv_freq * (scale + (1 - scale) * mix))[None, :]
        mscale *= 1.0 + 0.1 * math.log(1.0 / scale)
    return (angles.cos() * mscale).float(), (angles.sin() * mscale).float()


@functools.lru_cache(maxsize=32)
def _yarn_ramp(dims: int, theta: float, n_ctx: int, beta_fast: float, beta_slow: float) -> torch.Tensor:
    """Per frequency, how much of it stays unscaled: 1 below the dim that turns beta_fast
    times over n_ctx tokens (floored), 0 from the one that turns beta_slow times (ceiled)."""

    def dim(turns: float) -> float:
        return dims * math.log(n_ctx / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(0.0, math.floor(dim(beta_fast))), min(dims - 1.0, math.ceil(dim(beta_slow)))
    y = (torch.arange(dims // 2, dtype=torch.float64) - low) / max(0.001, high - low)
    return 1 - y.clamp(0, 1)


@functools.lru_cache(maxsize=32)
def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/head_dim), float64 (head_dim/2,): the same every forward, so computed once."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def apply_rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (H, T, D) by halves: pairs (i, i + R/2), as NeoX and HF do, over the
    first R = 2 * cos.shape[-1] dims (partial rotary); the rest pass through."""
    rot = 2 * cos.shape[-1]
    lib = qm.small_ops(x)
    if lib is not None and x.dim() == 3:
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()  # the same path for any layout
        out = torch.empty_like(x)
        lib.tk_rope_neox(
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.shape[1], x.shape[2], rot, out.data_ptr()
        )
        return out
    if rot < x.shape[-1]:
        return torch.cat((apply_rope_neox(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    half = rot // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def qkv_heads(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (H, T, D), k and v (Hkv, T, D) from a fused projection qkv (T, (H + 2 Hkv) D):
    q and k RMS-normed per head by q_norm / k_norm where given, then NeoX-rotated
    (`apply_rope_neox`); one kernel call where the library is loaded, the same numbers."""
    T, D = qkv.shape[0], head_dim
    lib = qm.small_ops(qkv)
    norms = [w for w in (q_norm, k_norm) if w is not None]
    if lib is None or D > 512 or any(w.dtype != torch.float32 for w in norms):
        q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
        q = q.view(T, num_heads, D).transpose(0, 1)  # (H, T, D)
        k = k.view(T, num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D)
        v = v.view(T, num_kv_heads, D).transpose(0, 1)  # (Hkv, T, D)
        q = q if q_norm is None else rms_norm(q, q_norm, eps)
        k = k if k_norm is None else rms_norm(k, k_norm, eps)
        return apply_rope_neox(q, cos, sin), apply_rope_neox(k, cos, sin), v
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    q, k, v = torch.empty(num_heads, T, D), torch.empty(num_kv_heads, T, D), torch.empty(num_kv_heads, T, D)
    lib.tk_qkv_heads(
        qkv.data_ptr(),
        T,
        num_heads,
        num_kv_heads,
        D,
        None if q_norm is None else q_norm.data_ptr(),
        None if k_norm is None else k_norm.data_ptr(),
        eps,
        cos.data_ptr(),
        sin.data_ptr(),
        2 * cos.shape[-1],
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
    )
    return q, k, v


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (H, T, D) by adjacent pairs (2i, 2i + 1), GPT-J style: llama.cpp's
    "normal" RoPE, which GGUF llama Q/K rows are permuted for."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def linear_rope_scale(g: GGUFFile) -> float:
    """Position scale from `{arch}.rope.scaling.{type,factor}` (1 / factor for linear
    scaling and YaRN); other scaling types are a one-line error, except the ones llama.cpp
    carries as factor tensors (Llama 3 `rope_freqs`, Phi-3 longrope)."""
    m, arch = g.metadata, g.architecture
    kind = str(m.get(f"{arch}.rope.scaling.type", "none") or "none")
    factor = float(m.get(f"{arch}.rope.scaling.factor") or 1.0)
    if kind in ("linear", "yarn"):
        return 1.0 / factor if factor > 0 else 1.0
    if kind in ("none", "llama3", "longrope", "su") or factor == 1.0:
        return 1.0
    raise GGUFError(f"{g.path}: unsupported RoPE scaling type '{kind}' for {arch}")


def yarn_rope(g: GGUFFile) -> dict:
    """YaRN's fields of `BaseModelArgs` where the file scales RoPE by YaRN (else none):
    the original context and beta_fast, beta_slow (llama.cpp's defaults 32 and 1), and the
    factor on cos and sin beside the one `rope_cos_sin` applies, as llama.cpp works it out:
    1 / (1 + 0.1 ln f), times mscale(f, 1) / mscale(f, log_mul) where the file has
    `rope.scaling.yarn_log_multiplier`, times `rope.scaling.attn_factor`."""
    m, arch = g.metadata, g.architecture
    factor = float(m.get(f"{arch}.rope.scaling.factor") or 1.0)
    if str(m.get(f"{arch}.rope.scaling.type", "none")) != "yarn" or factor <= 1.0:
        return {}
    key = functools.partial(metadata_key, g)
    n_ctx = int(key("rope.scaling.original_context_length", key("context_length")))
    beta_fast, beta_slow = (
        float(key("rope.scaling.yarn_beta_fast", 32.0)),
        float(key("rope.scaling.yarn_beta_slow", 1.0)),
    )
    log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0))

    def mscale(scale: float) -> float:
        return 0.1 * scale * math.log(factor) + 1.0

    attn = (mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)) / (1.0 + 0.1 * math.log(factor))
    attn *= float(key("rope.scaling.attn_factor", 1.0))
    return {"rope_yarn": (n_ctx, beta_fast, beta_slow), "rope_attn_factor": attn}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu": gelu_tanh, "silu": F.silu}


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU: g sigmoid(1.702 g) (u + 1), g = min(gate, 7), u = up in [-7, 7]."""
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def glu(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up of a fused projection gate_up (T, 2 ff), each row [gate | up]; act "gelu"
    (tanh form), "silu" or "swiglu_oai" (`swiglu_oai`) -> (T, ff). One kernel call where the
    library is loaded (for every row count, so a row computes the same alone, in a batch or
    in a prompt chunk), within a few ulps of torch's ops, which run otherwise."""
    lib = qm.small_ops(gate_up)
    if lib is None or gate_up.dim() != 2:
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        return swiglu_oai(gate, up) if act == "swiglu_oai" else ACTIVATIONS[act](gate) * up
    gate_up = gate_up.contiguous()
    rows, ff = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, ff)
    lib.tk_glu(gate_up.data_ptr(), rows, ff, sublayers.ACT_IDS[act], out.data_ptr())
    return out


def load_family(g: GGUFFile):
    """The family module for a GGUF's architecture, or a one-line error."""
    arch = g.architecture
    module = ARCHITECTURES.get(arch)
    if module is None:
        known = ", ".join(sorted(ARCHITECTURES))
        raise GGUFError(f"{g.path}: unsupported architecture '{arch}' (supported: {known})")
    return importlib.import_module(f"tightkv.models.{module}")


def header_layout(g: GGUFFile) -> tuple[BaseModelArgs, list[tuple[int, int, int, int | None]]]:
    """Config and per-layer cache layout (`ModelArgs.cache_layout`) from the header alone
    (no weights touched)."""
    args = load_family(g).ModelArgs.from_gguf(g)
    return args, args.cache_layout()


def build_model(g: GGUFFile):
    """Instantiate the family's `Model` (the one decoder, `decoder.Model`) for a parsed GGUF."""
    family = load_family(g)
    args = family.ModelArgs.from_gguf(g)
    return family.Model(args, Weights(g))


__all__ = [
    "BaseModelArgs",
    "Weights",
    "rms_norm",
    "add_rms_norm",
    "rope_cos_sin",
    "apply_rope_neox",
    "qkv_heads",
    "apply_rope_interleaved",
    "linear_rope_scale",
    "yarn_rope",
    "gelu_tanh",
    "glu",
    "load_family",
    "build_model",
]
