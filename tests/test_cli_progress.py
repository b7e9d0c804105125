"""Progress of the long verbs (ppl, bench's fill, niah) as a user sees it (issue 23,
point 6): piped to a file, plain lines (never a carriage return) that move within
a chunk, and a summary line at the end; on a terminal, a bar redrawn in place.
A tiny model keeps these fast; the same code runs for the embedded one."""

from __future__ import annotations

import re
import sys

import pytest

from cli_helpers import Terminal, cli
from tiny_gguf import write_gemma3

TEXT = ("The quick brown fox jumps over the lazy dog. " * 120).strip()
EVERY_UPDATE = {"TIGHTKV_PROGRESS_SECONDS": "0"}  # a line at every update, to see each one


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    text = root / "text.txt"
    text.write_text(TEXT)
    return write_gemma3(root / "tiny.gguf", context=4096), text


def percents(lines: list[str], prefix: str) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.match(re.escape(prefix) + r".*?:\s+(\d+)% ", line))]


def test_ppl_piped_writes_a_line_per_forward_call_and_a_summary(tiny):
    model, text = tiny
    r = cli(
        "ppl",
        str(model),
        "--file",
        str(text),
        "-c",
        "256",
        "--chunks",
        "2",
        "-b",
        "64",
        "--compare",
        "f16,q8_0",
        "--threads",
        "1",
        env=EVERY_UPDATE,
    )
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr
    lines = r.stderr.splitlines()
    # 2 chunks x 2 KV types: 256 tokens run, 64 per forward call, then 127 rows scored in blocks of 64:
    # 6 updates each (2 x 2 x 383 = 1532 in all), a line after every update but the last
    first = percents(lines, "perplexity chunk 1/2")
    assert len(first) == 12 and first == sorted(first) and first[0] == 100 * 64 // 1532, lines  # moves within chunk 1
    assert len(percents(lines, "perplexity chunk 2/2")) == 11, lines
    assert re.fullmatch(
        r"perplexity: 2 chunks x 2 KV types, 1532 tok in [\d.]+s \(\d+ tok/s\)  "
        r"f16 [\d.]+ q8_0 [\d.]+",
        lines[-1],
    ), lines[-1]
    assert "Final estimate: PPL = " in r.stdout  # the table stays on stdout


