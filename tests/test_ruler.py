"""`tightkv niah --task`: the RULER-style tasks' prompts (by the embedded model's
tokenizer), their scoring and intervals, and a smoke run through the CLI, locally
(f16 beside kvarn4) and against a real `tightkv serve` on loopback."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from cli_helpers import assert_one_line_error, cli
from test_server_helpers import running

from tightkv.eval.ruler import TASKS, Generator, parse_tasks, score, summarize

SMOKE = ["niah", "--task", "all", "--lengths", "512", "--threads", "1"]


@pytest.fixture(scope="module")
def gen(embedded):
    from tightkv.eval.endpoint import Tokens
    from tightkv.eval.niah import generated_haystack

    return Generator(Tokens.local(embedded), generated_haystack(20000))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One local run: every task at 512 tokens, 2 samples, f16 and kvarn4."""
    out = tmp_path_factory.mktemp("ruler")
    r = cli(*SMOKE, "--samples", "2", "--compare", "f16,kvarn4", "--json", str(out / "r.json"), "--png",
            str(out / "r.png"), timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "r.json").read_text()), out / "r.png"


def test_samples_are_fixed_by_seed_and_index(gen):
    for task in TASKS:
        a, b = gen.sample(task, 600, 0, seed=3), gen.sample(task, 600, 0, seed=3)
        assert a.ids == b.ids and a.expected == b.expected and a.id == b.id
        assert gen.sample(task, 600, 1, seed=3).ids != a.ids and gen.sample(task, 600, 0, seed=4).ids != a.ids


@pytest.mark.parametrize("length", [512, 2048, 4096])
def test_prompts_fit_the_length_and_hold_the_answer(gen, embedded, length):
    for task in TASKS:
        s = gen.sample(task, length, 0)
        text = embedded.detokenize(s.ids)
        if task == "cwe":  # a list of whole items: at most the length, short of it by less than one item
            assert length - 24 < len(s.ids) <= length, len(s.ids)
        else:
            assert len(s.ids) == length
        assert s.ids[:1] == embedded.tokenize("") and all(e in text for e in s.expected), (task, s.expected)
        assert text.endswith((" is", " are", " are:")), text[-80:]


