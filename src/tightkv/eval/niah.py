"""Needle in a haystack: a fact planted at a depth of a long text, asked for at
the end, scored by exact match of its key fact (no LLM judge).

The prompt is [BOS] + haystack[:pos] + needle + haystack[pos:] + question, with
the haystack cut so the whole prompt is `length` tokens. The needle goes at the
sentence boundary nearest below `depth` percent of the haystack.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_NEEDLE = " The secret code for the vault is 4827. "
DEFAULT_QUESTION = "\n\nQuestion: What is the secret code for the vault?\nAnswer: The secret code for the vault is"
DEFAULT_ANSWER = "4827"
ANSWER_TOKENS = 8  # the default question ends where the answer starts
RESTATED_ANSWER_TOKENS = 32  # a plain question: room for the model to restate it first


@dataclass
class Needle:
    text: str
    question: str
    answer: str
    max_tokens: int = ANSWER_TOKENS

    @classmethod
    def from_user(cls, text: str, question: str, answer: str) -> "Needle":
        """A needle as a user writes it: the sentence is set off by spaces, and a plain
        question ("What is ...?") is framed as "Question: ...\nAnswer:" for base models."""
        if "answer:" not in question.lower():
            question = f"\n\nQuestion: {question.strip()}\nAnswer:"
        return cls(f" {text.strip()} ", question, answer.strip(), RESTATED_ANSWER_TOKENS)

    def passed(self, answer: str) -> bool:
        """Exact match of the key fact, ignoring case."""
        return self.answer.lower() in answer.lower()


DEFAULT_NEEDLES = [Needle(DEFAULT_NEEDLE, DEFAULT_QUESTION, DEFAULT_ANSWER)]


def generated_haystack(n_words: int = 60000, seed: int = 0) -> str:
    """A deterministic filler text of plain sentences, for a fresh install with no file."""
    rng = random.Random(seed)
    subjects = ["The river", "A farmer", "The old library", "Every winter", "The committee", "A young engineer",
                "The market", "Our neighbour", "The museum", "A small boat", "The valley", "The teacher"]
    verbs = ["described", "remembered", "carried", "measured", "painted", "repaired", "visited", "studied",
             "ignored", "collected", "followed", "explained"]
    objects = ["the northern road", "a box of letters", "the evening light", "three wooden chairs",
               "the price of bread", "a map of the coast", "the broken clock", "an unfinished song",
               "the flooded field", "a list of names", "the quiet harbour", "the first snow"]
    tails = ["before noon", "without a word", "for many years", "after the storm", "with great care",
             "in the spring", "once again", "as usual", "near the bridge", "at dawn"]
    words, out = 0, []
    while words < n_words:
        s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}."
        out.append(s)
        words += len(s.split())
        if rng.random() < 0.12:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def _sentence_boundary(tokens: list[int], pos: int, ends: set[int], reach: int = 96) -> int:
    """The position just after the nearest sentence-ending token at or below pos."""
    for p in range(pos, max(pos - reach, 0), -1):
        if tokens[p - 1] in ends:
            return p
    return pos


def build_prompt(model, hay_tokens: list[int], needle: Needle, length: int, depth: float,
                 ends: set[int]) -> list[int]:
    """Token ids of one cell's prompt, exactly `length` tokens (or fewer if the haystack is short)."""
    nt = model.tokenize(needle.text, add_bos=False)
    qt = model.tokenize(needle.question, add_bos=False)
    n = length - len(nt) - len(qt) - 1
    if n <= 0:
        from ..errors import TightKVError

        raise TightKVError(f"length {length} is too short for the needle and question")
    if len(hay_tokens) < n:
        from ..errors import TightKVError

        raise TightKVError(f"haystack has {len(hay_tokens)} tokens, fewer than the {n} that length {length} needs")
    ctx = hay_tokens[:n]
    pos = _sentence_boundary(ctx, int(n * depth / 100), ends) if 0 < depth < 100 else int(n * depth / 100)
    return [model.tokenizer.bos_id] + ctx[:pos] + nt + ctx[pos:] + qt


def run_grid(model, haystack: str, lengths: list[int], depths: list[float], kv_types: list[str],
             needles: list[Needle] | None = None, progress: bool = True) -> dict[str, dict]:
    """{kv: {"cells": [{length, depth, needle, passed, answer}]}} over the grid."""
    from tqdm import tqdm

    needles = needles or DEFAULT_NEEDLES
    hay_tokens = model.tokenize(haystack, add_bos=False)
    ends = {t for t in set(hay_tokens) if model.detokenize([t]).rstrip().endswith((".", "!", "?"))}
    cells = [(kv, L, d, i) for kv in kv_types for L in lengths for d in depths for i in range(len(needles))]
    results = {kv: {"cells": []} for kv in kv_types}
    for kv, length, depth, i in tqdm(cells, desc="niah", unit="cell", disable=not progress):
        needle = needles[i]
        prompt = build_prompt(model, hay_tokens, needle, length, depth, ends)
        out = model.generate(prompt, max_tokens=needle.max_tokens, temperature=0.0, cache=model.new_cache(kv))
        results[kv]["cells"].append({"length": length, "depth": depth, "needle": i,
                                     "passed": needle.passed(out.text), "answer": out.text.strip()})
    return results


def format_grid(results: dict[str, dict], lengths: list[int], depths: list[float]) -> str:
    """Pass/fail grid per KV type: rows are lengths, columns depths; fails show the answer."""
    lines = []
    for kv, r in results.items():
        lines.append(f"kv {kv}: {sum(c['passed'] for c in r['cells'])}/{len(r['cells'])} passed")
        lines.append("length  " + "".join(f"{d:>8g}%" for d in depths))
        for L in lengths:
            row = []
            for d in depths:
                cs = [c for c in r["cells"] if c["length"] == L and c["depth"] == d]
                row.append(f"{sum(c['passed'] for c in cs)}/{len(cs)}".rjust(9))
            lines.append(f"{L:<8}" + "".join(row))
        for c in r["cells"]:
            if not c["passed"]:
                lines.append(f"  fail {c['length']}@{c['depth']:g}% needle {c['needle']}: {c['answer']!r}")
    return "\n".join(lines)


def heatmap(results: dict[str, dict], lengths: list[int], depths: list[float], path: str) -> None:
    """A length-by-depth pass-rate heatmap, one panel per KV type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(results)
    fig, axes = plt.subplots(1, len(kinds), figsize=(1.2 + 1.0 * len(depths) * len(kinds), 1.2 + 0.6 * len(lengths)),
                             squeeze=False)
    for ax, kv in zip(axes[0], kinds):
        grid = np.zeros((len(lengths), len(depths)))
        for i, L in enumerate(lengths):
            for j, d in enumerate(depths):
                cs = [c["passed"] for c in results[kv]["cells"] if c["length"] == L and c["depth"] == d]
                grid[i, j] = np.mean(cs) if cs else np.nan
        ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(depths)), [f"{d:g}%" for d in depths])
        ax.set_yticks(range(len(lengths)), [str(L) for L in lengths])
        ax.set_xlabel("needle depth")
        ax.set_ylabel("context length (tokens)")
        ax.set_title(f"kv {kv}")
        for i in range(len(lengths)):
            for j in range(len(depths)):
                ax.text(j, i, f"{grid[i, j]:.0%}", ha="center", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
