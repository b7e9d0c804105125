"""The recurrent state of a linear-attention layer (Gated DeltaNet), in the cache protocol.

A hybrid model's cache is per layer either attention KV (`cache.DenseCache`,
`compressed.CompressedCache`) or a `RecurrentState`: the short convolution's last inputs and
the delta-rule state, fixed in size whatever the context, kept exact in float32. The layer
(`models.deltanet`) reads and writes `conv` and `ssm` and advances `offset`.

A recurrent state cannot be trimmed back to an earlier token: the state of token n is gone
once token n + 1 is folded in. So the state keeps checkpoints, copies of itself at the end
of each prefill chunk (the 512-token grid and the prompt's cuts, `engine.generate.chunk_ends`:
where chat turns begin and prefixes are stored), as llama.cpp keeps context checkpoints.
`trim(n)` goes back to a checkpoint exactly; elsewhere `can_trim` says no, and the caller
recomputes from the latest checkpoint before (`rewind_point`), never approximates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_CHECKPOINTS = 4  # per layer, the latest kept (each as large as the state itself)


@dataclass(frozen=True)
class RecurrentLayout:
    """What a linear-attention layer keeps: the last `conv_kernel - 1` inputs of its short
    convolution over `conv_channels`, and a (key_dim, value_dim) state per value head."""

    conv_channels: int
    conv_kernel: int
    heads: int
    key_dim: int
    value_dim: int

    @property
    def nbytes(self) -> int:
        """Bytes of one state (float32), whatever the context."""
        return 4 * ((self.conv_kernel - 1) * self.conv_channels + self.heads * self.key_dim * self.value_dim)

    def make_cache(self) -> "RecurrentState":
        return RecurrentState(self)


class RecurrentState:
    """One linear-attention layer's state: `conv` (conv_kernel - 1, channels) and `ssm`
    (heads, key_dim, value_dim), float32, with checkpoints at prefill chunk ends."""

    window = None
    sink = recent = 0
    exact_trim = False  # trim goes back only to a checkpoint

    def __init__(self, layout: RecurrentLayout):
        self.layout = layout
        self.offset = 0
        self.conv = torch.zeros(layout.conv_kernel - 1, layout.conv_channels)
        self.ssm = torch.zeros(layout.heads, layout.key_dim, layout.value_dim)
        self.checkpoints: dict[int, tuple[torch.Tensor, torch.Tensor]] = {0: (self.conv, self.ssm)}

    def advance(self, conv: torch.Tensor, ssm: torch.Tensor, tokens: int) -> None:
        """Take the state after `tokens` more tokens; a prefill chunk's end (tokens > 1) is kept
        as a checkpoint (decode steps are not)."""
        self.conv, self.ssm, self.offset = conv, ssm, self.offset + tokens
        if tokens > 1:
            self.checkpoint()

    def writable(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv, ssm) to update in place: these, or copies where a checkpoint holds them."""
        held = any(c is self.conv or s is self.ssm for c, s in self.checkpoints.values())
        return (self.conv.clone(), self.ssm.clone()) if held else (self.conv, self.ssm)

    def checkpoint(self) -> None:
        """Keep the current state (its tensors are never written in place after: `writable`)."""
        self.checkpoints[self.offset] = (self.conv, self.ssm)
        while len(self.checkpoints) > MAX_CHECKPOINTS:
            del self.checkpoints[min(self.checkpoints)]

    def can_trim(self, n: int) -> bool:
        return n == 0 or self.offset - n in self.checkpoints

    def trim(self, n: int) -> None:
        if n == 0:
            return
        if not self.can_trim(n):
            raise ValueError(f"no checkpoint of the recurrent state at token {self.offset - n}")
        self.offset -= n
        self.conv, self.ssm = self.checkpoints[self.offset]
        for p in [p for p in self.checkpoints if p > self.offset]:
            del self.checkpoints[p]

    @property
    def nbytes(self) -> int:
        """The state and its checkpoints (each a state's bytes)."""
        held = {id(c) for c, _ in self.checkpoints.values()} | {id(self.conv)}
        return len(held) * self.layout.nbytes

    def bytes_at(self, tokens: int) -> int:
        return self.layout.nbytes

    def state(self) -> dict[str, torch.Tensor]:
        return {"conv": self.conv.clone(), "ssm": self.ssm.clone(), "meta": torch.tensor([self.offset])}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        conv, ssm = state["conv"].float().clone(), state["ssm"].float().clone()
        if conv.shape != self.conv.shape or ssm.shape != self.ssm.shape:
            raise ValueError(f"recurrent state of shape {tuple(ssm.shape)}, not {tuple(self.ssm.shape)}")
        self.conv, self.ssm, self.offset = conv, ssm, int(state["meta"][0])
        self.checkpoints = {self.offset: (self.conv, self.ssm)}


def recurrent_bytes(layout: list) -> tuple[int, int]:
    """(one state, the most the states hold with their prefill checkpoints) of a cache layout's
    linear-attention layers (`RecurrentLayout`); (0, 0) where every layer is attention."""
    state = sum(L.nbytes for L in layout if isinstance(L, RecurrentLayout))
    return state, state * (1 + MAX_CHECKPOINTS)


def rewind_point(cache: list, keep: int) -> int:
    """The latest position <= keep every layer of `cache` can be trimmed back to exactly (the
    latest common checkpoint of its recurrent layers; keep itself where there are none)."""
    points = [set(c.checkpoints) for c in cache if isinstance(c, RecurrentState)]
    if not points:
        return keep
    common = set.intersection(*points)
    return max((p for p in common if p <= keep), default=0)
