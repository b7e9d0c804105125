"""What the benchmark page measures: the KV types, grids and texts of each section,
shared by `make_benchmarks.py` (which runs them) and `render_benchmarks.py` (which
writes docs/benchmarks.md from their JSON)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
PPL_BASE = ["q8_0", "q4_0", "tq4", "tq3", "kvarn4", "kivi4", "progressive", "k8v4", "aggressive"]
OFF = ",sink=0,window=0"  # the same type with its exact sink and recent window turned off
PPL_TYPES = ",".join(["f16", *PPL_BASE, *(t + OFF for t in PPL_BASE if t != "progressive")])
# types last measured on the torch reference path (docs/bench/ppl_reference.json), against which
# the fused kernel's rows are checked
PPL_REFERENCE = ["q4_0", "tq3", "kvarn4", "kivi4", "aggressive"]
POLICY_GRID = [
    ("tq4", 16, 128, [0, 4, 16, 64], [0, 32, 64, 128, 256]),
    ("tq3", 16, 256, [16], [0, 64, 128, 256, 512]),
    ("kvarn4", 16, 128, [0, 4, 16], [0, 64, 128, 256]),
    ("q4_0", 4, 128, [0, 4], [0, 128]),
    ("aggressive", 4, 256, [4], [128, 256, 512]),
]
POLICY_CHUNKS = 2
TEXTS = ["essays-late", "shared-docs", "python-code", "korean"]
# model -> (types, chunks, texts) of ppl-texts: the default's candidates on the texts the default was
# not chosen on (the essays' late part is in docs/bench/ppl.json's neighbour run); scoring Gemma's
# 262K-token vocabulary costs about 1.5 minutes per type and chunk on 2 cores, hence 2 chunks
TEXTS_RUNS = {
    "gemma3-270m": ("f16,progressive,kvarn4,kvarn4:tq4", 2, TEXTS[1:]),
    "qwen2.5-coder-0.5b": ("f16,progressive,kvarn4,kvarn4:tq4", 2, TEXTS[1:2]),
}
LATE_ESSAYS = 300_000  # first character of the later essays
DOC_FILES = ["PRODUCT", "REFERENCES", "KV_ALGORITHMS", "CONVENTIONS", "STYLE", "ARCHITECTURE", "MODELS"]
NIAH_TYPES = "f16,q8_0,progressive,kvarn4,aggressive"
NIAH_RERUN_TYPES = "f16,kvarn4"  # niah-rerun: these types again, merged into niah.json
USER_NEEDLES = [
    (
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
        "What is the best thing to do in San Francisco?",
        "Dolores Park",
    ),
    (
        "The special magic number mentioned in the report is 91736.",
        "What is the special magic number mentioned in the report?",
        "91736",
    ),
]
USER_NEEDLE_TYPES = "f16,progressive"
# the types of the kernel issue's goals: every fused kind on Gemma, the default and KVarN on Qwen
SPEED_TYPES = "f16,q8_0,k8v4,progressive,kvarn4,tq3,aggressive"
SPEED_QWEN_TYPES = "f16,q8_0,progressive,kvarn4"
# every compressed type and preset (the kernel issue's prefill bar: at most 1.3x f16's time at 8K)
PREFILL_TYPES = "f16,q8_0,q4_0,tq4,tq3,tq2,kvarn4,kvarn3,kvarn2,kivi4,kivi3,kivi2,k8v4,progressive,aggressive"
DOCQA_TYPES = "f16,progressive"
DOCQA_ARGS = [
    "--modes",
    "full,full-plain,rag,rlv,rlv-plain",
    "--measure-wm",
    "--wm-lengths",
    "1024,2048,4096,8192,16384",
]  # add "--quick" for an 8K full prefix
SECTIONS = [
    "machine",
    "memory",
    "ppl",
    "ppl-texts",
    "kv-policy",
    "niah",
    "niah-needles",
    "speed",
    "speed-qwen",
    "synthetic",
    "decode-memory",
    "prefill-cost",
    "docqa",
]


def policy_specs() -> list[tuple[str, int, int, str]]:
    """(type, sink, window, spec) for every point of POLICY_GRID, defaults included once."""
    points = []
    for kind, sink, window, sinks, windows in POLICY_GRID:
        pairs = [(s, window) for s in sinks] + [(sink, w) for w in windows]
        for s, w in dict.fromkeys(pairs):
            points.append((kind, s, w, f"{kind},sink={s},window={w}"))
    return points


def policy_types() -> str:
    return ",".join(["f16"] + [spec for *_, spec in policy_specs()])
