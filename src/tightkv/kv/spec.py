"""KV cache specs: what `--kv`, `kv=`, `--cache-type-k/-v` and `TIGHTKV_KV_CACHE_TYPE` accept.

Grammar (case-insensitive, spaces ignored)::

    spec    := head ("," option)*
    head    := preset | type | type ":" type        (one type = keys and values; K:V)
    option  := "sink=" N                           exact first tokens (0 = off)
             | "window=" N                         exact recent tokens (0 = off)
             | "protect=" N                        first and last N layers at q8_0
             | "L" layers "=" type [":" type]      per-layer override
    layers  := i | i ".." j                        inclusive; negative counts from the end

Examples: ``tq4``, ``q8_0:tq4``, ``progressive``, ``tq3,sink=0,window=256``,
``tq4,protect=2``, ``tq4,L0..1=q8_0,L-2..-1=q8_0``.

Types: see `codecs.codec_names()`; each compressed type comes with a default sink
and recent window (``-paper`` types: as published), and a K:V pair takes the larger
of the two. Presets:

- ``progressive``: tq4 keys and values, 16-token sink, 128-token exact window.
- ``aggressive``: kvarn3 keys, tq3 values, sink 4, window 256: 7.8x smaller than an
  FP32 cache at 32K tokens on Gemma 3 270M, 9.4x on a Llama-shaped model, all counted.
- ``k8v4``: q8_0 keys, tq4 values (keys carry the damage).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from ..errors import TightKVError
from .codecs import DENSE, codec_defaults, codec_names, make_codec
from .recurrent import RecurrentLayout, recurrent_bytes
from .rotation import DEFAULT_SEED
from .shared import SharedLayout

PRESETS: dict[str, dict] = {
    "progressive": {"k": "tq4", "v": "tq4", "sink": 16, "recent": 128},
    "aggressive": {"k": "kvarn3", "v": "tq3", "sink": 4, "recent": 256},
    "k8v4": {"k": "q8_0", "v": "tq4"},
}
PROTECT_TYPE = "q8_0"


@dataclass(frozen=True)
class KVSpec:
    """A parsed KV cache spec.

    Attributes:
        k, v: key and value types.
        sink, recent: exact first / last tokens; None takes the types' defaults.
        overrides: (first, last, k, v) per-layer types, inclusive layer ranges,
            negative indices counting from the end; later entries win.
        seed: rotation seed of the codecs.
        text: the spec as written.
    """

    k: str = "f16"
    v: str = "f16"
    sink: int | None = None
    recent: int | None = None
    overrides: tuple[tuple[int, int, str, str], ...] = field(default=())
    seed: int = DEFAULT_SEED
    text: str = ""

    def __str__(self) -> str:
        return self.text or (self.k if self.k == self.v else f"{self.k}:{self.v}")

    def types(self, layer: int, num_layers: int) -> tuple[str, str]:
        """(key type, value type) of one layer."""
        k, v = self.k, self.v
        for first, last, ok, ov in self.overrides:
            a, b = first % num_layers if first < 0 else first, last % num_layers if last < 0 else last
            if a <= layer <= b:
                k, v = ok, ov
        return k, v

    def policy(self, k: str, v: str) -> tuple[int, int]:
        """(sink, recent) for a layer of these types: the spec's, else the larger default."""
        (ks, kr), (vs, vr) = codec_defaults(k), codec_defaults(v)
        return (max(ks, vs) if self.sink is None else self.sink, max(kr, vr) if self.recent is None else self.recent)

    def make_cache(
        self,
        layer: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        value_dim: int | None = None,
        window: int | None = None,
        max_tokens: int | None = None,
    ):
        """The cache of one layer; max_tokens (the context length) lets it reserve its store."""
        from .cache import DenseCache
        from .compressed import CompressedCache

        value_dim = value_dim or head_dim
        k, v = self.types(layer, num_layers)
        if k == v and k in DENSE:
            return DenseCache(k, num_kv_heads, head_dim, value_dim, window)
        kc, vc = make_codec(k, head_dim, "k", self.seed), make_codec(v, value_dim, "v", self.seed)
        sink, recent = self.policy(k, v)
        if window is not None and recent >= window:  # the exact window covers all the layer sees
            return DenseCache("f16", num_kv_heads, head_dim, value_dim, window)
        return CompressedCache(kc, vc, num_kv_heads, window, sink, recent, max_tokens)

    def make_caches(self, cache_layout: list, max_tokens: int | None = None) -> list:
        """One cache per layer from [(kv heads, key dim, value dim, window or None)]; a
        layer laid out as a `recurrent.RecurrentLayout` gets its exact recurrent state, one
        laid out as a `shared.SharedLayout` a view of an earlier layer's cache."""
        n = len(cache_layout)
        caches: list = []
        for i, L in enumerate(cache_layout):
            if isinstance(L, SharedLayout):
                caches.append(L.make_cache(caches))
            else:
                caches.append(
                    L.make_cache()
                    if isinstance(L, RecurrentLayout)
                    else self.make_cache(i, n, *L, max_tokens=max_tokens)
                )
        return caches


