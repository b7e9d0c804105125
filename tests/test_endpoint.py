"""`--endpoint`: niah, ppl and docqa against a real `tightkv serve` on loopback give
what the local engine gives; `plan`'s llama.cpp and vLLM equivalents."""

from __future__ import annotations

import json
import math
import re

import pytest

from cli_helpers import assert_one_line_error, cli
from test_server_helpers import running


@pytest.fixture(scope="module")
def server():
    with running("--kv", "f16", "--ctx", "2048") as srv:
        yield srv


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, essays_file):
    path = tmp_path_factory.mktemp("ppl") / "essays-part.txt"
    path.write_text(essays_file.read_text()[:20000])
    return path


def _ppl(out: str) -> float:
    return float(re.search(r"Final estimate: PPL = ([\d.]+)", out).group(1))


def test_topk_kld_is_zero_for_the_same_distribution_and_grows_with_the_difference():
    from tightkv.eval.ppl import topk_kld

    base = {"a": math.log(0.6), "b": math.log(0.3), "c": math.log(0.05)}
    assert topk_kld(base, base) == pytest.approx(0.0, abs=1e-12)
    near = {"a": math.log(0.55), "b": math.log(0.35), "c": math.log(0.05)}
    far = {"a": math.log(0.2), "b": math.log(0.7), "c": math.log(0.05)}
    assert 0 < topk_kld(base, near) < topk_kld(base, far)
    # with every token listed it is the exact KLD
    full_p, full_q = [0.6, 0.3, 0.1], [0.5, 0.3, 0.2]
    exact = sum(p * math.log(p / q) for p, q in zip(full_p, full_q))
    listed = lambda ps: {k: math.log(v) for k, v in zip("abc", ps)}  # noqa: E731
    assert topk_kld(listed(full_p), listed(full_q)) == pytest.approx(exact, rel=1e-9)


def test_ppl_endpoint_equals_local_perplexity(server, text_file):
    args = ["ppl", "-f", str(text_file), "-c", "512", "--chunks", "2"]
    local = cli(*args, timeout=600)
    assert local.returncode == 0, local.stderr
    remote = cli(*args, "--endpoint", server.url + "/v1", timeout=600)
    assert remote.returncode == 0, remote.stderr
    assert abs(_ppl(remote.stdout) / _ppl(local.stdout) - 1) < 0.005, (local.stdout, remote.stdout)


