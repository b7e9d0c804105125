"""Speculation replayed: how many decode steps' worth of forwards a reply costs with lookup drafts,
from the plain greedy reply and a verification's cost in steps, without timing anything.

    python bench/spec_replay.py [--models gemma,qwen] [--tasks qa,edit,open] [--json F]

Each task of `bench/speculative.py` runs once greedily without speculation; the reply is then
replayed through `NgramDrafter` and `Speculator` (the drafts, the draft length that pays, the
pauses) as `Speculator.run` would meet it: a draft is taken up to its first token the reply
does not have, and each forward is charged what `bench/verify_cost.py` measured a verification
of that many rows to cost, in decode steps (`--costs`, interpolated; the Speculator is told
those costs as if it had timed them). Greedy speculation changes no token, so the plain reply is
every verification's outcome. The ratio printed, tokens over steps, is the speedup a machine
that kept those costs would see; it says which drafting choices pay before a timed run
(`bench/speculative.py`) measures one. The last column cuts each of the same drafts to what the
reply takes of it: the most that any rule for the draft length could give with these drafts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tightkv  # noqa: F401  (before torch, as users get it)

sys.path.insert(0, str(Path(__file__).parent))
from speculative import model_paths, prompt_ids, tasks

# a verification of k rows, in decode steps (bench/verify_cost.py, Zen 5, depth 3,799, f26bbf9: docs/speed.md)
COSTS = {"gemma": {1: 1.0, 2: 1.38, 4: 1.55, 8: 2.44, 16: 4.11}, "qwen": {1: 1.0, 2: 1.44, 4: 1.93, 8: 3.09, 16: 5.43}}


def cost(table: dict[int, float], rows: int) -> float:
    """Steps a forward of `rows` rows costs, linear between the measured row counts."""
    ks = sorted(table)
    lo = max(k for k in ks if k <= rows)
    hi = min((k for k in ks if k >= rows), default=lo)
    if hi == lo:
        return table[lo] + (rows - lo) * (table[lo] - table[ks[-2]]) / (lo - ks[-2]) if rows > lo else table[lo]
    return table[lo] + (rows - lo) * (table[hi] - table[lo]) / (hi - lo)


class Replay:
    """A sequence as `Speculator.draft` reads it: its history (prompt and reply so far, the
    pending token last), its reply ids and its token budget; no cache bounds the drafts."""

    cache: list = []

    def __init__(self, prompt: list[int], max_tokens: int):
        self.history, self.ids, self.max_tokens = list(prompt), [], max_tokens


def replay(speculator, prompt: list[int], reply: list[int], table: dict[int, float]) -> dict:
    """Steps spent on `reply` (its first token from the prompt's forward) and the drafts."""
    seq = Replay(prompt, len(reply))
    seq.history.append(reply[0])
    seq.ids.append(reply[0])
    steps = 0.0
    while len(seq.ids) < len(reply):
        draft = speculator.draft(seq)
        rows = 1 + len(draft)
        spent = cost(table, rows)
        steps += spent
        speculator.timed(rows, spent * 0.01)  # as if timed, a step being 10 ms
        done = len(seq.ids)
        taken = 0
        while taken < len(draft) and done + taken < len(reply) and draft[taken] == reply[done + taken]:
            taken += 1
        if draft:
            speculator.taken(len(draft), taken)
        new = reply[done : done + taken + 1]
        seq.ids += new
        seq.history += new
    return {
        "tokens": len(reply) - 1,
        "steps": round(steps, 2),
        "drafted": speculator.drafted,
        "accepted": speculator.accepted,
    }


def oracle(drafter, prompt: list[int], reply: list[int], table: dict[int, float], most: int) -> float:
    """Steps the same reply costs with each draft cut to what the reply takes of it (no
    draft where it takes none): the best any draft-length rule could do with these drafts."""
    history, done, steps = list(prompt) + [reply[0]], 1, 0.0
    while done < len(reply):
        draft = drafter.propose(history, most)
        taken = 0
        while taken < len(draft) and done + taken < len(reply) and draft[taken] == reply[done + taken]:
            taken += 1
        steps += cost(table, 1 + taken)
        new = reply[done : done + taken + 1]
        done += len(new)
        history += new
    return round(steps, 2)


def main() -> int:
    from tightkv import Model
    from tightkv.engine import speculative

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma,qwen")
    ap.add_argument("--tasks", default="qa,edit,open")
    ap.add_argument("--n-gen", type=int, default=160)
    ap.add_argument("--doc-tokens", type=int, default=3800)
    ap.add_argument("--replies", type=Path, help="keep the plain replies here, and reuse them when it exists")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    kept = json.loads(args.replies.read_text()) if args.replies and args.replies.exists() else {}
    doc = {"costs": COSTS, "models": {}}
    print(
        "| model | task | tokens | steps | speedup | accepted / drafted | drafts cut to what is taken |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        model = Model(str(model_paths(name)[0]), threads=2, context_length=8192)
        tok = model.tokenizer
        rows = doc["models"][name] = {}
        for task, (text, instruction, base) in tasks(lambda t: tok.encode(t, add_bos=False), args.doc_tokens).items():
            if task not in args.tasks.split(","):
                continue
            ids = prompt_ids(model, text, instruction, base)
            key = f"{name}/{task}/{args.n_gen}"
            if key not in kept:
                kept[key] = list(
                    model.generate(ids, max_tokens=args.n_gen, temperature=0.0, spec_type="none").stats.ids
                )
            reply = kept[key]
            spec = speculative.Speculator(speculative.NgramDrafter(tok.token_piece))
            r = rows[task] = replay(spec, ids, reply, COSTS[name])
            r["oracle_steps"] = oracle(
                speculative.NgramDrafter(tok.token_piece), ids, reply, COSTS[name], spec.draft_max
            )
            print(
                f"| {name} | {task} | {r['tokens']} | {r['steps']} | {r['tokens'] / r['steps']:.2f}x | "
                f"{r['accepted']}/{r['drafted']} | {r['tokens'] / r['oracle_steps']:.2f}x |",
                flush=True,
            )
    if args.replies:
        args.replies.write_text(json.dumps(kept))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
