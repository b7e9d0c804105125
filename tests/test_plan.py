"""`tightkv plan` reads only the header, and its KV figures equal the caches' own nbytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tightkv import Model
from tightkv.engine.generate import prefill
from tightkv.eval.plan import make_plan
from tiny_gguf import write_gemma3


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("p") / "plan.gguf", context=512)


@pytest.mark.parametrize("kv", ["f16", "q8_0", "tq4", "progressive", "aggressive", "k8v4"])
def test_plan_kv_bytes_equal_cache_nbytes(tiny_path, kv):
    m = Model(tiny_path)
    tokens = 300
    cache = m.new_cache(kv)
    prefill(m.net, [2] + [10 + i % 200 for i in range(tokens - 1)], cache)
    plan = make_plan(tiny_path, tokens, 2**34, [kv])
    assert plan.rows[0]["kv_bytes"] == sum(c.nbytes for c in cache)


def test_plan_cli_names_the_lever(tiny_path):
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "tightkv.cli", "plan", str(tiny_path), *a], capture_output=True, text=True, timeout=120
    )
    ok = run("--mem", "16GB")
    assert ok.returncode == 0 and "everything fits" in ok.stdout and "progressive" in ok.stdout
    small = run("--mem", "1MB")
    assert small.returncode == 0 and "lever is the weights" in small.stdout
    bad = run("--mem", "lots")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")
