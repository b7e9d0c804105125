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
    subjects = [
        "The river",
        "A farmer",
        "The old library",
        "Every winter",
        "The committee",
        "A young engineer",
        "The market",
        "Our neighbour",
        "The museum",
        "A small boat",
        "The valley",
        "The teacher",
    ]
    verbs = [
        "described",
        "remembered",
        "carried",
        "measured",
        "painted",
        "repaired",
        "visited",
        "studied",
        "ignored",
        "collected",
        "followed",
        "explained",
    ]
    objects = [
        "the northern road",
        "a box of letters",
        "the evening light",
        "three wooden chairs",
        "the price of bread",
        "a map of the coast",
        "the broken clock",
        "an unfinished song",
        "the flooded field",
        "a list of names",
        "the quiet harbour",
        "the first snow",
    ]
    tails = [
        "before noon",
        "without a word",
        "for many years",
        "after the storm",
        "with great care",
        "in the spring",
        "once again",
        "as usual",
        "near the bridge",
        "at dawn",
    ]
    words, out = 0, []
    while words < n_words:
        s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}."
        out.append(s)
        words += len(s.split())
        if rng.random() < 0.12:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def sentence_boundary(tokens: list[int], pos: int, ends: set[int], reach: int = 96) -> int:
    """The position just after the nearest sentence-ending token at or below pos."""
    for p in range(pos, max(pos - reach, 0), -1):
        if tokens[p - 1] in ends:
            return p
    return pos


def build_prompt(tokens, hay_tokens: list[int], needle: Needle, length: int, depth: float, ends: set[int]) -> list[int]:
    """Token ids of one cell's prompt, exactly `length` tokens (or fewer if the haystack is
    short), built with `tokens` (`eval.endpoint.Tokens`)."""
    from ..errors import TightKVError

    nt, qt = tokens.tokenize(needle.text), tokens.tokenize(needle.question)
    n = length - len(nt) - len(qt) - len(tokens.bos)
    if n <= 0:
        raise TightKVError(f"length {length} is too short for the needle and question")
    if len(hay_tokens) < n:
        raise TightKVError(f"haystack has {len(hay_tokens)} tokens, fewer than the {n} that length {length} needs")
    ctx = hay_tokens[:n]
    pos = sentence_boundary(ctx, int(n * depth / 100), ends) if 0 < depth < 100 else int(n * depth / 100)
    return tokens.bos + ctx[:pos] + nt + ctx[pos:] + qt


def run_grid(
    tokens,
    haystack: str,
    lengths: list[int],
    depths: list[float],
    targets: list,
    needles: list[Needle] | None = None,
    progress: bool = True,
) -> dict[str, dict]:
    """{target label: {"cells": [{length, depth, needle, passed, answer}]}} over the grid, for
    each target (`eval.endpoint`: a local KV type or an endpoint), the prompts built with
    `tokens`. Progress (stderr) counts prompt tokens, so it moves within a local prefill."""
    from ..progress import Progress

    needles = needles or DEFAULT_NEEDLES
    hay_tokens = tokens.tokenize(haystack)
    ends = {t for t in set(hay_tokens) if tokens.piece(t).rstrip().endswith((".", "!", "?"))}
    cells = [(t, L, d, i) for t in targets for L in lengths for d in depths for i in range(len(needles))]
    results = {t.label: {"cells": []} for t in targets}
    prompts = [build_prompt(tokens, hay_tokens, needles[i], length, depth, ends) for _, length, depth, i in cells]
    with Progress("niah", sum(map(len, prompts)), enabled=progress) as bar:
        for c, ((target, length, depth, i), prompt) in enumerate(zip(cells, prompts)):
            needle, base = needles[i], bar.n
            bar.describe(f"niah cell {c + 1}/{len(cells)} ({target.label}, {length} tok at {depth:g}%)")
            text = target.answer(prompt, needle.max_tokens, progress=lambda done, _total: bar.advance_to(base + done))
            results[target.label]["cells"].append(
                {"length": length, "depth": depth, "needle": i, "passed": needle.passed(text), "answer": text.strip()}
            )
            bar.advance_to(base + len(prompt))
            bar.note(f"{sum(x['passed'] for r in results.values() for x in r['cells'])}/{c + 1} passed")
        bar.detail = f"{len(cells)} cell{'s' * (len(cells) > 1)}"
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


