"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seed.

The order follows llama.cpp's default chain: penalties, top-k, top-p, min-p,
temperature, then a draw.
"""
from __future__ import annotations

import ctypes
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
    repeat_last_n: int = 64
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


class Sampler:
    """Picks tokens from logits (vocab,) with a private, seeded generator."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.generator = torch.Generator()
        self.generator.manual_seed(params.seed if params.seed is not None else torch.seed())

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        p = self.p
        logits = logits.float()
        if p.repeat_penalty != 1.0 and history:  # an extreme penalty stays finite
            logits = _penalize(logits, history[-p.repeat_last_n:], p.repeat_penalty).clamp(-FLT_MAX, FLT_MAX)
        if p.temperature <= 0:
            return argmax(logits)
        logits, ids = _truncate(logits, p)
        probs = torch.softmax((logits - logits[0]) / p.temperature, dim=-1)  # sorted: [0] is the max; tiny T is finite
        choice = torch.multinomial(probs, 1, generator=self.generator)
        return int(ids[choice])


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


def _penalize(logits: torch.Tensor, recent: list[int], penalty: float) -> torch.Tensor:
    logits = logits.clone()
    idx = torch.tensor(sorted(set(recent)), dtype=torch.long)
    vals = logits[idx]
    logits[idx] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def _truncate(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the candidates that survive top-k, top-p and min-p: (logits, ids), sorted."""
    if 0 < p.top_k < logits.numel():
        values, ids = torch.topk(logits, p.top_k)
    else:
        values, ids = torch.sort(logits, descending=True)
    if p.top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        keep = int(torch.searchsorted(cum, torch.tensor([p.top_p])).item()) + 1
        values, ids = values[:keep], ids[:keep]
    if p.min_p > 0:
        probs = torch.softmax(values, dim=-1)
        keep = probs >= p.min_p * probs[0]
        values, ids = values[keep], ids[keep]
    return values, ids
