"""Per-token cost of a JSON-schema constraint, llguidance beside xgrammar, on a real vocabulary.

    python bench/grammar_overhead.py [MODEL] [--json docs/bench/grammar_overhead.json]

A fixed JSON reply is replayed token by token through each engine: the time to compute
the allowed-token bitmask and to accept the token, per token, against one decode step of
the model (greedy, another prompt). tightkv uses llguidance (`engine/grammar.py`): greedy,
it checks the best token's bit; sampled, it masks the whole vocabulary (the second row).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}
REPLY = '{"name": "Ada Lovelace, a mathematician of note", "age": 36, "tags": ["math", "engines", "poetry"]}'


def time_llguidance(model, ids: list[int], sampled: bool = False) -> list[float]:
    """Greedy: tightkv checks the best token's bit; sampled: the whole vocabulary is masked."""
    import torch

    from tightkv.engine.grammar import Constraint, json_schema_grammar

    c = Constraint(json_schema_grammar(SCHEMA), model.tokenizer)
    logits = torch.zeros(model.tokenizer.vocab_size)
    out = []
    for t in ids:
        t0 = time.perf_counter()
        c.mask(logits) if sampled else c.allows(t)
        c.accept(t)
        out.append(time.perf_counter() - t0)
    return out


def time_llguidance_sampled(model, ids: list[int]) -> list[float]:
    return time_llguidance(model, ids, sampled=True)


def time_xgrammar(model, ids: list[int]) -> list[float]:
    import xgrammar as xgr

    tok = model.tokenizer
    vocab = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    info = xgr.TokenizerInfo(
        vocab, vocab_type=xgr.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=sorted(tok.eot_ids)
    )
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    m = xgr.GrammarMatcher(compiled)
    bits = xgr.allocate_token_bitmask(1, tok.vocab_size)
    out = []
    for t in ids:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bits)
        assert m.accept_token(t), f"xgrammar refused token {t}"
        out.append(time.perf_counter() - t0)
    return out


def decode_seconds(model, n: int = 32) -> float:
    r = model.generate("Describe a person:", max_tokens=n)
    return r.stats.generation_seconds / max(1, r.stats.generated_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    import torch

    from tightkv import Model

    torch.set_num_threads(2)
    model = Model(ns.model)
    ids = model.tokenize(REPLY, add_bos=False)
    step = decode_seconds(model)
    rows = {}
    engines = (
        ("llguidance", time_llguidance),
        ("llguidance, sampled", time_llguidance_sampled),
        ("xgrammar", time_xgrammar),
    )
    for name, fn in engines:
        fn(model, ids)  # warm: compile caches, first-use costs
        times = [statistics.median(x) for x in zip(*(fn(model, ids) for _ in range(3)))]
        rows[name] = {
            "mean_us": 1e6 * float(np.mean(times)),
            "p90_us": 1e6 * float(np.percentile(times, 90)),
            "max_us": 1e6 * max(times),
            "of_decode_step": float(np.mean(times)) / step,
        }
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
        platform.processor(),
    )
    print(f"{cpu}; vocabulary {model.tokenizer.vocab_size}; {len(ids)} tokens; decode step {1e3 * step:.1f} ms")
    print(f"{'engine':<20}{'mean us':>10}{'p90 us':>10}{'max us':>10}{'of a step':>11}")
    for name, r in rows.items():
        print(
            f"{name:<20}{r['mean_us']:>10.0f}{r['p90_us']:>10.0f}{r['max_us']:>10.0f}{100 * r['of_decode_step']:>10.1f}%"
        )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "cpu": cpu,
                    "vocab": model.tokenizer.vocab_size,
                    "tokens": len(ids),
                    "decode_step_ms": 1e3 * step,
                    "engines": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
