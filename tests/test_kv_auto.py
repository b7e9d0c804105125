"""`--kv auto`: the best-quality type that fits the budget, probed on the user's text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, cli, private_home, seed_embedded
from test_server_helpers import request, running

CTX = 32768


@pytest.fixture(scope="module")
def plan():
    from tightkv.eval.plan import QUALITY_ORDER, make_plan
    from tightkv.registry import resolve

    return make_plan(resolve(None), CTX, 1 << 40, QUALITY_ORDER)


def budget_between(plan, small: str, large: str) -> int:
    """A memory budget in which `small` fits at CTX and `large` does not."""
    kv = {r["kv"]: r["kv_bytes"] for r in plan.rows}
    assert kv[small] < kv[large]
    return plan.weights + plan.working + (kv[small] + kv[large]) // 2


TECHNICAL = Path(__file__).resolve().parent / "data" / "technical.md"


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory):
    """Technical Markdown with tables and code (this project's own notes on its KV cache and
    speed, kept in tests/data/ so that the test reads nothing outside the repository): the
    kind of text on which the 4-bit types come nearest their bars (docs/kv-cache.md)."""
    text = TECHNICAL.read_text(encoding="utf-8")
    assert len(text) > 20000  # past the probe's 2,048 tokens and the 12,000 characters of the run test
    path = tmp_path_factory.mktemp("auto") / "brief.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_f16_wins_without_a_probe_when_it_fits(embedded, plan):
    from tightkv.autokv import choose

    choice = choose(
        embedded, "short prompt", memory=plan.weights + plan.working + (1 << 30), context=CTX, progress=False
    )
    assert choice.kv == "f16" and choice.kld == 0.0 and choice.probe_tokens == 0
    assert choice.line().startswith("kv auto: f16 (fits, no probe needed; ")  # f16 said once


def test_nothing_fits_says_how_long_a_context_would(embedded, plan):
    from tightkv.errors import TightKVError
    from tightkv.autokv import choose

    with pytest.raises(TightKVError, match=r"no KV type holds 32,768 tokens .* holds up to [\d,]+ \(-c \d+\)"):
        choose(embedded, None, memory=plan.weights + plan.working + (1 << 20), context=CTX, progress=False)


@pytest.mark.slow
def test_run_auto_picks_a_fitting_type_whose_kld_ppl_confirms(plan, doc_file, tmp_path):
    """f16 does not fit at 32K, the 4-bit types do: auto picks one, and `tightkv ppl`
    on the same text measures its KLD within 0.01 and its ΔPPL within the bar."""
    from tightkv.autokv import KLD_BAR

    mem = budget_between(plan, "kvarn4", "k8v4")
    r = cli(
        "run",
        "--kv",
        "auto",
        "-c",
        str(CTX),
        "--mem",
        str(mem),
        "-n",
        "4",
        f"Summarize this:\n{doc_file.read_text()[:12000]}",
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("kv auto: "))
    kv, kld = re.match(r"kv auto: (\S+) \(KLD ([\d.]+) vs f16 on 2,048 tokens of the prompt", line).groups()
    sizes = {row["kv"]: row["kv_bytes"] for row in plan.rows}
    assert sizes[kv] <= sizes["kvarn4"] and float(kld) <= KLD_BAR
    out = tmp_path / "ppl.json"
    r = cli(
        "ppl",
        "-f",
        str(doc_file),
        "-c",
        "2048",
        "--chunks",
        "1",
        "--compare",
        f"f16,{kv}",
        "--json",
        str(out),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["results"]
    assert res[kv]["kld_mean"] <= 0.01 and res[kv]["ppl"] / res["f16"]["ppl"] - 1 <= 0.005, res


@pytest.mark.slow
def test_ask_auto_keeps_the_decision_with_the_document(plan, doc_file, tmp_path):
    home = private_home(tmp_path)
    seed_embedded(home)
    env = {"TIGHTKV_HOME": str(home)}
    mem = budget_between(plan, "q8_0", "f16")
    r = cli(
        "ask",
        "--doc",
        str(doc_file),
        "--kv",
        "auto",
        "-c",
        str(CTX),
        "--mem",
        str(mem),
        "--json",
        "What does KVarN stand for?",
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    assert "kv auto: q8_0 (KLD" in r.stderr and "of the document" in r.stderr
    assert json.loads(r.stdout)["document"]["kv"] == "q8_0"
    info = cli("ask", "--cache-info", "--json", env=env)
    rows = json.loads(info.stdout)
    assert rows and rows[0]["kv_auto"]["kv"] == "q8_0" and rows[0]["kv_auto"]["kld"] <= 0.01
    # the probe is kept: asking again costs no probe
    again = cli(
        "ask",
        "--doc",
        str(doc_file),
        "--kv",
        "auto",
        "-c",
        str(CTX),
        "--mem",
        str(mem),
        "Who wrote it?",
        env=env,
        timeout=900,
    )
    assert again.returncode == 0 and "kv auto probe" not in again.stderr and "kv auto: q8_0" in again.stderr
    shown = cli("show", env=env)
    assert "--kv auto probes kept" in shown.stdout and re.search(r"q8_0\s+0\.000\d\d", shown.stdout), (
        shown.stdout
    )  # under 1e-3 (0.00016 on the probe text)


@pytest.mark.slow
def test_serve_auto_shows_the_decision_in_ps_and_show(plan):
    mem = budget_between(plan, "q8_0", "f16")
    args = ["--kv", "auto", "-c", str(CTX), "--parallel", "1", "--cache-ram", "0", "--mem", str(mem)]
    with running("gemma3:270m", *args, timeout=600) as srv:  # named: loaded, its KV type chosen, before it answers
        status, _, body = request(srv, "GET", "/api/ps")
        entry = json.loads(body)["models"][0]
        assert status == 200 and entry["kv_cache_type"] == "q8_0" and entry["kv_auto"]["kv"] == "q8_0"
        status, _, body = request(srv, "POST", "/api/show", {"model": "gemma3:270m"})
        assert json.loads(body)["tightkv"]["kv_auto"]["kv"] == "q8_0"


def test_auto_is_refused_by_the_measuring_verbs(essays_file):
    r = cli("ppl", "-f", str(essays_file), "--kv", "auto")
    assert_one_line_error(r, "--kv auto is for run, serve and ask")


def test_plan_with_a_text_shows_the_probed_choice(plan, doc_file, tmp_path):
    mem = budget_between(plan, "q8_0", "f16")
    out = tmp_path / "plan.json"
    r = cli("plan", "-c", str(CTX), "--mem", str(mem), "--file", str(doc_file), "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stderr
    assert "recommended: --kv q8_0 (kv auto: q8_0 (KLD" in r.stdout
    assert json.loads(out.read_text())["recommended"]["kv_auto"]["text"] == "brief.md"


def test_the_weight_suggestion_is_below_the_files_own_type(plan):
    """The embedded file is Q4_K_M: the room comes from a smaller type, never a larger one."""
    from tightkv.autokv import weight_room

    hint = weight_room(plan, need=10 * 2**20)
    assert hint.startswith("IQ4_XS weights (0.22 GiB instead of 0.23) would make room"), hint
    assert weight_room(plan, need=19 * 2**20).startswith("IQ2_M weights")
    assert weight_room(plan, need=40 * 2**20) is None  # Q1_0 would, but it destroys a model trained in float
