"""Flags and helpers shared by the verbs."""
from __future__ import annotations

import argparse

from ..errors import TightKVError


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv", "--cache-type", dest="kv", default=None,
                   help="KV cache type or preset for keys and values (default progressive, or "
                        "$TIGHTKV_KV_CACHE_TYPE; ppl and bench: f16)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context length in tokens")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores)")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=None, help="tokens to generate (default: until the end)")
    p.add_argument("--temperature", "--temp", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TightKVError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise TightKVError(f"{flag} needs positive integers, got '{text}'")
    return values


def kv_list(text: str | None) -> list[str]:
    """Comma-separated KV specs (f16 when empty); an option such as ``sink=0``
    belongs to the spec before it: ``f16,tq4,tq4,sink=0,window=0`` is three specs."""
    specs: list[str] = []
    for item in (k.strip() for k in (text or "f16").split(",")):
        if "=" in item and specs:
            specs[-1] += "," + item
        elif item:
            specs.append(item)
    return specs
