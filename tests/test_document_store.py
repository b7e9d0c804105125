"""The stored KV prefixes as a user meets them (#53 point 6): an RLV read takes one file,
the store keeps under its bound (least recently used out), and `tightkv cache prune`
trims by age and by size."""

from __future__ import annotations

import os
import time

import pytest
from cli_helpers import assert_one_line_error, cli, private_home, seed_embedded
from tiny_gguf import write_gemma3

from tightkv.engine.generate import prefill
from tightkv.eval.docqa import company_report
from tightkv.kv.saved import CacheStore

DAY = 86400


def stored(model, store: CacheStore, text: str, age_days: float = 0) -> os.PathLike:
    """`text` prefilled into a q8_0 cache and saved as a document, last used `age_days` ago."""
    ids = model.tokenize(text, add_bos=True)
    cache = model.new_cache("q8_0")
    prefill(model.net, ids, cache)
    path = store.save(model, None, "q8_0", ids, cache)
    used = time.time() - age_days * DAY
    os.utime(path, (used, used))
    return path


@pytest.fixture
def home(tmp_path):
    home = private_home(tmp_path)
    seed_embedded(home)
    return home


@pytest.fixture
def three(embedded, home):
    """Three stored documents, last used 10 days, 2 days and a minute ago."""
    store = CacheStore(home / "documents", max_bytes=0)
    return [stored(embedded, store, f"Document {i}: " + "words " * 40, age) for i, age in enumerate((10, 2, 0.001))]


def test_an_rlv_read_is_stored_as_one_file(tmp_path):
    """A read of several sections keeps each section's end in RAM, and on disk only the
    whole read: no file holds a prefix of another read's file."""
    from tightkv import Model

    report = company_report(seed=3)
    model = Model(write_gemma3(tmp_path / "tiny.gguf", context=4096), threads=1)
    store = CacheStore(tmp_path / "documents", max_bytes=0)
    session = model.load_document(
        report.text, cache=store, kv="progressive", mode="rlv", progress=False, section_tokens=64
    )
    answer = session.ask(report.questions[0].question, max_tokens=4)
    reads = [st for st in answer.stages if st["stage"] in ("lookup", "research")]
    files = [e for e in store.entries() if e["kind"] == "rlv read"]
    assert reads and files
    assert {e["tokens"] for e in files} == {r["tokens"] for r in reads if r["reused_tokens"] < r["tokens"]}
    assert len(session.prefixes) > len(files)  # the section ends inside a read: in RAM only


def test_a_save_keeps_the_store_under_its_bound(embedded, home, three):
    """Beyond the bound the least recently used files go, never the one just written."""
    size = max(os.path.getsize(p) for p in three)
    store = CacheStore(home / "documents", max_bytes=int(2.5 * size))
    new = stored(embedded, store, "A fourth document, " + "text " * 40)
    left = {e["path"] for e in store.entries()}
    assert left == {str(three[2]), str(new)}  # the two least recently used went
    assert CacheStore(home / "documents", max_bytes=1).max_bytes == 1
    assert stored(embedded, CacheStore(home / "documents", max_bytes=1), "Alone. " * 30).exists()


def test_the_default_bound_and_its_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("TIGHTKV_CACHE_MAX", raising=False)
    assert CacheStore(tmp_path).max_bytes == 4 * 10**9
    monkeypatch.setenv("TIGHTKV_CACHE_MAX", "500MiB")
    assert CacheStore(tmp_path).max_bytes == 500 * 2**20
    monkeypatch.setenv("TIGHTKV_CACHE_MAX", "0")
    assert CacheStore(tmp_path).max_bytes is None


def test_cache_prune_older_than(home, three):
    env = {"TIGHTKV_HOME": str(home)}
    r = cli("cache", "prune", "--older-than", "7d", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("deleted 1 file (") and "2 left" in r.stdout
    assert [p.exists() for p in three] == [False, True, True]
    listing = cli("cache", "list", env=env)
    assert "2 files" in listing.stdout and "at most 4 GB" in listing.stdout
    r = cli("cache", "prune", "--older-than", "1h", env=env)
    assert [p.exists() for p in three] == [False, False, True]


def test_cache_prune_max_size_takes_the_least_recently_used_first(home, three):
    size = max(os.path.getsize(p) for p in three)
    r = cli("cache", "prune", "--max-size", f"{int(1.5 * size)}B", env={"TIGHTKV_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "deleted 2 files" in r.stdout and "1 left" in r.stdout
    assert [p.exists() for p in three] == [False, False, True]


def test_cache_prune_both_and_by_kind(home, three):
    env = {"TIGHTKV_HOME": str(home)}
    r = cli("cache", "prune", "--older-than", "7d", "--max-size", "1GB", "--kind", "prompt", env=env)
    assert r.returncode == 0 and r.stdout.startswith("deleted 0 files")  # no prompts stored
    r = cli("cache", "prune", "--older-than", "1d", "--max-size", "1GB", env=env)
    assert "deleted 2 files" in r.stdout and [p.exists() for p in three] == [False, False, True]


@pytest.mark.parametrize(
    "args, needle",
    [
        ((), "prune needs --older-than AGE or --max-size SIZE"),
        (("--older-than", "7x"), "--older-than takes an age like 7d"),
        (("--max-size", "lots"), "--max-size takes a size like 16GB"),
    ],
)
def test_cache_prune_errors_are_one_line(home, args, needle):
    assert_one_line_error(cli("cache", "prune", *args, env={"TIGHTKV_HOME": str(home)}), needle)


def test_ask_keeps_the_store_under_tightkv_cache_max(home, three, tmp_path):
    """A document asked about with a bound of 2.5 stored files: its cache is written, the
    least recently used go until the store fits."""
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday in room 4.\n")
    bound = int(2.5 * max(os.path.getsize(p) for p in three))
    env = {"TIGHTKV_HOME": str(home), "TIGHTKV_CACHE_MAX": f"{bound}B"}
    r = cli("ask", "--doc", str(doc), "When is the meeting?", "-n", "4", env=env)
    assert r.returncode == 0, r.stderr
    kept = [p.exists() for p in three]
    assert not kept[0] and kept == sorted(kept)  # the oldest first
    files = CacheStore(home / "documents", max_bytes=0).files(None)
    assert len(files) == 1 + sum(kept) and sum(size for _, size, _ in files) <= bound


def test_ask_help_names_the_formats_the_readme_lists_and_formats_reads():
    """`ask --help` says every format `documents.formats` reads, as the README lists them."""
    import re
    from pathlib import Path

    from tightkv.documents import formats

    text = " ".join(cli("ask", "--help").stdout.split())
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listed = re.search(r"A document \(([^)]*)\) is prefilled", readme).group(1)
    assert listed == "text, Markdown, HTML or PDF"
    for name in ("text", "Markdown", "HTML", "PDF"):
        assert name in text
    for suffix in formats.SUFFIXES - {""}:
        assert suffix in text, suffix
