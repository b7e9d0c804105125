"""tightkv: local LLMs with a compressed KV cache.

`Model` is imported lazily so that `import tightkv` (and `tightkv --help`) never
imports torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Model", "__version__"]


def __getattr__(name):
    if name == "Model":
        from .api import Model

        return Model
    raise AttributeError(f"module 'tightkv' has no attribute {name!r}")
