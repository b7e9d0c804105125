"""RULER-style synthetic tasks: retrieval and tracking in a long context, scored by
exact containment (no LLM judge).

Written after reading NVIDIA's RULER generators (Apache-2.0); the wording, word
lists and length fitting are ours. Every task is a prompt of `length` tokens
(`cwe`: at most that) ending in a question whose answer starts after "Answer:",
so a base or an instruct model answers on that line:

- single: one "special magic number" for a key, hidden in the haystack.
- multikey: the asked key among three distractor keys, each with its own number.
- multivalue: one key with four numbers; the answer must hold all four.
- multiquery: four keys asked at once; the answer must hold every number.
- vt: variable tracking, a chain `VAR A = 12345`, `VAR B = VAR A`, ... (five
  variables) hidden in the haystack; the answer is every variable holding the value.
- cwe: common-word extraction, a numbered list of words where ten appear far more
  often than the rest (30 times against 3; 6 against 1 below 4,096 tokens); the
  answer is those ten.

Needles go at sentence boundaries near depths drawn from 40 evenly spaced ones,
so the depth grid of `niah` does not apply. Sample i of a task at a length is one
fixed prompt for a seed and a tokenizer. A sample's score is the fraction of the
required items its answer contains (ignoring case), as RULER's string_match_all;
a cell (task, length, target) reports the mean score with a 95% Wilson interval
(the sum of the scores taken as successes) and the rate of all-correct answers.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from .niah import sentence_boundary

TASKS = ("single", "multikey", "multivalue", "multiquery", "vt", "cwe")
ANSWER_TOKENS = {"single": 16, "multikey": 16, "multivalue": 64, "multiquery": 64, "vt": 40, "cwe": 80}
STOP = ["\n\n", "\nQuestion:"]  # an answer ends at a blank line or a question of its own
DEPTHS = [round(100 * i / 39) for i in range(40)]
NEEDLES = {
    "single": (1, 1, 1),
    "multikey": (4, 1, 1),
    "multivalue": (1, 4, 1),
    "multiquery": (4, 1, 4),
}  # keys, values, asked
HOPS = 4  # vt: assignments after the first, one chain
COMMON = 10  # cwe: words to find


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


ADJECTIVES = _words(
    """
amber ancient bitter bold brave brisk calm clever cosmic crimson curious dusty eager
elegant fancy fierce fragile frosty gentle gloomy golden graceful hollow humble icy jolly
keen lively lonely lucky mellow misty modest noble odd pale placid polite proud quiet rapid
rigid royal rusty sandy savage scarlet shiny silent silver sleepy slender smooth solemn
sturdy sunny swift tender tidy timid vast velvet vivid wicked witty wooden zealous
"""
)
NOUNS = _words(
    """
