"""A quick proxy for KV quality: attention-output error on captured q, k, v.

Perplexity needs a full model run per KV type; this replays one run's per-layer
queries, keys and values through any KV spec and compares each layer's attention
output with exact attention. On Gemma 3 270M the mean relative error is about half
the mean KLD against f16, and it ranks variants the same way (see the package
docstring). It ignores how errors compound across layers, so confirm with
``tightkv.eval.ppl``.

    from tightkv import Model
    from tightkv.kv import tune
    m = Model()
    layers = tune.capture(m, ids)                 # one f32 run, q/k/v kept per layer
    print(tune.attention_error(layers, "tq4"))    # {"mean": ..., "layers": [...]}
"""

from __future__ import annotations

import torch

from ..kernels import qmatmul as qm
from .cache import DenseCache, causal_window_mask, dense_attention
from .recurrent import RecurrentLayout
from .shared import SharedLayout
from .spec import parse_kv


class _Recorder(DenseCache):
    def attend(self, q, k, v, scale, sinks=None):
        self.log.append((q.clone(), k.clone(), v.clone()))
        self.scale, self.sinks = scale, sinks
        return super().attend(q, k, v, scale, sinks)


@torch.inference_mode()
def capture(model, ids: list[int], chunk: int = 512) -> list[dict]:
    """Per attention layer: {"q" (H, N, D), "k" (Hkv, N, D), "v" (Hkv, N, Dv), "window", "scale", "sinks",
    "layer" (its index), "layers" (the model's layer count)} (a hybrid model's recurrent layers
    run on their own state and are not captured)."""
    layout = model.net.cache_layout()
    caches = []
    for L in layout:
        if isinstance(L, RecurrentLayout):
            caches.append(L.make_cache())
            continue
        if isinstance(L, SharedLayout):  # reads an earlier layer's KV: nothing of its own to capture
            caches.append(L.make_cache(caches))
            continue
        c = _Recorder("f32", *L)
        c.log = []
        caches.append(c)
    with qm.float_prompts():
        for s in range(0, len(ids), chunk):
            model.net(torch.tensor(ids[s : s + chunk]), caches, logits_at=torch.tensor([], dtype=torch.long))
    return [
        {
            "q": torch.cat([x[0] for x in c.log], 1),
            "k": torch.cat([x[1] for x in c.log], 1),
            "v": torch.cat([x[2] for x in c.log], 1),
            "window": L[3],
            "scale": c.scale,
            "sinks": c.sinks,
            "layer": i,
            "layers": len(layout),
        }
        for i, (c, L) in enumerate(zip(caches, layout))
        if isinstance(c, _Recorder)
    ]


@torch.inference_mode()
def attention_error(layers: list[dict], spec: str, chunk: int = 512, scored_from: float = 0.5) -> dict:
    """Relative squared error of each layer's attention output (positions from
    `scored_from` of the way in) against exact attention over fp16 keys and values."""
    errs = []
    for i, L in enumerate(layers):
        q, k, v = L["q"], L["k"], L["v"]
        n = q.shape[1]
        pos = torch.arange(n)
        mask, sinks = causal_window_mask(pos, pos, L["window"]), L.get("sinks")
        exact = dense_attention(q, k.half().float(), v.half().float(), mask, L["scale"], sinks)
        cache = parse_kv(spec).make_cache(
            L.get("layer", i), L.get("layers", len(layers)), k.shape[0], k.shape[2], v.shape[2], L["window"]
        )
        out = torch.cat(
            [
                cache.attend(q[:, s : s + chunk], k[:, s : s + chunk], v[:, s : s + chunk], L["scale"], sinks)
                for s in range(0, n, chunk)
            ],
            1,
        )
        a = int(n * scored_from)
        errs.append(float(((out[:, a:] - exact[:, a:]) ** 2).sum() / (exact[:, a:] ** 2).sum()))
    return {"spec": spec, "mean": sum(errs) / len(errs), "max": max(errs), "layers": errs}