def _needles(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in re.findall(r"special magic numbers for ([\w-]+) is: (\d+)\.", text):
        found.setdefault(key, []).append(value)
    return found


def test_distractors_differ_and_all_values_are_asked(gen, embedded):
    counts = {"single": (1, 1), "multikey": (4, 1), "multivalue": (1, 4), "multiquery": (4, 4)}
    for task, (keys, asked) in counts.items():
        s = gen.sample(task, 2048, 1)
        found = _needles(embedded.detokenize(s.ids))
        values = [v for vs in found.values() for v in vs]
        assert len(found) == keys and len(set(values)) == len(values) == max(keys, asked), (task, found)
        assert len(s.expected) == asked and set(s.expected) <= set(values)
        if task == "multikey":  # the asked key's number, not a distractor's
            asked_key = next(k for k, vs in found.items() if s.expected[0] in vs)
            assert f"number for {asked_key} mentioned" in embedded.detokenize(s.ids)


def test_variable_tracking_is_one_chain_in_order(gen, embedded):
    s = gen.sample("vt", 2048, 2)
    text = embedded.detokenize(s.ids)
    value = re.search(r"VAR (\w+) = (\d+)\.", text)
    links = re.findall(r"VAR (\w+) = VAR (\w+)\.", text)
    assert [value.group(1)] + [b for b, _ in links] == s.expected and len(set(s.expected)) == 5
    assert [a for _, a in links] == s.expected[:-1]  # each assignment after the one it copies
    assert f"assigned the value {value.group(2)} in the text" in text


@pytest.mark.parametrize(("length", "often", "rarely"), [(1024, 6, 1), (4096, 30, 3)])
def test_common_words_are_the_frequent_ones(gen, embedded, length, often, rarely):
    s = gen.sample("cwe", length, 0)
    words = re.findall(r" \d+\. ([\w-]+)", embedded.detokenize(s.ids))
    counts = Counter(words)
    assert len(s.expected) == 10 and all(counts[w] == often for w in s.expected)
    assert set(counts.values()) == {often, rarely} and sum(c == often for c in counts.values()) == 10


def test_scoring_is_containment_of_every_item():
    assert score("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert score("just 1234567", ["1234567", "7654321"]) == 0.5
    assert score("vars: abcde, FGHIJ", ["ABCDE", "fghij", "KLMNO", "PQRST"]) == 0.5  # ignoring case
    assert score("", ["x"]) == 0.0
    c = summarize([1.0, 1.0, 0.5, 0.0])
    assert c["n"] == 4 and c["mean"] == 0.625 and c["all_correct"] == 0.5


def test_wilson_interval_known_values():
    # 95% Wilson intervals (z = 1.96): 0/10 -> [0, 0.2775], 5/10 -> [0.2366, 0.7634], 10/10 -> [0.7225, 1]
    for scores, lo, hi in [([0.0] * 10, 0.0, 0.2775), ([1.0, 0.0] * 5, 0.2366, 0.7634), ([1.0] * 10, 0.7225, 1.0)]:
        c = summarize(scores)
        assert c["lo"] == pytest.approx(lo, abs=1e-4) and c["hi"] == pytest.approx(hi, abs=1e-4)
    assert summarize([0.5] * 10)["lo"] == pytest.approx(0.2366, abs=1e-4)  # a mean of 0.5 either way


def test_task_names():
    assert parse_tasks("all") == list(TASKS) and parse_tasks("vt, cwe,vt") == ["vt", "cwe"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--task", "single,nope"], "unknown task 'nope'"),
        (["--task", "vt", "--samples", "0"], "--samples must be at least 1"),
        (["--task", "vt", "--needle", "x", "--question", "y?", "--answer", "z"], "do not apply to --task"),
        (["--task", "cwe", "-c", "1024", "--lengths", "1024"], "do not fit the context of 1024 tokens"),
    ],
)
def test_one_line_errors(args, needle):
    assert_one_line_error(cli("niah", *args, timeout=120), needle)


def test_cli_tables_json_and_png(smoke):
    r, doc, png = smoke
    for task in TASKS:
        assert f"task {task}: mean score [95% Wilson interval]" in r.stdout
    assert re.search(r"^kvarn4 +\d+% \[\d+%-\d+%\] \d+%$", r.stdout, re.MULTILINE), r.stdout
    assert png.stat().st_size > 5000 and r.stderr.splitlines()[-1].startswith("ruler: 24 samples, ")
    assert doc["tasks"] == list(TASKS) and len(doc["prompts"]) == 12
    for task in TASKS:
        for kv in ("f16", "kvarn4"):
            got = doc["results"][task][kv]
            assert [x["id"] for x in got["samples"]] == [f"{task}-512-s0-{i}" for i in range(2)]
            assert all(0 <= x["score"] <= 1 and isinstance(x["answer"], str) for x in got["samples"])
            assert got["cells"]["512"]["n"] == 2
    assert doc["results"]["single"]["f16"]["cells"]["512"]["mean"] == 1.0  # one needle in 512 tokens: found


def test_endpoint_answers_as_the_local_engine(smoke, tmp_path):
    """The first sample of each task through a real `tightkv serve` (f16) answers as the local f16."""
    _, doc, _ = smoke
    with running("--kv", "f16", "--ctx", "1024") as srv:
        r = cli(*SMOKE, "--samples", "1", "--endpoint", srv.url, "--json", str(tmp_path / "r.json"), timeout=600)
        too_long = cli(
            "niah", "--task", "single", "--lengths", "1020", "--samples", "1", "--endpoint", srv.url, timeout=120
        )
    assert_one_line_error(too_long, "context of 1024 tokens")  # the server's, asked of it
    assert r.returncode == 0, r.stderr
    remote = json.loads((tmp_path / "r.json").read_text())
    for task in TASKS:
        (got,) = next(iter(remote["results"][task].values()))["samples"]
        assert got == doc["results"][task]["f16"]["samples"][0], task


def test_the_sweep_adds_lengths_and_keeps_what_it_has(tmp_path, capsys):
    """bench/ruler.py runs each (length, task) on its own and merges it into the JSON: a
    second run with another length adds that length's cells and samples beside the first's,
    and a length already there is kept, not run again."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import ruler

    out = tmp_path / "ruler.json"
    args = ["gemma3:270m", "--tasks", "single", "--samples", "1", "--types", "f16,q8_0", "--threads", "1"]
    assert ruler.main([*args, "--lengths", "512", "--json", str(out)]) == 0
    first = json.loads(out.read_text())["tasks"]["single"]["results"]
    assert ruler.main([*args, "--lengths", "512,640", "--json", str(out)]) == 0
    assert "single at 512: kept" in capsys.readouterr().out
    both = json.loads(out.read_text())["tasks"]["single"]["results"]
    for kv in ("f16", "q8_0"):
        assert sorted(both[kv]["cells"]) == ["512", "640"] and both[kv]["cells"]["512"] == first[kv]["cells"]["512"]
        assert sorted(s["length"] for s in both[kv]["samples"]) == [512, 640]
    assert not (tmp_path / "ruler.part.json").exists()


def test_prompts_share_their_start_through_the_prefix_store(gen, embedded):
    """A local target restores the haystack that earlier prompts shared (a chunk end two
    prompts reached by the same tokens) and answers as a fresh cache does."""
    from tightkv.eval.endpoint import LocalTarget
    from tightkv.eval.ruler import ANSWER_TOKENS, STOP

    samples = [gen.sample("single", 1600, i) for i in range(6)]
    reuse, fresh = LocalTarget(embedded, "kvarn4", 2**30), LocalTarget(embedded, "kvarn4", reuse=False)
    for s in samples:
        got = reuse.answer(s.ids, ANSWER_TOKENS["single"], stop=STOP)
        assert got == fresh.answer(s.ids, ANSWER_TOKENS["single"], stop=STOP), s.id
    assert reuse.prefixes.hits >= 1 and reuse.prefixes.reused_tokens >= 512