def test_ppl_piped_by_default_is_a_few_lines_not_one_per_call(tiny):
    model, text = tiny
    r = cli("ppl", str(model), "--file", str(text), "-c", "256", "--chunks", "2", "-b", "16", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    lines = r.stderr.splitlines()
    progress = [line for line in lines if line.startswith("perplexity chunk")]
    assert len(progress) <= 10, lines  # a line per tenth (or 10 s), not one per update (72 here)
    # by default the default cache against f16
    assert lines[-1].startswith("perplexity: 2 chunks x 2 KV types, 1532 tok in "), lines


def test_bench_fill_piped_is_plain_lines_and_a_summary(tiny):
    model, _ = tiny
    r = cli(
        "bench",
        str(model),
        "--depths",
        "600",
        "-p",
        "16",
        "--n-gen",
        "2",
        "-r",
        "1",
        "--threads",
        "1",
        env=EVERY_UPDATE,
    )
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr
    lines = r.stderr.splitlines()
    assert percents(lines, "tightkv f16 filling d600") == [85], lines  # 512 of 600, the prefill piece
    assert any(re.fullmatch(r"tightkv f16 filling d600: 600 tok in [\d.]+s \(\d+ tok/s\)", x) for x in lines), lines
    assert lines.index(next(x for x in lines if x.startswith("tightkv f16 filling d600: 600 tok"))) < lines.index(
        next(x for x in lines if x.startswith("tightkv f16 tg2 @ d600: "))
    )


def test_niah_piped_moves_within_a_cell(tiny):
    model, text = tiny
    r = cli(
        "niah",
        str(model),
        "--lengths",
        "700",
        "--depths",
        "0,100",
        "--haystack",
        str(text),
        "--threads",
        "1",
        env=EVERY_UPDATE,
    )
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr
    lines = r.stderr.splitlines()
    cell = percents(lines, "niah cell 1/2 (f16, 700 tok at 0%)")
    assert 36 <= cell[0] <= 37 and len(cell) >= 2, lines  # 512 of the ~1400 tokens, in the first prefill
    assert re.fullmatch(r"niah: 2 cells, \d+ tok in [\d.]+s \(\d+ tok/s\)  \d/2 passed", lines[-1]), lines
    assert "kv f16: " in r.stdout


def test_ppl_on_a_terminal_is_a_bar_redrawn_in_place(tiny, tmp_path):
    model, text = tiny
    t = Terminal(
        [
            sys.executable,
            "-m",
            "tightkv.cli",
            "ppl",
            str(model),
            "--file",
            str(text),
            "-c",
            "256",
            "--chunks",
            "2",
            "-b",
            "64",
            "--threads",
            "1",
        ]
    )
    try:
        t.expect(r"perplexity: 2 chunks x 2 KV types, 1532 tok in ", timeout=120)
        t.expect(r"Final estimate: PPL = ")
        assert t.wait() == 0
    finally:
        t.kill()
    raw = t.raw.decode("utf-8", "replace")
    assert re.search(r"\rperplexity[^\r\n]*: +\d+%\|", raw), raw  # tqdm's bar, redrawn with \r
    summary = raw[raw.index("perplexity: 2 chunks") :].split("\r\n")[0]  # the pty writes \n as \r\n
    assert "\r" not in summary and "%|" not in summary  # the bar is gone; the summary is a line of its own


def test_bench_fill_on_a_terminal_is_a_bar_then_its_summary(tiny):
    model, _ = tiny
    t = Terminal(
        [
            sys.executable,
            "-m",
            "tightkv.cli",
            "bench",
            str(model),
            "--depths",
            "1500",
            "-p",
            "16",
            "--n-gen",
            "2",
            "-r",
            "1",
            "--threads",
            "1",
        ]
    )
    try:
        t.expect(r"tightkv f16 filling d1500: 1500 tok in [\d.]+s", timeout=120)
        t.expect(r"tightkv f16 tg2 @ d1500: ")
        assert t.wait() == 0
    finally:
        t.kill()
    raw = t.raw.decode("utf-8", "replace")
    assert re.search(r"\rtightkv f16 filling d1500: +\d+%\|", raw), raw  # tqdm's bar while it fills
    summary = raw[raw.index("tightkv f16 filling d1500: 1500 tok") :].split("\r\n")[0]
    assert "\r" not in summary and "%|" not in summary


def test_ask_piped_shows_the_document_prefill_and_each_rlv_read(tiny, tmp_path):
    """`ask` in full mode: the document's prefill as plain lines that move within it, and
    a summary line; in RLV mode, each read that prefills has its lines and summary."""
    model, _ = tiny
    doc = tmp_path / "doc.md"
    doc.write_text("# Ships\n\n" + TEXT[:1200] + "\n\n# Keepers\n\n" + TEXT[:1200].replace("fox", "keeper"))
    env = {**EVERY_UPDATE, "TIGHTKV_HOME": str(tmp_path / "home")}
    full = cli(
        "ask",
        "-m",
        str(model),
        "--doc",
        str(doc),
        "--mode",
        "full",
        "--threads",
        "1",
        "-n",
        "4",
        "What jumps?",
        env=env,
    )
    assert full.returncode == 0, full.stderr
    assert "\r" not in full.stderr and "\x1b[" not in full.stderr
    lines = full.stderr.splitlines()
    moving = percents(lines, "prefill document")
    assert len(moving) >= 2 and moving == sorted(moving), lines  # lines within the prefill, not one at its end
    assert any(re.match(r"prefill document: \d+ tok in [\d.]+s \(\d+ tok/s\)", x) for x in lines), lines
    rlv = cli(
        "ask", "-m", str(model), "--doc", str(doc), "--mode", "rlv", "--threads", "1", "-n", "4", "What jumps?", env=env
    )
    assert rlv.returncode == 0, rlv.stderr
    lines = rlv.stderr.splitlines()
    assert lines[0].startswith("mode: rlv") and "\r" not in rlv.stderr
    assert any(re.match(r"rlv read 1 \(.+\): \d+ tok in [\d.]+s", x) for x in lines), lines

    too_long = tmp_path / "long.md"
    too_long.write_text(TEXT * 2)
    failed = cli("ask", "-m", str(model), "--doc", str(too_long), "--mode", "full", "--threads", "1", "Why?", env=env)
    assert failed.returncode == 1 and failed.stderr.splitlines()[-1].startswith("error: the document is")
    assert "tok in" not in failed.stderr  # no summary line for a prefill that did not happen
