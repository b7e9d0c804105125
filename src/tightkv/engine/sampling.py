"""Token sampling: greedy, temperature, top-k, top-p, min-p, logit bias, the repetition,
frequency and presence penalties, seed.

The order follows llama.cpp's default chain: logit bias, penalties, top-k, top-p,
min-p, temperature, then a draw.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch

from ..kernels.qmatmul import small_ops

FLT_MAX = torch.finfo(torch.float32).max


@dataclass
class SamplingParams:
    """How to pick the next token. temperature <= 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0  # 1.0 disables
    frequency_penalty: float = 0.0  # minus this times a token's count in the window
    presence_penalty: float = 0.0  # minus this once for a token in the window
    repeat_last_n: int = 64  # the penalties' window: the last n tokens of prompt and reply; 0 disables, -1 all
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    seed: int | None = None

    def validate(self) -> None:
        from ..errors import TightKVError

        if self.temperature < 0:
            raise TightKVError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 <= self.top_p <= 1:
            raise TightKVError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise TightKVError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < 0:
            raise TightKVError(f"top_k must be >= 0, got {self.top_k}")
        if self.repeat_penalty <= 0:
            raise TightKVError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise TightKVError(f"repeat_last_n must be >= -1 (-1: the whole context), got {self.repeat_last_n}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise TightKVError(f"{name} must be a finite number, got {getattr(self, name)}")
        for token, bias in (self.logit_bias or {}).items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise TightKVError(f"logit_bias keys must be token ids, got {token!r}")
            if math.isnan(bias) or bias == math.inf:
                raise TightKVError(f"logit_bias for token {token} must be a number or -inf, got {bias}")

    @property
    def penalizes(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )


class Sampler:
    """Picks tokens from logits (vocab,) with a private, seeded generator."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.generator = torch.Generator()
        self.generator.manual_seed(params.seed if params.seed is not None else torch.seed())
        bias = params.logit_bias or {}
        self.bias_ids = torch.tensor(list(bias), dtype=torch.long)  # (n,)
        self.bias = torch.tensor(list(bias.values()), dtype=torch.float32)  # (n,)

    def adjusted(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        """logits (vocab,) as float32 with the logit bias added and the penalties taken off
        over the last repeat_last_n tokens of `history` (all of them for -1)."""
        p = self.p
        logits = logits.float()
        if self.bias.numel():
            logits = logits.index_add(0, self.bias_ids, self.bias)
        if p.penalizes and history:  # an extreme penalty stays finite
            window = history if p.repeat_last_n < 0 else history[-p.repeat_last_n :]
            logits = penalize(logits, window, p).clamp(-FLT_MAX, FLT_MAX)
        return logits

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        p = self.p
        logits = self.adjusted(logits, history)
        if p.temperature <= 0:
            return argmax(logits)
        logits, ids = _truncate(logits, p)
        probs = torch.softmax((logits - logits.max()) / p.temperature, dim=-1)  # tiny T stays finite
        choice = draw(probs, self.generator)
        return choice if ids is None else int(ids[choice])


def argmax(logits: torch.Tensor) -> int:
    """The index of the first largest of a 1-D float tensor, as torch.argmax gives it, in
    one vectorized kernel call (torch's is several times slower over a 262,144-token
    vocabulary, a noticeable share of a small model's step)."""
    lib = small_ops(logits)
    if lib is None or logits.dim() != 1 or not logits.is_contiguous():
        return int(torch.argmax(logits))
    out = ctypes.c_int64()
    lib.tk_argmax(logits.data_ptr(), 1, logits.numel(), logits.numel(), ctypes.byref(out))
    return out.value


def penalize(logits: torch.Tensor, recent: list[int], p: SamplingParams) -> torch.Tensor:
    """logits (vocab,) with llama.cpp's penalties on the tokens of `recent`: each logit
    divided by repeat_penalty where positive (multiplied where not), then less
    frequency_penalty times the token's count and presence_penalty once."""
    logits = logits.clone()
    ids, counts = torch.unique(torch.tensor(recent, dtype=torch.long), return_counts=True)
    vals = logits[ids]
    if p.repeat_penalty != 1.0:
        vals = torch.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
    logits[ids] = vals - counts.float() * p.frequency_penalty - p.presence_penalty
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """An index drawn from probs (n,) (non-negative, any positive total) by the inverse of
    their cumulative sum, in float64: one uniform number and a binary search, where
    `torch.multinomial` over a whole vocabulary cost more than a small model's decode step
    (`python bench/sampling_cost.py`)."""
    cum = torch.cumsum(probs, 0, dtype=torch.float64)
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cum[-1]
    i = int(torch.searchsorted(cum, u, right=True))
    return i if i < probs.numel() else int((cum < cum[-1]).sum())  # u rounded up to the total: the last token with any


def _truncate(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Keep the candidates that survive top-k, top-p and min-p: (logits, ids), sorted; or
    (logits, None) where none of them is set (the whole vocabulary, as it is). Top-p's
    probabilities are over the whole vocabulary, or over the top k where top-k is set."""
    if 0 < p.top_k < logits.numel():
        values, ids = torch.topk(logits, p.top_k)
        total = torch.logsumexp(values, 0) if p.top_p < 1.0 else None
    elif p.top_p < 1.0 or p.min_p > 0:
        total = torch.logsumexp(logits, 0)
        values, ids = _sorted_head(logits, p, total)
    else:
        return logits, None
    if p.top_p < 1.0:
        cum = torch.cumsum(torch.exp(values - total), dim=-1)
        keep = int(torch.searchsorted(cum, torch.tensor([p.top_p])).item()) + 1
        values, ids = values[:keep], ids[:keep]
    if p.min_p > 0:
        keep = values - values[0] >= math.log(p.min_p)  # p_i >= min_p * p_0
        values, ids = values[keep], ids[keep]
    return values, ids


def _sorted_head(logits: torch.Tensor, p: SamplingParams, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest logits in order, as many as top-p and min-p can keep (log-sum-exp `total`):
    a few hundred candidates, growing 8x at a time while they hold less than top_p of the
    probability or all clear min_p, so that a whole vocabulary is sorted only where a flat
    distribution needs it (`python bench/sampling_cost.py` times both ways)."""
    n, k = logits.numel(), 256
    while True:
        k = min(k, n)
        values, ids = torch.topk(logits, k)
        if k == n:
            return values, ids
        mass = float(torch.exp(values - total).sum())
        if (p.top_p < 1.0 and mass >= p.top_p) or (
            p.top_p >= 1.0 and float(values[-1] - values[0]) < math.log(p.min_p)
        ):
            return values, ids
        k *= 8
