"""Scoring forwards: the final hidden states of a token span at the positions a
measurement scores (perplexity, KLD against f16, the `--kv auto` probe), computed
through a given cache so that every KV type is scored the same way, in float32 prompts
(`kernels.qmatmul.float_prompts`)."""

from __future__ import annotations

import torch

from ..kernels import qmatmul as qm


@torch.inference_mode()
def scored_hidden(net, ids: list[int], cache: list, first, sub: int, on_piece=None) -> torch.Tensor:
    """Final-normed hidden states (rows, hidden) at the scored positions (each predicts
    the next token): positions first..len(ids)-2 for an int `first`, else the sorted
    positions `first` gives (a 1-D tensor), running ids through `cache` `sub` tokens per
    forward; `on_piece(n)` is told after each forward call of n tokens."""
    positions = torch.arange(first, len(ids) - 1) if isinstance(first, int) else torch.as_tensor(first)
    out = []
    with qm.float_prompts():
        for s in range(0, len(ids), sub):
            part = ids[s : s + sub]
            rows = positions[(positions >= s) & (positions < s + len(part))] - s
            h = net(torch.tensor(part), cache, logits_at=rows, hidden=True)
            if h is not None:
                out.append(h)
            if on_piece:
                on_piece(len(part))
    return torch.cat(out)


def scored_logits(net, hidden: torch.Tensor) -> torch.Tensor:
    """The logits (rows, vocab) of scored hidden states (`scored_hidden`'s), through the
    output matrix in float32 prompts as they were computed."""
    with qm.float_prompts():
        return net.output(hidden)