def test_ppl_compare_mixes_local_types_and_endpoints(server, text_file, tmp_path):
    out = tmp_path / "ppl.json"
    r = cli(
        "ppl",
        "-f",
        str(text_file),
        "-c",
        "512",
        "--chunks",
        "1",
        "--compare",
        f"f16,q8_0,{server.url}",
        "--json",
        str(out),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "top 20 tokens" in r.stdout
    results = json.loads(out.read_text())["results"]
    label = next(k for k in results if k.startswith("127.0.0.1"))
    assert list(results)[:2] == ["f16", "q8_0"]
    # the server runs the same model with an f16 cache: the same distribution, up to chunking
    assert results[label]["kld_mean"] < 1e-3 and results[label]["same_top1"] > 0.99
    assert abs(results[label]["ppl"] / results["f16"]["ppl"] - 1) < 0.005


def test_niah_endpoint_gives_the_local_grid(server, tmp_path):
    grid = ["--lengths", "512,1024", "--depths", "0,50,100"]
    local, remote = tmp_path / "local.json", tmp_path / "remote.json"
    r = cli("niah", *grid, "--json", str(local), timeout=600)
    assert r.returncode == 0, r.stderr
    r = cli("niah", *grid, "--endpoint", server.url, "--json", str(remote), timeout=600)
    assert r.returncode == 0, r.stderr
    a = json.loads(local.read_text())["results"]["f16"]["cells"]
    b = next(iter(json.loads(remote.read_text())["results"].values()))["cells"]
    assert [(c["length"], c["depth"], c["answer"]) for c in a] == [(c["length"], c["depth"], c["answer"]) for c in b]
    assert sum(c["passed"] for c in b) >= 5


def test_docqa_endpoint_answers_the_report(server, tmp_path):
    out = tmp_path / "docqa.json"
    r = cli(
        "docqa",
        "--sets",
        "report",
        "--reports",
        "1",
        "--modes",
        "full,rag,rlv",
        "--endpoint",
        server.url,
        "--json",
        str(out),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    assert "skipped" in r.stdout  # rlv reads into the local engine's cache
    runs = json.loads(out.read_text())["runs"]
    assert sorted(k.split("|")[1] for k in runs) == ["full", "rag"]
    for rec in runs.values():
        assert rec["n"] == 7 and all(i["answer"] for i in rec["items"])
    assert runs[next(k for k in runs if "|full|" in k)]["correct"] >= 4


def test_an_unreachable_endpoint_is_one_line():
    r = cli("niah", "--lengths", "512", "--depths", "50", "--endpoint", "http://127.0.0.1:9/v1", timeout=120)
    assert_one_line_error(r, "cannot reach http://127.0.0.1:9")


def test_plan_names_the_llamacpp_and_vllm_settings(tmp_path):
    out = tmp_path / "plan.json"
    # a budget where f16 does not fit at 32K but the 8-bit-key type does
    r = cli("plan", "-c", "32768", "--compare", "f16,k8v4,kvarn4", "--mem", "0.75GB", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    fits = {row["kv"]: row["fits"] for row in doc["rows"]}
    best = doc["recommended"]
    assert not fits["f16"] and fits["k8v4"] and best["kv"] == "k8v4"
    engines = {e["engine"]: e for e in best["equivalents"]}
    assert set(engines) == {"llama.cpp", "vLLM"}
    assert "recommended: --kv " + best["kv"] in r.stdout and "-ctk" in r.stdout and "--kv-cache-dtype" in r.stdout


def test_equivalents_of_the_common_types():
    from tightkv.eval.engines import equivalents
    from tightkv.kv.spec import kv_bytes_per_token

    layout = [(1, 256, 256, None)] * 3 + [(1, 256, 256, 512)] * 15
    f16 = {e.engine: e for e in equivalents("f16", layout, 8192)}
    assert f16["llama.cpp"].flags == "-ctk f16 -ctv f16" and f16["vLLM"].flags == "--kv-cache-dtype auto"
    assert f16["llama.cpp"].bytes_per_sequence == kv_bytes_per_token("f16", layout, 8192)["f16_bytes"]
    k8v4 = {e.engine: e for e in equivalents("k8v4", layout, 8192)}
    assert k8v4["vLLM"].flags == "--kv-cache-dtype turboquant_k8v4" and k8v4["vLLM"].exact
    assert k8v4["llama.cpp"].flags == "-ctk q8_0 -ctv q4_0 -fa on" and not k8v4["llama.cpp"].exact
    kvarn = {e.engine: e for e in equivalents("kvarn4", layout, 8192)}
    assert not kvarn["llama.cpp"].exact and not kvarn["vLLM"].exact
    q8 = {e.engine: e for e in equivalents("q8_0", layout, 8192)}
    ratio = q8["llama.cpp"].bytes_per_sequence / f16["llama.cpp"].bytes_per_sequence
    assert q8["llama.cpp"].exact and ratio == pytest.approx(8.5 / 16, abs=1e-4)  # 34 bytes per 32 values


def test_first_token_alternatives_in_both_response_formats():
    from tightkv.eval.endpoint import _first_alternatives

    openai = {"tokens": ["\n"], "token_logprobs": [-0.1], "top_logprobs": [{"\n": -0.1, " Paris": -2.5}]}
    llamacpp = {
        "content": [
            {
                "token": "\n",
                "logprob": -0.1,
                "top_logprobs": [
                    {"id": 108, "token": "\n", "logprob": -0.1},
                    {"id": 9079, "token": " Paris", "logprob": -2.5},
                ],
            }
        ]
    }
    assert _first_alternatives(openai) == _first_alternatives(llamacpp) == {"\n": -0.1, " Paris": -2.5}
    assert _first_alternatives(None) is None and _first_alternatives({"content": []}) is None