anchor apple badger bakery banjo barrel basket beetle bicycle blanket bottle bucket
butter button cabin camel candle canyon carpet castle cello cherry chimney cloud compass
copper cotton cradle crystal dolphin donkey dragon drum eagle engine falcon feather fiddle
forest fountain garden ginger glacier goblet guitar hammer harbour helmet hermit honey
island jacket jungle kettle kitten ladder lantern lemon lizard magnet mango marble meadow
mirror monkey mountain needle oyster paddle palace parrot pebble pepper pillow pirate
planet pocket potato puppet rabbit radish ribbon rocket saddle salmon scarf shovel
spider sponge squirrel statue temple thimble thunder tiger tomato tractor trumpet tunnel
turnip turtle umbrella valley violin wagon walnut whistle window wizard yacht zebra
"""
)


def _free_of_substrings(words: list[str]) -> list[str]:
    """The words that hold no other word of the list and are held by none, so that
    containment scores one word only."""
    return [w for w in words if not any(w != o and (w in o or o in w) for o in words)]


WORDS = _free_of_substrings([*ADJECTIVES, *NOUNS])
KEYS = [f"{a}-{n}" for a in WORDS if a in ADJECTIVES for n in WORDS if n in NOUNS]


@dataclass
class Sample:
    """One prompt: its token ids and the items its answer must contain."""

    id: str
    task: str
    length: int
    index: int
    ids: list[int] = field(repr=False)
    expected: list[str]
    max_tokens: int


def score(answer: str, expected: list[str]) -> float:
    """The fraction of the expected items the answer contains, ignoring case."""
    text = answer.lower()
    return sum(e.lower() in text for e in expected) / len(expected)


def parse_tasks(text: str) -> list[str]:
    """Task names from a comma-separated list ("all": every task), checked."""
    from ..errors import TightKVError

    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    names = list(TASKS) if names == ["all"] else names
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise TightKVError(f"unknown task '{','.join(unknown) or text}' (tasks: {', '.join(TASKS)} or all)")
    return list(dict.fromkeys(names))


class Generator:
    """The samples of every task, built from one tokenizer (`eval.endpoint.Tokens`)
    and one haystack text; each piece of text is tokenized once."""

    def __init__(self, tokens, haystack: str):
        self.tokens = tokens
        self.hay = tokens.tokenize(haystack)
        self.ends = {t for t in set(self.hay) if tokens.piece(t).rstrip().endswith((".", "!", "?"))}
        self._memo: dict[str, list[int]] = {}

    def tok(self, text: str) -> list[int]:
        if text not in self._memo:
            self._memo[text] = self.tokens.tokenize(text)
        return self._memo[text]

    def sample(self, task: str, length: int, index: int, seed: int = 0) -> Sample:
        """Sample `index` of `task` at `length` tokens: the same prompt for the same seed."""
        rng = random.Random(f"{seed}/{task}/{length}/{index}")
        if task == "cwe":
            ids, expected = self._cwe(rng, length)
        else:
            preamble, needles, question, expected = _vt(rng) if task == "vt" else _keyed(rng, task)
            ids = self._splice(rng, length, preamble, needles, question)
        return Sample(f"{task}-{length}-s{seed}-{index}", task, length, index, ids, expected, ANSWER_TOKENS[task])

    def _splice(self, rng: random.Random, length: int, preamble: str, needles: list[str], question: str) -> list[int]:
        """BOS + preamble + haystack with the needles in order at random depths + question,
        exactly `length` tokens."""
        from ..errors import TightKVError

        head, tail, parts = self.tokens.bos + self.tok(preamble), self.tok(question), [self.tok(n) for n in needles]
        n = length - len(head) - len(tail) - sum(map(len, parts))
        if n <= 0:
            raise TightKVError(f"length {length} is too short for the task's needles and question")
        if len(self.hay) < n:
            raise TightKVError(f"haystack has {len(self.hay)} tokens, fewer than the {n} that length {length} needs")
        ctx = self.hay[:n]
        at = sorted(
            sentence_boundary(ctx, n * d // 100, self.ends) if 0 < d < 100 else n * d // 100
            for d in rng.sample(DEPTHS, len(parts))
        )
        out, prev = list(head), 0
        for pos, part in zip(at, parts):
            out += ctx[prev:pos] + part
            prev = pos
        return out + ctx[prev:] + tail

    def _cwe(self, rng: random.Random, length: int) -> tuple[list[int], list[str]]:
        """A numbered list of words, as long as fits in `length` tokens: COMMON words
        `often` times each, the rest `rarely` times, shuffled."""
        from ..errors import TightKVError

        often, rarely = (30, 3) if length >= 4096 else (6, 1)
        preamble = (
            "Below is a numbered list of words. Some of the words appear more often than the others: "
            "remember which ones appear most often.\n\n"
        )
        question = (
            f"\n\nQuestion: What are the {COMMON} most common words in the list above?\n"
            f"Answer: The {COMMON} most common words in the list are:"
        )
        head, tail = self.tokens.bos + self.tok(preamble), self.tok(question)
        budget = length - len(head) - len(tail)
        for pool in (WORDS, KEYS):  # single words while they suffice, else adjective-noun pairs
            order = rng.sample(pool, len(pool))
            chosen = _fill(order, often, rarely, budget, self.tok)
            if chosen is None:
                raise TightKVError(f"length {length} is too short for the task cwe")
            if len(chosen) < len(order):
                break
        items = chosen[:COMMON] * often + chosen[COMMON:] * rarely
        rng.shuffle(items)
        body = [t for i, w in enumerate(items) for t in self.tok(f" {i + 1}.") + self.tok(f" {w}")]
        return head + body + tail, chosen[:COMMON]


def _fill(order: list[str], often: int, rarely: int, budget: int, tok) -> list[str] | None:
    """The first COMMON words of `order` (`often` items each) and as many more (`rarely`
    each) as fit in `budget` tokens; None if the common ones do not fit."""
    used, count, words = 0, 0, []
    for k, w in enumerate(order):
        times = often if k < COMMON else rarely
        cost = sum(len(tok(f" {count + j + 1}.")) for j in range(times)) + times * len(tok(f" {w}"))
        if used + cost > budget:
            return words if k >= COMMON else None
        used, count = used + cost, count + times
        words.append(w)
    return words


def _keyed(rng: random.Random, task: str) -> tuple[str, list[str], str, list[str]]:
    """(preamble, needles, question, expected) of the key-value tasks."""
    n_keys, n_values, n_asked = NEEDLES[task]
    keys = rng.sample(KEYS, n_keys)
    numbers = [str(v) for v in rng.sample(range(10**6, 10**7), n_keys * n_values)]
    values = {k: numbers[i * n_values : (i + 1) * n_values] for i, k in enumerate(keys)}
    needles = [f" One of the special magic numbers for {k} is: {v}." for k in keys for v in values[k]]
    rng.shuffle(needles)
    asked = rng.sample(keys, n_asked)
    expected = [v for k in asked for v in values[k]]
    which = asked[0] if n_asked == 1 else ", ".join(asked[:-1]) + " and " + asked[-1]
    if len(expected) == 1:
        preamble = (
            "A special magic number is hidden in the following text. Remember it: I will ask about it afterwards."
        )
        question = (
            f"\n\nQuestion: What is the special magic number for {which} mentioned in the text above?\n"
            f"Answer: The special magic number for {which} is"
        )
    else:
        preamble = "Some special magic numbers are hidden in the following text. Remember them: I will ask about them afterwards."
        question = (
            f"\n\nQuestion: What are all the special magic numbers for {which} mentioned in the text above?\n"
            f"Answer: The special magic numbers for {which} are"
        )
    return preamble + "\n\n", needles, question, expected


def _vt(rng: random.Random) -> tuple[str, list[str], str, list[str]]:
    """(preamble, needles, question, expected) of variable tracking: one chain, in order."""
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))
        names += [name] if name not in names else []
    value = str(rng.randint(10000, 99999))
    needles = [f" VAR {names[0]} = {value}."] + [f" VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]
    preamble = "Memorize and track the chain of variable assignments hidden in the following text.\n\n"
    question = (
        f"\n\nQuestion: Find all variables that are assigned the value {value} in the text above.\n"
        f"Answer: According to the chain of variable assignments in the text above, {len(names)} variables "
        f"are assigned the value {value}, they are:"
    )
    return preamble, needles, question, names


def summarize(scores: list[float]) -> dict:
    """{n, mean, lo, hi, all_correct}: the mean score with its 95% Wilson interval
    (the sum of the scores as successes) and the rate of answers with every item."""
    from .docqa import wilson

    n = len(scores)
    lo, hi = wilson(sum(scores), n)
    return {
        "n": n,
        "mean": sum(scores) / n if n else 0.0,
        "lo": lo,
        "hi": hi,
        "all_correct": sum(s == 1.0 for s in scores) / n if n else 0.0,
    }


def run_tasks(
    generator: Generator,
    tasks: list[str],
    lengths: list[int],
    samples: int,
    seed: int,
    targets: list,
    progress: bool = True,
) -> tuple[list[Sample], dict[str, dict]]:
    """(prompts, results): every sample of tasks x lengths, and for each task
    {target label: {"cells": {length: summarize(...)}, "samples": [{id, length, answer,
    score}]}}, each target (`eval.endpoint`: a local KV type or an endpoint) answering
    every prompt greedily. Progress (stderr) counts prompt tokens."""
    from ..progress import Progress

    prompts = [generator.sample(t, L, i, seed) for t in tasks for L in lengths for i in range(samples)]
    results = {t: {x.label: {"cells": {}, "samples": []} for x in targets} for t in tasks}
    runs = [(x, s) for x in targets for s in prompts]
    with Progress("ruler", len(targets) * sum(len(s.ids) for s in prompts), enabled=progress) as bar:
        found = 0.0
        for c, (target, s) in enumerate(runs):
            base = bar.n
            bar.describe(f"ruler {c + 1}/{len(runs)} ({target.label}, {s.task} at {s.length} tok)")
            text = target.answer(
                s.ids, s.max_tokens, stop=STOP, progress=lambda done, _total, base=base: bar.advance_to(base + done)
            )
            got = score(text, s.expected)
            results[s.task][target.label]["samples"].append(
                {"id": s.id, "length": s.length, "answer": text.strip(), "score": got}
            )
            bar.advance_to(base + len(s.ids))
            found += got
            bar.note(f"mean score {found / (c + 1):.0%}")
        bar.detail = f"{len(runs)} sample{'s' * (len(runs) > 1)}"
    for by_target in results.values():
        for r in by_target.values():
            for L in lengths:
                r["cells"][L] = summarize([x["score"] for x in r["samples"] if x["length"] == L])
    return prompts, results


def _cell(c: dict) -> str:
    return f"{c['mean']:.0%} [{c['lo']:.0%}-{c['hi']:.0%}] {c['all_correct']:.0%}"


def format_tables(results: dict[str, dict], lengths: list[int]) -> str:
    """A table per task: rows the targets, columns the lengths (and all lengths
    together when there are several); a cell is the mean score [95% interval] and
    the all-correct rate."""
    lines = []
    cols = [str(L) for L in lengths] + (["all lengths"] if len(lengths) > 1 else [])
    width = max(12, *(len(k) for r in results.values() for k in r)) + 2
    for task, by_target in results.items():
        lines += [f"task {task}: mean score [95% Wilson interval] all-correct rate", "type".ljust(width)]
        lines[-1] += "".join(c.rjust(22) for c in cols)
        for label, r in by_target.items():
            cells = [r["cells"][L] for L in lengths]
            if len(lengths) > 1:
                cells.append(summarize([x["score"] for x in r["samples"]]))
            lines.append(label.ljust(width) + "".join(_cell(c).rjust(22) for c in cells))
        lines.append("")
    return "\n".join(lines).rstrip()


def heatmap(results: dict[str, dict], lengths: list[int], path: str, model: str | None = None) -> None:
    """Write a PNG: one panel per task (rows the targets, columns the lengths, the mean
    score in each cell) and a shared colour bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(results)
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    labels = list(next(iter(results.values())))
    panel_w, panel_h = max(2.0, 0.9 * len(lengths)), max(0.9, 0.42 * len(labels))
    fig, axes = plt.subplots(
        rows,
        cols,
        squeeze=False,
        layout="constrained",
        figsize=(1.4 + 0.9 + cols * (panel_w + 1.2), 1.0 + rows * (panel_h + 0.8)),
    )
    cmap = plt.get_cmap("RdYlGn")
    for ax, task in zip(axes.flat, tasks):
        means = np.array([[results[task][k]["cells"][L]["mean"] for L in lengths] for k in labels])
        image = ax.imshow(means, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [f"{L:,}" for L in lengths])
        ax.set_yticks(range(len(labels)), labels)
        ax.tick_params(length=0)
        ax.set_title(task, fontsize=9)
        for i in range(len(labels)):
            for j in range(len(lengths)):
                dark = means[i, j] > 0.85 or means[i, j] < 0.15
                ax.text(
                    j, i, f"{means[i, j]:.0%}", ha="center", va="center", fontsize=9, color="white" if dark else "black"
                )
    for ax in list(axes.flat)[len(tasks) :]:
        ax.set_visible(False)
    for k in range(max(0, len(tasks) - cols), len(tasks)):
        axes.flat[k].set_xlabel("context length (tokens)")
    bar = fig.colorbar(image, ax=axes, format=matplotlib.ticker.PercentFormatter(1.0), aspect=15)
    bar.set_label("mean score")
    n = next(iter(results[tasks[0]].values()))["cells"][lengths[0]]["n"]
    fig.suptitle("RULER-style tasks" + (f": {model}" if model else "") + f", {n} samples a cell", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
