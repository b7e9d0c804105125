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

# the figures of the other docs: section -> (the doc that cites them, its runs: a bench script and
# its arguments each, or "tightkv" and the CLI's). `make_benchmarks.py --only SECTION` runs them; a plain run runs SECTIONS only.
# In the arguments {out} is docs/bench, {root} the repository, {qwen} Qwen2.5-Coder-0.5B-Instruct's
# GGUF (bench/qwen_model.py), {brief} and {llama_server} what make_benchmarks.py's --brief and
# --llama-server name, and {json_STEM} docs/bench/STEM_<kernel path>.json (one file per instruction path).
LONG_ARGS = ["--depths", "32704", "--n-gen", "32", "-p", "512", "--pp-depths", "32256", "--ttft", "32768"]
LONG_ARGS += ["-c", "32768", "-r", "1", "--compare", "kvarn4,f16", "--threads", "2", "--vs-llamacpp"]
QMATMUL_TYPES = "Q4_0,Q8_0,Q5_0,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,IQ3_XXS,IQ3_S,IQ2_XXS,IQ2_XS,IQ2_S,IQ1_S,IQ1_M,TQ1_0"
EXTRA = {
    "weight-types": (
        "docs/weight-types.md",
        [
            ["weight_types.py", "--speed", "--threads", "1", "--reps", "3", "--ppl", "2"]
            + ["--json", "{json_weight_types}", "--md", "docs/weight-types.md"]
        ],
    ),
    "vs-llamacpp": ("docs/weight-types.md", [["vs_llamacpp.py", "--hf", "--json", "{out}/vs_llamacpp.json"]]),
    "weight-kernels": (
        "docs/speed.md",
        [
            ["bench_qmatmul.py", "--types", QMATMUL_TYPES, "--threads", "1"],
            ["bench_qmatmul.py", "--crossover", "{qwen}", "--rows", "1,8,16,24,32,48,64,96"],
        ],
    ),
    "attention-kernel": (
        "docs/speed.md",
        [
            ["bench_attention.py", "--depth", "8192", "--shape", "gemma,qwen", "--types", "f16,progressive,kvarn4"]
            + ["--int8", "on,off", "--threads", "1", "--cpu-time", "--json", "{json_attention_kernel_int8_d8192}"]
        ],
    ),
    "long-context": (  # #56's goals: a 512-token prompt at 32K, a 32K document, decode at 32K
        "docs/speed.md",
        [
            ["tightkv", "bench", *LONG_ARGS, "--json", "{json_speed_long}"],
            ["tightkv", "bench", "{qwen}", *LONG_ARGS, "--json", "{json_speed_long_qwen}"],
        ],
    ),
    "memory": (  # #56: where a 32K run's memory goes, phase by phase, beside llama.cpp's
        "docs/speed.md",
        [
            ["memory_breakdown.py", "gemma3:270m", "-n", "32752", "--kv", "kvarn4,f16", "--llama-kv", "q8_0,f16"]
            + ["--json", "{json_memory_breakdown}"]
        ],
    ),
    "step-overhead": ("docs/speed.md", [["step_overhead.py", "--model", "{qwen}", "--threads", "2"]]),
    "prompt-paths": (
        "docs/speed.md",
        [["prompt_paths.py", "gemma3:270m", "{qwen}", "--rounds", "3", "--json", "{json_prompt_paths}"]],
    ),
    "moe-hybrid": (
        "docs/speed.md",
        [
            ["synthetic_moe_hybrid.py", "--depths", "16,512,16384", "--n-gen", "16", "--bytes", "--memory", "16384"]
            + ["--json", "{json_synthetic_moe_hybrid}"],
            ["synthetic_moe_hybrid.py", "--models", "gptoss,gemma4", "--depths", "16,16384", "--n-gen", "32"]
            + ["--bytes", "--json", "{json_synthetic_moe_hybrid}", "--merge"],
        ],
    ),
    "speculative": (
        "docs/speed.md",
        [
            ["speculative.py", "--server", "{llama_server}", "--json", "{json_speculative}"],
            ["verify_cost.py", "--json", "{json_verify_cost}"],
            ["spec_replay.py", "--json", "{json_spec_replay}"],
        ],
    ),
    "ppl-long": (
        "docs/benchmarks.md",
        [
            ["ppl_long.py", "gemma3:270m", "--json", "{out}/ppl_long_gemma3-270m.json"],
            ["ppl_long.py", "qwen", "--json", "{out}/ppl_long_qwen2.5-coder-0.5b.json"],
        ],
    ),
    "llama-ppl": (  # llama.cpp's caches on the reference's protocol (the long sweep is ppl-long's)
        "docs/benchmarks.md",
        [["llama_ppl.py", "-c", "2048", "--chunks", "6", "--kinds", "f16,q8_0,q5_0,q4_1,iq4_nl,q4_0"]],
    ),
    "kv-auto": ("docs/kv-cache.md", [["kv_auto.py", "--brief", "{brief}", "--json", "{out}/kv_auto.json"]]),
    "serving": (
        "docs/server.md",
        [
            ["bench_serving.py", "--doc-tokens", "8000", "--gen", "128", "--llama-server", "{llama_server}"]
            + ["--sections", "prefix,streams,memory,llamacpp-kv,llama-server", "--json", "{json_serving}"]
        ],
    ),
    "sampling-cost": (
        "docs/server.md",
        [
            ["sampling_cost.py", "--rounds", "3", "--json", "{json_sampling_cost}"],
            ["sampling_cost.py", "{qwen}", "--rounds", "3", "--json", "{json_sampling_cost_qwen}"],
        ],
    ),
    "grammar-overhead": ("docs/server.md", [["grammar_overhead.py", "--json", "{out}/grammar_overhead.json"]]),
    "lm-eval": (
        "docs/server.md",
        [
            ["lm_eval_server.py", "--json", "{out}/lm_eval_server.json"],
            ["lm_eval_server.py", "--batch-size", "8", "--json", "{out}/lm_eval_server_batch8.json"],
        ],
    ),
    "fuzz-server": ("docs/server.md", [["fuzz_server.py", "--report", "{out}/fuzz_server.json"]]),
    "web-screenshot": ("docs/server.md", [["web_screenshot.py", "--out", "{root}/docs/web.png"]]),
    "endpoint-llamaserver": (
        "docs/scale-out.md",
        [["endpoint_llamaserver.py", "--server", "{llama_server}", "--json", "{out}/endpoint_llamaserver.json"]],
    ),
    "ruler": (  # RULER-style tasks at 4K-16K, 40 samples, f16 and the default (hours a model on 2 cores)
        "docs/benchmarks.md",
        [
            ["ruler.py", "gemma3:270m", "--json", "{out}/ruler_gemma3-270m.json"],
            ["ruler.py", "{qwen}", "--json", "{out}/ruler_qwen2.5-coder-0.5b.json"],
        ],
    ),
}
# JSON files named before one file per instruction path: the AVX-512 VNNI machine's keep their names
LEGACY_JSON = {"weight_types_avx512_vnni": "weight_types", "serving_avx512_vnni": "serving"}


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
