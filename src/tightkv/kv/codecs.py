"""KV codecs: small classes that turn blocks of head vectors into packed tensors.

Every codec encodes whole *units* of ``tile`` tokens (1 for per-token codecs, 32
or 128 for KIVI and KVarN, whose scales span tokens) of one layer's keys or
values, ``x`` (Hkv, units * tile, dim) float32, into a dict of tensors whose
axis 1 is the unit axis, so a cache can store, slice and drop them along that
axis. ``decode`` inverts it into the *code domain*: ``x @ R.T`` for a codec
with a rotation R, ``x`` itself otherwise. Attention works in that domain: the
query is rotated once, value sums are rotated back once (see compressed.py).

Names. Each published codec exists as published under a ``-paper`` suffix; the
plain name is our variant: the cache subtracts a fixed per-channel vector (taken
from the first keys or values it compresses) before encoding, and it keeps an
exact sink and recent window by default. Per family:

============  =====================================================  ============================
name          storage per head (d = head dim)                        bits per element
============  =====================================================  ============================
f32/f16/bf16  the vector                                             32 / 16 / 16
q8_0          per 32 channels: fp16 d + 32 int8 (llama.cpp Q8_0)     8.5
q4_0          per 32 channels: fp16 d + 16 nibble bytes (Q4_0)       4.5
tqB           B-bit Lloyd-Max codes + fp16 norm per token            B + 16/d
tqp, tqp3     (B-1)-bit tq codes + fp16 norm, d QJL sign bits        B + 32/d
              + fp16 residual norm
kvarnB        128-token tile: B-bit codes; K: fp16 scale+zero per    K: B + (2d+128)*16/(128d)
              channel + fp16 per token; V: transposed                V: B + (2*128+d)*16/(128d)
kiviB         K: fp16 scale+zero per channel per 32 tokens;          B + 1
              V: fp16 scale+zero per 32 channels per token
============  =====================================================  ============================

Our variants differ from the papers as follows: all of them centre (above);
``q8_0``/``q4_0`` also rotate (the Hadamard of llama.cpp PR #21038); ``tqB``
stores the least-squares scale <x, c>/<c, c> instead of the norm (same bytes,
lower error); ``kiviB`` flushes keys every 32 tokens instead of every 128.
"""

from __future__ import annotations

import functools
import math

import torch

from ..errors import TightKVError
from ..gguf.quants import FLOAT_TYPES
from ..kernels.abi import Kind
from .bits import identity_values, lut_decode, pack, packed_size
from .rotation import DEFAULT_SEED, gaussian_matrix, rotation_block, rotation_matrix, rotation_signs

# Lloyd-Max centroids for N(0, 1), positive half (KV_ALGORITHMS.md section 1.1,
# recomputed with lloyd.py), and the resulting MSE per coordinate.
LLOYD_MAX = {
    1: (0.797885,),
    2: (0.45278, 1.510418),
    3: (0.245094, 0.756005, 1.343909, 2.151946),
    4: (0.128395, 0.388048, 0.656759, 0.94234, 1.256231, 1.618046, 2.069017, 2.73259),
}
LLOYD_MAX_MSE = {1: 0.363380, 2: 0.117482, 3: 0.034548, 4: 0.009501}
F16_MAX = 65504.0
# Exact recent window of our variants: 128 tokens, 256 at 3 bits and below (measured on
# Gemma 3 270M, see the tightkv.kv package docstring).
RECENT = 128
LOW_BIT_RECENT = 256
# Exact sink: 4 tokens; 16 for the 2-4 bit types (TurboQuant, KVarN, KIVI), whose codes treat the sink's
# outsized keys worst (essays, ctx 2048, 6 chunks, tq4: sink 4 +0.51% ΔPPL / KLD 0.00398,
# sink 8 +0.24% / 0.00388, sink 16 +0.08% / 0.00391; `tightkv ppl --file essays.txt --ctx 2048
# --chunks 6 --compare f16,tq4,sink=8,tq4,sink=16` on the 2-core EPYC dev box).
SINK = 4
TQ_SINK = 16


def lloyd_max_codebook(bits: int) -> torch.Tensor:
    """All 2**bits centroids for N(0, 1), ascending."""
    half = torch.tensor(LLOYD_MAX[bits], dtype=torch.float64)
    return torch.cat([-half.flip(0), half]).float()


def _f16(x: torch.Tensor) -> torch.Tensor:
    """Round to fp16, saturating instead of overflowing to inf."""
    return x.clamp(-F16_MAX, F16_MAX).half()


