"""A model's working memory: the longest document it still answers questions about.

Small models fall off a cliff well before their nominal context. `auto` mode
puts a document whole into the cache only when it fits inside this length, and
every RLV call stays below it. The figure comes from a measurement,
`tightkv docqa --measure-wm` (see `tightkv.eval.docqa.measure_working_memory`):
facts planted in essay text at spread depths, asked about with the whole text
in context, at growing lengths; the working memory is the longest length before
the first one where accuracy falls below `PASS_RATE` times the model's peak
accuracy on these facts (its ceiling: a small model misreads some facts at
any length, which is not a context effect).

Lookup order: a measurement saved by the user (``home()/documents/
working_memory.json``), then the built-in measurements below, then an
unmeasured default (a quarter of the context, at most 2048 tokens) that says so.
"""

from __future__ import annotations

import json
from pathlib import Path

PASS_RATE = 0.75

# model identity (see store.model_identity, without the rope part) -> measurement
BUILTIN: dict[str, dict] = {
    # Gemma 3 270M Q4_K_M (the embedded model); docs/bench/docqa.json "working_memory"
    "sha256:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818": {
        # planted facts answered with the whole text in context (f16): 1K 8/8, 2K 8/9, 4K 6/10, 8K 7/10,
        # 16K 5/10; 4K is the first length under 75% of the peak
        "tokens": 2048,
        "source": "measured by tightkv docqa --measure-wm (docs/bench/docqa.json)",
    },
}


def _file() -> Path:
    from ..kv.saved import documents_dir

    return documents_dir() / "working_memory.json"


def _identity(model) -> str:
    from ..kv.saved import model_identity

    return model_identity(model).split("|rope=")[0]


def working_memory(model) -> tuple[int, str]:
    """(tokens, where the figure comes from) for a model."""
    ident = _identity(model)
    try:
        saved = json.loads(_file().read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.get(ident) or BUILTIN.get(ident)
    ctx = int(getattr(model, "context_length", 0) or 0)
    if entry:
        tokens = int(entry["tokens"])
        return (min(tokens, ctx) if ctx else tokens), entry.get("source", "measured")
    return max(256, min(2048, ctx // 4)), "unmeasured default: run `tightkv docqa --measure-wm`"


def save_working_memory(model, tokens: int, detail: dict | None = None) -> Path:
    """Record a measurement for this model (used by auto mode and RLV from now on)."""
    path = _file()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    saved[_identity(model)] = {
        "tokens": int(tokens),
        "source": "measured by tightkv docqa --measure-wm",
        "detail": detail or {},
    }
    path.write_text(json.dumps(saved, indent=1))
    return path
