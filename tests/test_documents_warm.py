"""Warm start on the embedded model: the second `tightkv ask` about a document of
8K+ tokens, in a new process, loads the saved cache instead of prefilling, and
reaches its first token in under 20% of the first run's time."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_helpers import cli, private_home, seed_embedded
from conftest import ESSAYS

# the compressed default (progressive) unless the run asks for another type
KV = os.environ.get("TIGHTKV_TEST_DOC_KV", "progressive")


@pytest.mark.slow
def test_second_ask_loads_the_saved_cache(tmp_path):
    home = private_home(tmp_path)
    seed_embedded(home)
    env = {"TIGHTKV_HOME": str(home)}
    doc = tmp_path / "essays.txt"
    doc.write_text(ESSAYS.read_text(encoding="utf-8")[:34500])  # 8.3K tokens
    args = ["ask", "--doc", str(doc), "--mode", "full", "--kv", KV, "-n", "8", "--json",
            "What do the essays say about addiction?"]
    cold = cli(*args, env=env, timeout=1200)
    assert cold.returncode == 0, cold.stderr[-2000:]
    warm = cli(*args, env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr[-2000:]
    c, w = json.loads(cold.stdout), json.loads(warm.stdout)
    assert c["document"]["doc_tokens"] >= 8192
    assert c["document"]["cache_source"] == "prefill" and w["document"]["cache_source"] == "disk"
    t_cold, t_warm = c["answers"][0]["ttft_s"], w["answers"][0]["ttft_s"]
    print(f"\n{c['document']['doc_tokens']} tokens, kv {KV}: first token {t_cold:.2f}s cold, {t_warm:.2f}s warm "
          f"(prefill {c['document'].get('prefill_s', 0):.1f}s, disk load {w['document'].get('load_s', 0):.2f}s)")
    assert t_warm < 0.2 * t_cold, (t_cold, t_warm)
    assert w["answers"][0]["answer"] == c["answers"][0]["answer"]
    # the file holds the cache's bytes plus per-layer counters and its JSON header
    path = Path(c["document"]["cache_file"])
    kv_bytes = c["document"]["kv_bytes"]
    assert kv_bytes == w["document"]["kv_bytes"]
    assert 0 <= path.stat().st_size - kv_bytes <= 0.01 * kv_bytes + 65536, (path.stat().st_size, kv_bytes)
    info = cli("ask", "--cache-info", "--json", env=env)
    row = next(r for r in json.loads(info.stdout) if r["path"] == str(path))
    assert row["kv_bytes"] == kv_bytes and row["file_bytes"] == path.stat().st_size
