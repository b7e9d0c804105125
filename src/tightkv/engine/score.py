"""Scoring forwards: the final hidden states of a token span at the positions a
measurement scores (perplexity, KLD against f16, the `--kv auto` probe), computed
through a given cache so that every KV type is scored the same way."""

from __future__ import annotations

import torch


@torch.inference_mode()
def scored_hidden(net, ids: list[int], cache: list, first: int, sub: int, on_piece=None) -> torch.Tensor:
    """Final-normed hidden states (len(ids)-1-first, hidden) at positions first..len(ids)-2
    (each predicts the next token), running ids through `cache` `sub` tokens per forward;
    `on_piece(n)` is told after each forward call of n tokens."""
    out = []
    for s in range(0, len(ids), sub):
        part = ids[s : s + sub]
        lo, hi = max(first - s, 0), min(len(part), len(ids) - 1 - s)
        rows = torch.arange(lo, max(lo, hi))
        h = net(torch.tensor(part), cache, logits_at=rows, hidden=True)
        if h is not None:
            out.append(h)
        if on_piece:
            on_piece(len(part))
    return torch.cat(out)
