"""The two checks every family fixture of tests/data/families takes against its references
(reference.npz, written by tests/reference/mkfamilies.py and mkgemma4.py): an f32 file's logits
against transformers' and llama.cpp's, and a quantized file's greedy continuation against
llama.cpp's up to its first near tie."""

from __future__ import annotations

import numpy as np
import torch

from tightkv.engine.generate import decode_step


def assert_f32_logits_match(m, z, atol_hf: float, atol_llama: float) -> None:
    """Every prompt position in one prefill, then 8 decode steps on llama.cpp's greedy tokens,
    within atol of transformers' logits and of llama.cpp's; the first greedy token llama.cpp's."""
    cache = m.new_cache("f32")
    out = m.net(torch.tensor(z["prompt_ids"].tolist()), cache).numpy()
    np.testing.assert_allclose(out, z["hf_prompt_logits"], atol=atol_hf, rtol=0)
    np.testing.assert_allclose(out, z["llama_f32_prompt_logits"], atol=atol_llama, rtol=0)
    greedy = z["llama_f32_greedy"].tolist()
    steps = np.stack([decode_step(m.net, t, cache).numpy() for t in greedy[:8]])
    np.testing.assert_allclose(steps, z["hf_f32_decode_logits"], atol=atol_hf, rtol=0)
    np.testing.assert_allclose(steps, z["llama_f32_decode_logits"], atol=atol_llama, rtol=0)
    assert int(out[-1].argmax()) == greedy[0]


def assert_greedy_matches(m, z, kind: str, near_tie: float, top1: float) -> np.ndarray:
    """A quantized file (`kind`, as the npz keys name it): the prompt's top-1 tokens are
    llama.cpp's in at least a `top1` share of the positions, and the greedy continuation is
    llama.cpp's until llama.cpp's own top-2 margin falls under `near_tie` (what the two engines'
    rounding of the activations moves a logit). Returns the prompt's logits."""
    cache = m.new_cache("f32")
    out = m.net(torch.tensor(z["prompt_ids"].tolist()), cache).numpy()
    assert (out.argmax(-1) == z[f"llama_{kind}_prompt_logits"].argmax(-1)).mean() >= top1
    greedy, margins = z[f"llama_{kind}_greedy"].tolist(), z[f"llama_{kind}_margins"]
    tokens = [int(out[-1].argmax())]
    while len(tokens) < len(greedy):
        tokens.append(int(decode_step(m.net, tokens[-1], cache).argmax()))
    for i, (ours, theirs) in enumerate(zip(tokens, greedy)):
        if margins[i] < near_tie:
            break
        assert ours == theirs, f"step {i}: {ours} != llama.cpp's {theirs} (margin {margins[i]:.3f})"
    return out
