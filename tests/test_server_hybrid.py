"""`tightkv serve` on a hybrid mixture of experts (the tiny Qwen3.5-MoE of tests/data/families:
Gated DeltaNet layers with a recurrent state, gated attention, routed and shared experts),
through the official `openai` client: requests decoded together in one batch answer as each
does alone, and a repeated prompt, taken from the prefix store with its recurrent state,
answers as it did cold."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from test_server_helpers import openai_client, request, running

openai = pytest.importorskip("openai")

GGUF = Path(__file__).parent / "data" / "families" / "qwen35moe" / "qwen35moe-q8_0.gguf"
PROMPTS = ["Tell me about the essays.", "What is a startup?", "Why do people write?", "Name a city."]


@pytest.fixture(scope="module")
def client():
    with running(str(GGUF), "--ctx", "1024", "--parallel", "4") as srv:
        yield srv, openai_client(srv)


def ask(client, content: str) -> str:
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=12,
    )
    return r.choices[0].message.content


def metric(srv, name: str) -> int:
    _, _, raw = request(srv, "GET", "/metrics")
    return int(next(line.split()[1] for line in raw.decode().splitlines() if line.startswith(f"tightkv:{name} ")))


def test_batched_requests_answer_as_alone_and_prefix_hits_as_cold(client):
    srv, c = client
    alone = [ask(c, p) for p in PROMPTS]
    assert all(alone), alone
    rows0, steps0 = metric(srv, "decode_rows_total"), metric(srv, "decode_steps_total")
    together = [None] * len(PROMPTS)
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, ask(c, PROMPTS[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, steps = metric(srv, "decode_rows_total") - rows0, metric(srv, "decode_steps_total") - steps0
    assert rows > steps, "the requests were never decoded in one batch"
    assert together == alone
    hits = metric(srv, "prefix_cache_hits_total")
    assert ask(c, PROMPTS[0]) == alone[0]
    assert metric(srv, "prefix_cache_hits_total") > hits