def _pass_grid(cells: list[dict], lengths: list[int], depths: list[float]):
    """(rates, labels): the pass rate of each length x depth cell, and its text
    ("100%" for one needle, "2/3" for several; "-" where nothing ran)."""
    import numpy as np

    rates, labels = np.full((len(lengths), len(depths)), np.nan), []
    for i, L in enumerate(lengths):
        row = []
        for j, d in enumerate(depths):
            cs = [c["passed"] for c in cells if c["length"] == L and c["depth"] == d]
            if cs:
                rates[i, j] = sum(cs) / len(cs)
            row.append("-" if not cs else f"{rates[i, j]:.0%}" if len(cs) == 1 else f"{sum(cs)}/{len(cs)}")
        labels.append(row)
    return rates, labels


def figure_title(model: str | None, needles: list[Needle] | None) -> str:
    """'Needle in a haystack: MODEL' over a line that quotes the needle (or counts them)."""
    head = "Needle in a haystack" + (f": {model}" if model else "")
    if not needles:
        return head
    text = needles[0].text.strip()
    text = text if len(text) <= 70 else text[:67] + "..."
    which = "needle" if len(needles) == 1 else f"{len(needles)} needles, the first"
    return f"{head}\n{which}: \u201c{text}\u201d"


def heatmap(
    results: dict[str, dict],
    lengths: list[int],
    depths: list[float],
    path: str,
    model: str | None = None,
    needles: list[Needle] | None = None,
) -> None:
    """Write a PNG: one length-by-depth pass-rate panel per KV type, a shared
    colour bar, and the model and needle in the title; sized for the grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results)
    rows = -(-len(kinds) // 4)
    cols = -(-len(kinds) // rows)
    cell_w, cell_h = 0.62, 0.42
    panel_w, panel_h = max(1.6, cell_w * len(depths)), max(0.9, cell_h * len(lengths))
    fig, axes = plt.subplots(
        rows,
        cols,
        squeeze=False,
        sharey=True,
        layout="constrained",
        figsize=(1.6 + 0.9 + cols * (panel_w + 0.25), 1.2 + rows * (panel_h + 0.75)),
    )
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="0.85")
    for ax, kv in zip(axes.flat, kinds):
        image = _panel(ax, kv, *_pass_grid(results[kv]["cells"], lengths, depths), lengths, depths, cmap)
    for ax in list(axes.flat)[len(kinds) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("context length (tokens)")
    for k in range(len(kinds) - cols, len(kinds)):  # the lowest panel of each column
        axes.flat[k].set_xlabel("needle depth")
    bar = fig.colorbar(
        image,
        ax=axes,
        shrink=min(1.0, 2.2 / (rows * panel_h)) if rows * panel_h > 2.2 else 1.0,
        format=matplotlib.ticker.PercentFormatter(1.0),
        aspect=15,
    )
    bar.set_label("needle found")
    fig.suptitle(figure_title(model, needles), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, kv: str, rates, labels: list[list[str]], lengths: list[int], depths: list[float], cmap):
    """One KV type's heatmap on `ax`, each cell labelled; returns the image (for the colour bar)."""
    image = ax.imshow(rates, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(depths)), [f"{d:g}%" for d in depths])
    ax.set_yticks(range(len(lengths)), [f"{L:,}" for L in lengths])
    ax.set_xticks([j - 0.5 for j in range(1, len(depths))], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, len(lengths))], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="both", length=0)
    ax.set_title(f"kv {kv}", fontsize=9)
    for i, row in enumerate(labels):
        for j, text in enumerate(row):
            dark = rates[i, j] == rates[i, j] and (rates[i, j] > 0.85 or rates[i, j] < 0.15)
            ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
    return image