FAMILIES: dict[str, tuple[type, dict]] = {}  # name -> (class, keyword arguments), filled as classes register
DENSE_DTYPES = {name.lower(): dtype for name, dtype in FLOAT_TYPES.items()}  # f32, f16, bf16


class Codec:
    """One KV codec for vectors of ``dim`` channels, for keys (role "k") or values ("v").

    A subclass registers the names it answers to in its own ``names`` (name -> keyword
    arguments); each compressed name also exists with "-paper" (the published variant).
    """

    names: dict[str, dict] = {}
    name: str = ""
    tile: int = 1  # tokens per encoded unit
    rotation: torch.Tensor | None = None  # (dim, dim) orthogonal; codes live in x @ R.T
    center: bool = False  # the cache subtracts a fixed per-channel vector before encoding
    balance: bool = False  # ... and divides by a fixed per-channel scale
    sink: int = 0  # default exact first tokens
    default_sink: int = SINK  # ... of our variant (the papers keep none)
    recent: int = 0  # default exact last tokens
    # What the fused attention kernel takes from this codec (kv/fused.py): its storage
    # kind (kernels/abi.py Kind), or None for the torch reference path; the names
    # of up to four fields: the codes, a per-token field (scales or norms), two more
    # with one row per `kernel_rows` tokens (1: per token; KVarN tiles, KIVI key groups).
    kernel_kind: Kind | None = None
    kernel_fields: tuple[str | None, ...] = ("", None, None, None)
    kernel_rows: tuple[int, int] = (1, 1)
    kernel_encoder: str | None = None  # "tq" or "kvarn": a C++ encoder takes the steps of `encode`

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, kw in cls.__dict__.get("names", {}).items():
            FAMILIES[name] = (cls, kw)

    def __init__(self, dim: int, role: str = "k", seed: int = DEFAULT_SEED, paper: bool = False):
        self.dim, self.role, self.seed, self.paper = dim, role, seed, paper
        if not paper:
            self.center, self.balance, self.sink, self.recent = True, True, self.default_sink, RECENT

    # --- interface ------------------------------------------------------------
    def unit_bytes(self) -> int:
        """Bytes of one encoded unit (``tile`` tokens) of one head."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """(Hkv, units * tile, dim) float32 -> fields, each (Hkv, units, ...)."""
        raise NotImplementedError

    def decode(self, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """Fields (Hkv, units, ...) -> (Hkv, units * tile, dim) float32 in the code domain."""
        raise NotImplementedError

    # --- shared -----------------------------------------------------------------
    @property
    def bits(self) -> float:
        """Documented bits per element, metadata included."""
        return 8 * self.unit_bytes() / (self.tile * self.dim)

    def to_code(self, x: torch.Tensor) -> torch.Tensor:
        """Original domain -> code domain (x @ R.T)."""
        return x if self.rotation is None else x @ self.rotation.mT

    def encode_in(self, x: torch.Tensor) -> torch.Tensor:
        """`to_code` for encoding, in float64 so that a token's codes do not depend on how
        many tokens are encoded with it (BLAS rounding varies with the batch shape)."""
        if self.rotation is None:
            return x
        return (x.double() @ self.rotation.double().mT).float()

    def from_code(self, y: torch.Tensor) -> torch.Tensor:
        """Code domain -> original domain (y @ R)."""
        return y if self.rotation is None else y @ self.rotation

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, dim={self.dim}, role={self.role!r})"


class Dense(Codec):
    """Plain float storage; lets a K:V pair mix exact and compressed halves."""

    kernel_fields = ("x", None, None, None)

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, kind="f16"):
        super().__init__(dim, role, seed, paper=True)
        self.dtype = DENSE_DTYPES[kind]
        self.kernel_kind = Kind.named(kind)  # F32, F16, BF16

    def unit_bytes(self):
        return self.dim * self.dtype.itemsize

    def encode(self, x):
        return {"x": x.to(self.dtype)}

    def decode(self, fields):
        return fields["x"].float()


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C roundf (half away from zero), as gguf-py's np_roundf."""
    a = x.abs()
    f = a.floor()
    return x.sign() * (f + (2 * (a - f)).floor())


