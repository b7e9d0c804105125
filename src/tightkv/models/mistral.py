"""Mistral under its own GGUF architecture name ``mistral``: Llama's graph plus
sliding-window attention when the file has ``mistral.attention.sliding_window``
(Mistral 7B v0.1: 4096; later versions attend globally). llama.cpp converts
Mistral checkpoints to the ``llama`` architecture (see llama.py); this file reads
the same layout under the other name, so it extends Llama's ModelArgs.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .decoder import Model

__all__ = ["ModelArgs", "Model"]


@dataclass
class ModelArgs(llama.ModelArgs):
    sliding_window: int | None = None  # every layer attends to this many tokens; None: all

    @classmethod
    def from_gguf(cls, g, **extra):
        window = int(g.metadata.get(f"{g.architecture}.attention.sliding_window") or 0)
        extra.setdefault("sliding_window", window or None)
        return super().from_gguf(g, **extra)

    def window(self, layer: int) -> int | None:
        return self.sliding_window