def valid_names() -> list[str]:
    return [*PRESETS, *codec_names()]


def _type(name: str) -> str:
    if name in PRESETS:  # a preset names both halves: it cannot be one side of a pair
        p = PRESETS[name]
        raise TightKVError(
            f"'{name}' is a preset for keys and values together ({p['k']}:{p['v']}), not one side's "
            f"type; use it whole (--kv {name}) or name each side's type (e.g. {p['k']})"
        )
    if name not in codec_names():
        raise TightKVError(f"unknown KV cache type '{name}' (valid: {', '.join(valid_names())})")
    return name


def _pair(text: str) -> tuple[str, str]:
    parts = text.split(":")
    if len(parts) == 1:
        return _type(parts[0]), _type(parts[0])
    if len(parts) == 2:
        return _type(parts[0]), _type(parts[1])
    raise TightKVError(f"bad KV type pair '{text}': use K:V, e.g. q8_0:tq4")


def _count(key: str, value: str) -> int:
    if not value.isdigit():
        raise TightKVError(f"KV option {key} needs a non-negative integer, got '{value}'")
    return int(value)


_LAYERS = re.compile(r"^l(-?\d+)(?:\.\.(-?\d+))?$")


DEFAULT = "kvarn4"  # the default cache type, chosen by measurement across texts and models (docs/kv-cache.md)
ENV = "TIGHTKV_KV_CACHE_TYPE"  # the environment variable that replaces it
AUTO = "auto"  # not a type: `--kv auto` / kv="auto" has `tightkv.autokv` choose one


def is_auto(kv: "str | KVSpec | None") -> bool:
    """Whether a KV spec asks for the chooser (`tightkv.autokv`): the one place the
    string "auto" is read as a KV spec."""
    return isinstance(kv, str) and kv.strip().lower() == AUTO


def check_kv(spec: str, source: str) -> str:
    """`spec`, parsed to check it ("auto" passes: the chooser decides later); an error
    names `source`, the flag, variable or Modelfile line it came from."""
    if is_auto(spec):
        return AUTO
    try:
        parse_kv(spec)
    except TightKVError as err:
        raise TightKVError(f"{source}: {err}") from None
    return spec


def resolve_kv(kv: "str | KVSpec | None" = None) -> KVSpec:
    """The spec to use: `kv` if given, else $TIGHTKV_KV_CACHE_TYPE, else the default."""
    if kv:
        return parse_kv(kv)
    env = os.environ.get(ENV)
    if not env:
        return parse_kv(DEFAULT)
    try:
        return parse_kv(env)
    except TightKVError as err:
        raise TightKVError(f"{ENV}: {err}") from None