class Q8_0(Codec):
    """llama.cpp Q8_0 over blocks of 32 channels: x = d * q, d = amax / 127 (fp16), q int8.

    Stored struct-of-arrays (``d`` then ``qs``); `to_ggml` interleaves them into
    llama.cpp's 34-byte blocks, byte for byte what ``gguf.quants.quantize`` makes.
    """

    block = 32
    names = {"q8_0": {}}
    kernel_kind = Kind.Q8_0
    kernel_fields = ("qs", "d", None, None)

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, paper=False):
        super().__init__(dim, role, seed, paper)
        if dim % self.block:
            raise TightKVError(f"{type(self).__name__.lower()} needs a head dim divisible by 32, got {dim}")
        if not paper:
            self.rotation = rotation_matrix(dim, seed)

    def unit_bytes(self):
        return self.dim // 32 * 34

    def encode(self, x):
        h, n, d = x.shape
        b = self.encode_in(x).reshape(h, n, d // 32, 32)
        amax = b.abs().amax(-1, keepdim=True)
        scale = amax / 127
        inv = torch.where(scale == 0, torch.zeros_like(scale), 1 / scale)
        qs = _roundf(b * inv).to(torch.int8)
        return {"d": scale.squeeze(-1).half(), "qs": qs.reshape(h, n, d)}

    def decode(self, fields):
        qs, d = fields["qs"], fields["d"]
        h, n, dim = qs.shape
        return (qs.view(h, n, dim // 32, 32).float() * d.float()[..., None]).reshape(h, n, dim)

    @staticmethod
    def to_ggml(fields):
        """(..., dim // 32 * 34) uint8 in llama.cpp's block layout."""
        d, qs = fields["d"], fields["qs"]
        nb = d.shape[-1]
        qs = qs.reshape(*qs.shape[:-1], nb, 32).view(torch.uint8)
        return torch.cat([d[..., None].view(torch.uint8), qs], -1).reshape(*d.shape[:-1], nb * 34)


class Q4_0(Q8_0):
    """llama.cpp Q4_0 over blocks of 32 channels: x = d * (q - 8), d = -max / 8 (fp16).

    ``qs`` holds each block's 16 bytes as llama.cpp does (low nibbles = channels
    0-15, high nibbles = 16-31).
    """

    names = {"q4_0": {}}
    kernel_kind = Kind.Q4_0

    def unit_bytes(self):
        return self.dim // 32 * 18

    def encode(self, x):
        h, n, d = x.shape
        b = self.encode_in(x).reshape(h, n, d // 32, 32)
        imax = b.abs().argmax(-1, keepdim=True)
        scale = torch.gather(b, -1, imax) / -8
        inv = torch.where(scale == 0, torch.zeros_like(scale), 1 / scale)
        q = torch.trunc(b * inv + 8.5).to(torch.uint8).clamp(0, 15).reshape(h, n, d // 32, 2, 16)
        qs = q[..., 0, :] | (q[..., 1, :] << 4)
        return {"d": scale.squeeze(-1).half(), "qs": qs.reshape(h, n, d // 2)}

    def decode(self, fields):
        qs, d = fields["qs"], fields["d"]
        h, n, half = qs.shape
        nb = half // 16
        v = lut_decode(qs, tuple(float(i - 8) for i in range(16)), 4).view(h, n, nb, 16, 2)
        return (v.transpose(-1, -2) * d.float()[..., None, None]).reshape(h, n, half * 2)

    @staticmethod
    def to_ggml(fields):
        d, qs = fields["d"], fields["qs"]
        nb = d.shape[-1]
        qs = qs.reshape(*qs.shape[:-1], nb, 16)
        return torch.cat([d[..., None].view(torch.uint8), qs], -1).reshape(*d.shape[:-1], nb * 18)


class TurboQuant(Codec):
    """TurboQuant-MSE: x = s * R.T c[idx] with R a seeded randomized Hadamard, c the
    Lloyd-Max codebook for N(0, 1/dim), s one fp16 scale per vector.

    The paper stores s = |x|; ours stores the least-squares s = |x| <u, c> / <c, c>
    (u = R x / |x|), which lowers the error at the same size.
    """

    default_sink = TQ_SINK

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, paper=False, bits=4):
        super().__init__(dim, role, seed, paper)
        self.code_bits = bits
        packed_size(dim, bits)
        self.rotation = rotation_matrix(dim, seed)
        cb = lloyd_max_codebook(bits) / math.sqrt(dim)
        self.codebook = cb  # (2**bits,) centroids for a unit vector's coordinates
        self.thresholds = (cb[1:] + cb[:-1]) / 2
        self.values = tuple(cb.tolist())

    names = {f"tq{b}": {"bits": b} for b in (4, 3, 2)}
    kernel_fields = ("idx", "norm", None, None)
    kernel_encoder = "tq"

    @property
    def kernel_kind(self):
        return Kind.named(f"tq{self.code_bits}")

    @functools.cached_property
    def encoder_tables(self) -> tuple:
        """What the C++ encoder takes: R.T (dim, dim) float32, the rotation's signs (dim,)
        and Hadamard block size (R = H diag(signs) per block), thresholds, codebook."""
        return (
            self.rotation.float().mT.contiguous(),
            rotation_signs(self.dim, self.seed),
            rotation_block(self.dim),
            self.thresholds.float().contiguous(),
            self.codebook.float().contiguous(),
        )

    def unit_bytes(self):
        return packed_size(self.dim, self.code_bits) + 2

    def quantize_unit(self, y: torch.Tensor) -> torch.Tensor:
        """Code-domain unit vectors (..., dim) -> codes (..., dim) int64."""
        return torch.bucketize(y, self.thresholds)

    def encode(self, x):
        norm = x.norm(dim=-1)
        u = x / norm.clamp_min(1e-30)[..., None]
        y = self.encode_in(u)
        idx = self.quantize_unit(y)
        scale = norm
        if not self.paper:
            c = self.codebook[idx]
            scale = norm * (y * c).sum(-1) / (c * c).sum(-1).clamp_min(1e-30)
        return {"idx": pack(idx, self.code_bits), "norm": _f16(scale)}

    def decode(self, fields):
        return lut_decode(fields["idx"], self.values, self.code_bits) * fields["norm"].float()[..., None]


class TurboQuantProd(TurboQuant):
    """TurboQuant-prod: (bits-1)-bit TurboQuant-MSE plus a 1-bit QJL sketch of the
    residual, so that <q, decode(x)> is an unbiased estimate of <q, x>.

    With u = R x / |x| (code domain), c = codebook[idx], r = u - c:
    decode = |x| (c + |r| sqrt(pi/2) / dim * S.T sign(S r)), S a seeded Gaussian
    (dim, dim). Research parity only: the sketch's variance hurts attention.
    """

    names = {"tqp": {"bits": 4}, "tqp3": {"bits": 3}}
    kernel_kind = None  # the sketch is not in the fused kernel
    kernel_encoder = None

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, paper=False, bits=4):
        super().__init__(dim, role, seed, paper, bits=bits - 1)
        self.total_bits = bits
        packed_size(dim, 1)
        self.projection = gaussian_matrix(dim, seed)  # S

    def unit_bytes(self):
        return packed_size(self.dim, self.code_bits) + 2 + packed_size(self.dim, 1) + 2

    def encode(self, x):
        norm = x.norm(dim=-1)
        y = self.encode_in(x / norm.clamp_min(1e-30)[..., None])
        idx = self.quantize_unit(y)
        r = y - self.codebook[idx]
        signs = (r @ self.projection.mT) >= 0
        return {
            "idx": pack(idx, self.code_bits),
            "norm": _f16(norm),
            "signs": pack(signs, 1),
            "rnorm": _f16(r.norm(dim=-1)),
        }

    def decode(self, fields):
        c = lut_decode(fields["idx"], self.values, self.code_bits)
        s = lut_decode(fields["signs"], (-1.0, 1.0), 1)
        coef = fields["rnorm"].float() * (math.sqrt(math.pi / 2) / self.dim)
        return (c + coef[..., None] * (s @ self.projection)) * fields["norm"].float()[..., None]


def _affine_codes(x: torch.Tensor, scale16: torch.Tensor, zero16: torch.Tensor, levels: int) -> torch.Tensor:
    """round((x - zero) / scale) in [0, levels], with the stored fp16 scale and zero."""
    s, z = scale16.float(), zero16.float()
    q = torch.where(s > 0, (x - z) / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(x))
    return q.round().clamp(0, levels)


class KVarN(Codec):
    """KVarN (arXiv 2606.03458): Hadamard, Sinkhorn dual-axis balancing, then affine
    round-to-nearest over tiles of 128 tokens x dim channels.

    Keys (per channel): K = (q * s_col[c] + zp[c]) * s_row[t].
    Values (per token): V = (q * s_row[t] + zp[t]) * s_col[c].
    Codes are packed along channels; scales are fp16.
    """

    tile = 128
    iters = 16

    names = {f"kvarn{b}": {"bits": b} for b in (4, 3, 2)}
    default_sink = TQ_SINK
    kernel_encoder = "kvarn"

    @property
    def kernel_kind(self):
        return Kind.named(f"{'ak' if self.role == 'k' else 'av'}{self.code_bits}")  # affine keys, KVarN values

    @property
    def kernel_fields(self):  # K: codes, s_row, then per tile s_col, zp; V: codes, s_row, zp, then per tile s_col
        return ("q", "s_row", "s_col", "zp") if self.role == "k" else ("q", "s_row", "zp", "s_col")

    @property
    def kernel_rows(self):
        return (self.tile, self.tile) if self.role == "k" else (1, self.tile)

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, paper=False, bits=4):
        super().__init__(dim, role, seed, paper)
        self.code_bits = bits
        packed_size(dim, bits)
        self.rotation = rotation_matrix(dim, seed)

    def unit_bytes(self):
        g, d = self.tile, self.dim
        meta = (2 * d + g) if self.role == "k" else (2 * g + d)
        return g * packed_size(d, self.code_bits) + 2 * meta

    def sinkhorn(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sinkhorn scales for tiles t (..., G, D): (s_tok (..., G), s_ch (..., D)),
        those of the iteration with the lowest imbalance."""
        lt = t.new_zeros(t.shape[:-1])
        lc = t.new_zeros(t.shape[:-2] + t.shape[-1:])
        best_lt, best_lc = lt, lc
        best = torch.full(t.shape[:-2], math.inf)
        for _ in range(self.iters):
            b = t * torch.exp(-lt[..., :, None] - lc[..., None, :])
            lt = (lt + b.std(-1, correction=0).clamp(1e-3, 1e3).log()).clamp(-0.3, 10)
            b = t * torch.exp(-lt[..., :, None] - lc[..., None, :])
            lc = (lc + b.std(-2, correction=0).clamp(1e-3, 1e3).log()).clamp(-0.3, 10)
            b = t * torch.exp(-lt[..., :, None] - lc[..., None, :])
            st, sc = b.std(-1, correction=0).clamp_min(1e-12), b.std(-2, correction=0).clamp_min(1e-12)
            imb = st.amax(-1) / st.amin(-1) + sc.amax(-1) / sc.amin(-1)
            better = imb < best
            best = torch.where(better, imb, best)
            best_lt = torch.where(better[..., None], lt, best_lt)
            best_lc = torch.where(better[..., None], lc, best_lc)
        return best_lt.exp(), best_lc.exp()

    def encode(self, x):
        h, n, d = x.shape
        t = self.encode_in(x).reshape(h, n // self.tile, self.tile, d)
        s_tok, s_ch = self.sinkhorn(t)
        b = t / s_tok[..., :, None] / s_ch[..., None, :]
        levels = (1 << self.code_bits) - 1
        if self.role == "k":  # per channel, over the tile's tokens
            lo, hi = b.amin(-2), b.amax(-2)
            s_col, zp, s_row = _f16(s_ch * (hi - lo) / levels), _f16(s_ch * lo), _f16(s_tok)
            q = _affine_codes(t / s_row.float()[..., :, None], s_col[..., None, :], zp[..., None, :], levels)
        else:  # per token, over channels
            lo, hi = b.amin(-1), b.amax(-1)
            s_row, zp, s_col = _f16(s_tok * (hi - lo) / levels), _f16(s_tok * lo), _f16(s_ch)
            q = _affine_codes(t / s_col.float()[..., None, :], s_row[..., :, None], zp[..., :, None], levels)
        return {"q": pack(q, self.code_bits), "s_col": s_col, "zp": zp, "s_row": s_row}

    def decode(self, fields):
        q = lut_decode(fields["q"], identity_values(self.code_bits), self.code_bits)  # (h, nt, G, d)
        s_col, zp, s_row = fields["s_col"].float(), fields["zp"].float(), fields["s_row"].float()
        if self.role == "k":
            x = (q * s_col[..., None, :] + zp[..., None, :]) * s_row[..., :, None]
        else:
            x = (q * s_row[..., :, None] + zp[..., :, None]) * s_col[..., None, :]
        h, nt, g, d = x.shape
        return x.reshape(h, nt * g, d)


class KIVI(Codec):
    """KIVI (arXiv 2402.02750): asymmetric min-max round-to-nearest with fp16 scale and
    zero; keys per channel over groups of 32 tokens, values per token over groups of
    32 channels. The paper quantizes keys 128 at a time (its residual length)."""

    group = 32

    names = {f"kivi{b}": {"bits": b} for b in (4, 3, 2)}
    default_sink = TQ_SINK

    @property
    def kernel_kind(self):
        return Kind.named(f"{'ak' if self.role == 'k' else 'ab'}{self.code_bits}")  # affine keys, KIVI values

    @property
    def kernel_fields(self):  # K: codes, then per group scale, zero; V: codes, per 32 channels scale and zero
        return ("q", None, "scale", "zero") if self.role == "k" else ("q", "scale", "zero", None)

    @property
    def kernel_rows(self):
        return (self.group, self.group) if self.role == "k" else (1, 1)

    def __init__(self, dim, role="k", seed=DEFAULT_SEED, paper=False, bits=4):
        super().__init__(dim, role, seed, paper)
        self.code_bits = bits
        packed_size(dim, bits)
        self.cgroup = math.gcd(self.group, dim)
        if role == "k":
            self.tile = 128 if paper else self.group
        elif paper:
            self.recent = 128

    def unit_bytes(self):
        codes = self.tile * packed_size(self.dim, self.code_bits)
        if self.role == "k":
            return codes + 2 * 2 * (self.tile // self.group) * self.dim
        return codes + 2 * 2 * self.tile * (self.dim // self.cgroup)

    def encode(self, x):
        h, n, d = x.shape
        levels = (1 << self.code_bits) - 1
        if self.role == "k":
            g = x.reshape(h, n // self.group, self.group, d)
            lo, hi = g.amin(-2, keepdim=True), g.amax(-2, keepdim=True)
        else:
            g = x.reshape(h, n, d // self.cgroup, self.cgroup)
            lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale, zero = _f16((hi - lo) / levels), _f16(lo)
        q = _affine_codes(g, scale, zero, levels).reshape(h, n // self.tile, self.tile, d)
        if self.role == "k":
            shape = (h, n // self.tile, self.tile // self.group, d)
        else:
            shape = (h, n // self.tile, self.tile, d // self.cgroup)
        return {"q": pack(q, self.code_bits), "scale": scale.reshape(shape), "zero": zero.reshape(shape)}

    def decode(self, fields):
        q = lut_decode(fields["q"], identity_values(self.code_bits), self.code_bits)  # (h, nt, tile, d)
        h, nt, tile, d = q.shape
        s, z = fields["scale"].float(), fields["zero"].float()
        if self.role == "k":
            q = q.view(h, nt, tile // self.group, self.group, d)
            x = q * s[..., None, :] + z[..., None, :]
        else:
            q = q.view(h, nt, tile, d // self.cgroup, self.cgroup)
            x = q * s[..., None] + z[..., None]
        return x.reshape(h, nt * tile, d)


DENSE = tuple(DENSE_DTYPES)


def codec_names() -> list[str]:
    """Every codec name, dense types first."""
    return [*DENSE, *FAMILIES, *(f"{n}-paper" for n in FAMILIES)]


def _family(name: str) -> tuple[type[Codec], dict, bool]:
    """(class, keyword arguments, paper) of a compressed type's name."""
    base, paper = (name[: -len("-paper")], True) if name.endswith("-paper") else (name, False)
    if base not in FAMILIES:
        raise TightKVError(f"unknown KV cache type '{name}' (valid: {', '.join(codec_names())})")
    cls, kw = FAMILIES[base]
    return cls, kw, paper


def codec_defaults(name: str) -> tuple[int, int]:
    """(exact sink, exact recent window) a type keeps by default, from class data alone:
    none for dense and ``-paper`` types; a wider window for types of 3 bits and less."""
    if name in DENSE_DTYPES:
        return 0, 0
    cls, kw, paper = _family(name)
    if paper:
        return 0, 0
    return cls.default_sink, LOW_BIT_RECENT if kw.get("bits", 8) <= 3 else RECENT


def make_codec(name: str, dim: int, role: str = "k", seed: int = DEFAULT_SEED) -> Codec:
    """A codec by name for vectors of `dim` channels; role "k" or "v"."""
    if name in DENSE_DTYPES:
        c = Dense(dim, role, seed, kind=name)
    else:
        cls, kw, paper = _family(name)
        c = cls(dim, role, seed, paper, **kw)
        c.sink, c.recent = codec_defaults(name)
    c.name = name
    return c
