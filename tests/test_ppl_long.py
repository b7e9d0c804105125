"""bench/ppl_long.py, the long-context sweep (#52), at toy contexts: the nested contexts score as
their own runs, a second run adds only the types missing, and llama.cpp's cell beside ours."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

ARGS = ["gemma3:270m", "--texts", "essays", "--ctxs", "128,256", "--threads", "1"]
NO_LLAMA = ["--llama-kinds", "", "--llama-unrotated", ""]


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    import ppl_long

    monkeypatch.setattr(ppl_long, "hidden_path", lambda m, t, k, c, f: tmp_path / f"{t}-{c}-{k}.pt")
    return ppl_long, tmp_path / "out.json"


def test_sweep_scores_nested_contexts_and_resumes(sweep, embedded, essays_file, capsys):
    from tightkv.eval.ppl import perplexity_at

    ppl_long, out = sweep
    assert ppl_long.main([*ARGS, "--kinds", "tq3", *NO_LLAMA, "--json", str(out)]) == 0
    cell = json.loads(out.read_text())["texts"]["essays"]["tightkv"]
    assert cell["tq3"]["by_ctx"]["128"]["n_scored"] == 127 - 96 and cell["tq3"]["bytes_per_token"]["256"] > 0
    own = perplexity_at(embedded, essays_file.read_text()[:20000], [128], 1, ["f16", "tq3"], 0.75, False)[128]
    assert cell["tq3"]["by_ctx"]["128"] == own["tq3"] and cell["f16"]["by_ctx"]["128"] == own["f16"]
    assert ppl_long.main([*ARGS, "--kinds", "tq3,kvarn4", *NO_LLAMA, "--json", str(out)]) == 0
    again = json.loads(out.read_text())["texts"]["essays"]["tightkv"]
    assert again["tq3"] == cell["tq3"] and again["kvarn4"]["by_ctx"]["256"]["kld_mean"] > 0
    assert "context 256" in capsys.readouterr().out


def test_sweep_runs_llamacpp_beside(sweep):
    pytest.importorskip("llama_cpp", exc_type=ImportError)
    ppl_long, out = sweep
    args = [*ARGS, "--kinds", "", "--llama-kinds", "q8_0", "--llama-unrotated", "q8_0", "--json", str(out)]
    assert ppl_long.main(args) == 0
    cell = json.loads(out.read_text())["texts"]["essays"]["llama.cpp"]
    assert cell["f16"]["by_ctx"]["256"]["kld_mean"] == 0 and cell["q8_0"]["rotated"]
    assert cell["q8_0 unrotated"]["by_ctx"]["128"]["n_scored"] == 31 and not cell["q8_0 unrotated"]["rotated"]