def parse_kv(text: "str | KVSpec | None") -> KVSpec:
    """Parse a KV spec (see the module docstring); a KVSpec passes through."""
    if isinstance(text, KVSpec):
        return text
    raw = (text or "f16").strip()
    items = [p for p in re.sub(r"\s+", "", raw).lower().split(",")]
    if not items[0]:
        raise TightKVError(f"empty KV cache type (valid: {', '.join(valid_names())})")
    head, options = items[0], items[1:]
    if head in PRESETS:
        spec = KVSpec(**PRESETS[head])
    else:
        k, v = _pair(head)
        spec = KVSpec(k, v)
    overrides = list(spec.overrides)
    for opt in options:
        key, eq, value = opt.partition("=")
        if not eq or not value:
            raise TightKVError(f"bad KV option '{opt}': use sink=N, window=N, protect=N or L<i>[..<j>]=TYPE")
        if key == "sink":
            spec = replace(spec, sink=_count(key, value))
        elif key in ("window", "recent"):
            spec = replace(spec, recent=_count(key, value))
        elif key == "protect":
            n = _count(key, value)
            if n:
                overrides += [(0, n - 1, PROTECT_TYPE, PROTECT_TYPE), (-n, -1, PROTECT_TYPE, PROTECT_TYPE)]
        elif m := _LAYERS.match(key):
            first = int(m.group(1))
            last = int(m.group(2)) if m.group(2) is not None else first
            overrides.append((first, last, *_pair(value)))
        else:
            raise TightKVError(f"unknown KV option '{key}' (valid: sink, window, protect, L<i>[..<j>])")
    return replace(spec, overrides=tuple(overrides), text=raw)


def _dense_bytes(itemsize: int, layout, tokens: int) -> int:
    total = 0
    for h, d, dv, w in attention_layers(layout):
        total += (min(tokens, w) if w else tokens) * h * (d + dv) * itemsize
    return total


def kv_bytes_per_token(
    spec: "str | KVSpec", cache_layout: list[tuple[int, int, int, int | None]], context: int
) -> dict:
    """KV bytes a model's cache holds at `context` tokens with this spec, everything
    counted (body codes and scales, exact sink and window, centring vectors), against
    dense FP16 and FP32 caches under the same sliding-window policy.

    Returns a dict: spec, context, total_bytes, bytes_per_token, f16_bytes,
    f32_bytes, ratio_vs_f16, ratio_vs_f32, layers (per attention layer: k, v, sink, recent,
    window, bytes), and recurrent_bytes: the fixed float32 state of a hybrid model's
    linear-attention layers (`recurrent.RecurrentLayout`), not in total_bytes (it does not
    grow with the context, and no --kv type changes it).
    """
    spec = parse_kv(spec)
    n = len(cache_layout)
    layers = []
    for i, L in enumerate(cache_layout):
        if not isinstance(L, tuple):  # a recurrent layer, or one sharing another's KV
            continue
        h, d, dv, w = L
        k, v = spec.types(i, n)
        cache = spec.make_cache(i, n, h, d, dv, w)
        layers.append(
            {"k": k, "v": v, "sink": cache.sink, "recent": cache.recent, "window": w, "bytes": cache.bytes_at(context)}
        )
    total = sum(x["bytes"] for x in layers)
    f16, f32 = _dense_bytes(2, cache_layout, context), _dense_bytes(4, cache_layout, context)
    return {
        "spec": str(spec),
        "context": context,
        "total_bytes": total,
        "bytes_per_token": total / max(1, context),
        "f16_bytes": f16,
        "f32_bytes": f32,
        "ratio_vs_f16": f16 / total if total else float("inf"),
        "ratio_vs_f32": f32 / total if total else float("inf"),
        "layers": layers,
        "recurrent_bytes": recurrent_bytes(cache_layout)[0],
    }


def attention_layers(cache_layout: list) -> list[tuple[int, int, int, int | None]]:
    """The (kv heads, key dim, value dim, window) of the layers that hold KV (not a recurrent
    layer's state, nor a layer reading another's KV: `shared.SharedLayout`)."""
    return [L for L in cache_layout if isinstance(L, tuple)]
