"""What sampling a token costs, beside greedy decoding, per sampling setting.

    python bench/sampling_cost.py                          # Gemma 3 270M (vocabulary 262,144)
    python bench/sampling_cost.py MODEL.gguf --tokens 64 --rounds 3 --json docs/bench/sampling_cost.json

For each setting (OpenAI's defaults: temperature 1, nothing cut; Ollama's: temperature 0.8,
top-k 40, top-p 0.9; top-p or min-p alone; OpenAI's penalties and logit bias over a
window of 64 tokens), on the model's own logits after a prompt:
the sampler's time per token (torch on one thread, as in a decode step) beside a plain
full sort and `torch.multinomial` over the whole vocabulary, and decode tokens/s through
`Model.generate` beside greedy (the settings taking turns round by round; medians).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import tightkv  # noqa: F401  (before torch: its OpenMP defaults, `tightkv._openmp_defaults`, as users get them)
import torch

from tightkv import Model
from tightkv.engine.sampling import Sampler, SamplingParams
from tightkv.errors import TightKVError
from tightkv.eval.bench import machine, write_json

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "openai default (T 1)": {"temperature": 1.0},
    "ollama default (T 0.8, k 40, p 0.9)": {"temperature": 0.8, "top_k": 40, "top_p": 0.9},
    "T 0.8, top-p 0.9": {"temperature": 0.8, "top_p": 0.9},
    "T 0.8, min-p 0.05": {"temperature": 0.8, "min_p": 0.05},
    "T 1, frequency 0.5, presence 0.5, 2 biases": {
        "temperature": 1.0,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "logit_bias": {0: -100.0, 1: -100.0},
    },
}
PROMPT = "The history of the Roman Empire"


def per_call_ms(fn, reps: int = 50) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def full_sort_draw(logits: torch.Tensor, generator: torch.Generator) -> int:
    """The plain way: every logit sorted, then a multinomial draw over all of them."""
    values, ids = torch.sort(logits, descending=True)
    return int(ids[torch.multinomial(torch.softmax(values, 0), 1, generator=generator)])


def sampler_costs(model: Model) -> list[dict]:
    ids = model.tokenize(PROMPT)
    logits = torch.from_numpy(model.logits(ids)[-1]).float()  # (vocab,)
    history = (ids * 64)[:64]  # a full penalty window, with repeats
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        plain = per_call_ms(lambda: full_sort_draw(logits, g))
        return [
            {
                "setting": name,
                "sampler_ms": round(per_call_ms(lambda s=Sampler(SamplingParams(seed=0, **kw)): s(logits, history)), 3),
                "full_sort_ms": round(plain, 3),
            }
            for name, kw in SETTINGS.items()
            if kw["temperature"] > 0
        ]
    finally:
        torch.set_num_threads(threads)


def decode_speeds(model: Model, tokens: int, rounds: int) -> dict[str, float]:
    speeds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for r in range(rounds):
        for name, kw in SETTINGS.items():
            stats = model.generate(PROMPT, max_tokens=tokens, seed=r, **kw).stats
            speeds[name].append(stats.generated_tokens / stats.generation_seconds)
            print(f"round {r + 1}: {name}: {speeds[name][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    return {name: round(statistics.median(v), 1) for name, v in speeds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="gemma3:270m")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per decode run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="FILE")
    ns = ap.parse_args()
    with Model(ns.model, threads=ns.threads, context_length=4096) as model:
        costs = sampler_costs(model)
        speeds = decode_speeds(model, ns.tokens, ns.rounds)
        vocab = model.args.vocab_size
    mach = machine()
    print(
        f"{ns.model} (vocabulary {vocab}), {ns.threads} threads, decode medians of {ns.rounds}; "
        f"{mach['cpu']}, kernels {mach['kernels']}"
    )
    print(
        "| setting | sampler ms/token | full sort + multinomial ms | decode tok/s | vs greedy |\n|---|---:|---:|---:|---:|"
    )
    cost = {c["setting"]: c for c in costs}
    for name, tps in speeds.items():
        c = cost.get(name)
        ms = f"{c['sampler_ms']:.2f} | {c['full_sort_ms']:.2f}" if c else "argmax | -"
        print(f"| {name} | {ms} | {tps:.1f} | {tps / speeds['greedy']:.2f}x |")
    if ns.json:
        write_json(
            ns.json,
            "bench/sampling_cost.py",
            model=ns.model,
            vocab=vocab,
            tokens=ns.tokens,
            rounds=ns.rounds,
            threads=ns.threads,
            sampler=costs,
            decode_tok_s=speeds,
        )


if __name__ == "__main__":
    try:
        main()
    except TightKVError as err:  # a bad model name: one line, exit 1
        sys.exit(f"error: {err}")
