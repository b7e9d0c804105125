"""Prefix reuse in `tightkv serve`, through the official `openai` client and Ollama's
API on loopback: a request reuses the longest stored prefix of its prompt that ends
where a cold prefill ends a chunk with the same chunks before it (the 512-token grid,
the start of a chat turn, after a turn's last paragraph break), or the whole prompt
with its logits. Reuse is exact: greedy output equals a server that
stores nothing (`--cache-ram 0`), and usage says what was reused. Prefixes of 1,024
tokens or more are also kept on disk, so a restarted server starts warm."""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli, private_home, seed_embedded
from test_server_helpers import LiveServer, post, request
from tiny_gguf import write_qwen

openai = pytest.importorskip("openai")

MODEL = "gemma3:270m"


def _pair(*args: str):
    warm = LiveServer(*args, "--parallel", "1")
    cold = LiveServer(*args, "--parallel", "1", "--cache-ram", "0")
    try:
        yield warm.wait_ready(), cold.wait_ready()
    finally:
        warm.stop()
        cold.stop()


@pytest.fixture(scope="module")
def gemma():
    yield from _pair("--ctx", "2048")


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def document(essays_file):
    return essays_file.read_text(encoding="utf-8")[:5200]  # about 1,200 tokens: past the first 1,024-token chunks


def _chat(server, content, model=MODEL, max_tokens=12):
    r = _client(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], temperature=0, max_tokens=max_tokens
    )
    return r.choices[0].message.content, r.usage


def _paragraph_cut(content: str) -> int:
    """Where a prompt's last paragraph break ends: the document before the question."""
    from tightkv import Model

    model = Model(MODEL)
    return model.prompts.prompt_cuts(model.chat_ids([{"role": "user", "content": content}]))[-1]


def test_repeat_and_new_question_reuse_the_document_exactly(gemma, document):
    warm, cold = gemma
    q1 = document + "\n\nQuestion: What is the first essay about?\nAnswer:"
    q2 = document + "\n\nQuestion: Who wrote these essays?\nAnswer:"
    text1, u1 = _chat(warm, q1)
    assert u1.prompt_tokens > 1100 and u1.prompt_tokens_details.cached_tokens == 0
    again, u = _chat(warm, q1)  # the whole prompt, and its logits, come from the store
    assert again == text1 and u.prompt_tokens_details.cached_tokens == u.prompt_tokens
    text2, u2 = _chat(warm, q2)  # the document, up to the blank line before the question, is reused
    assert u2.prompt_tokens_details.cached_tokens == _paragraph_cut(q2) > 1024
    assert (text1, text2) == (_chat(cold, q1)[0], _chat(cold, q2)[0])  # what a server storing nothing says
    # Ollama counts the evaluated tokens only
    status, doc = post(
        warm,
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": q2}],
            "stream": False,
            "options": {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 12},
        },
    )
    assert status == 200 and doc["prompt_eval_count"] == 0 and doc["message"]["content"] == text2
    status, doc = post(
        cold,
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": q2}],
            "stream": False,
            "options": {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 12},
        },
    )
    assert doc["prompt_eval_count"] == u2.prompt_tokens


def test_metrics_and_ps_show_the_store(gemma, document):
    warm, cold = gemma
    _chat(warm, document[:300] + "\nSummary:", max_tokens=2)
    _, _, raw = request(warm, "GET", "/metrics")
    rows = dict(line.split(" ", 1) for line in raw.decode().splitlines() if line.startswith("tightkv:"))
    assert int(rows["tightkv:prefix_cache_entries"]) >= 2 and int(rows["tightkv:prefix_cache_bytes"]) > 0
    assert int(rows["tightkv:prefix_cache_budget_bytes"]) > int(rows["tightkv:prefix_cache_bytes"])
    status, _, body = request(warm, "GET", "/api/ps")
    store = json.loads(body)["models"][0]["prefix_cache"]
    assert status == 200 and store["entries"] >= 2 and 0 < store["hit_rate"] <= 1
    _, _, raw = request(cold, "GET", "/metrics")
    assert "tightkv:prefix_cache_budget_bytes 0" in raw.decode()


@pytest.fixture(scope="module")
def chatml_path(tmp_path_factory):
    return write_qwen(tmp_path_factory.mktemp("prefix") / "tiny-chatml.gguf", context=1024)


@pytest.fixture(scope="module")
def chatml(chatml_path):
    yield from _pair(str(chatml_path))


def test_paragraph_cuts_hold_as_a_conversation_grows(chatml_path):
    """A turn's last blank line is a chunk end, the same in every later prompt of the
    conversation (so their stored prefixes match); the first turn's cut lands between
    the document and the question."""
    from tightkv import Model

    model = Model(str(chatml_path))
    first = [{"role": "user", "content": "One paragraph.\n\nAnother one.\n\nQuestion: which?"}]
    ids1 = model.chat_ids(first)
    ids2 = model.chat_ids(
        first + [{"role": "assistant", "content": "The first."}, {"role": "user", "content": "More text.\n\nAnd now?"}]
    )
    turn = model.prompts.turn_cuts(ids1)[-1]  # the assistant's turn opens here in both prompts
    assert ids2[:turn] == ids1[:turn]
    cuts1, cuts2 = model.prompts.prompt_cuts(ids1), model.prompts.prompt_cuts(ids2)
    assert [c for c in cuts2 if c <= turn] == cuts1 and len(cuts2) > len(cuts1)
    breaks = model.prompts.paragraph_cuts(ids1, model.prompts.turn_cuts(ids1))
    assert len(breaks) == 1 and model.tokenizer.decode(ids1[breaks[0] : turn]).startswith("Question: which?")
    assert model.tokenizer.decode(ids1[: breaks[0]]).endswith("Another one.\n\n")


def test_a_conversation_prefills_only_its_new_turn(chatml, chatml_path):
    """Turn 2 reuses turn 1 up to the start of the assistant's turn (a chunk end of both
    prompts), and answers as a server that stores nothing does."""
    warm, cold = chatml
    history = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour of the sea, please, in a single word."},
    ]

    def turn(server, messages):
        r = _client(server).chat.completions.create(model="tiny-chatml", messages=messages, temperature=0, max_tokens=6)
        return r.choices[0].message.content, r.usage

    first, u1 = turn(warm, history)
    assert first == turn(cold, history)[0] and u1.prompt_tokens_details.cached_tokens == 0
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And of the sky?"}]
    second, u2 = turn(warm, history)
    from tightkv import Model

    model = Model(chatml_path)
    turn_starts = model.prompts.turn_cuts(model.chat_ids(history[:2]))
    assert u2.prompt_tokens_details.cached_tokens == turn_starts[-1]  # all of turn 1 but its assistant header
    assert second == turn(cold, history)[0]


def test_a_new_conversation_reuses_the_system_prompt(chatml, chatml_path):
    """Another conversation under the same system prompt reuses it (stored at the first
    turn cut of the earlier prompt), and answers as a server that stores nothing does."""
    warm, cold = chatml
    system = {"role": "system", "content": "You are a terse assistant who names things."}
    ask = lambda server, q: _client(server).chat.completions.create(  # noqa: E731
        model="tiny-chatml", messages=[system, {"role": "user", "content": q}], temperature=0, max_tokens=6
    )
    ask(warm, "Name a bird.")
    r = ask(warm, "Name a tree that grows by rivers.")
    from tightkv import Model

    model = Model(chatml_path)
    first_turn = model.prompts.turn_cuts(model.chat_ids([system, {"role": "user", "content": "x"}]))[0]
    assert r.usage.prompt_tokens_details.cached_tokens == first_turn
    assert r.choices[0].message.content == ask(cold, "Name a tree that grows by rivers.").choices[0].message.content


def test_a_restarted_server_starts_warm_from_disk(tmp_path, document):
    """The prompt files outlive the server; `tightkv cache` lists and removes them; a
    damaged file is dropped and rebuilt, never served."""
    home = private_home(tmp_path)
    seed_embedded(home)
    env = {"TIGHTKV_HOME": str(home)}
    args = ("--ctx", "2048", "--parallel", "1", "--cache-disk", "1GB")
    q1 = document + "\n\nQuestion: What is the first essay about?\nAnswer:"
    q2 = document + "\n\nQuestion: Who wrote these essays?\nAnswer:"

    def served(check):
        srv = LiveServer(*args, env=env).wait_ready()
        try:
            return check(srv)
        finally:
            srv.stop()

    text1, u1 = served(lambda srv: _chat(srv, q1))
    listed = cli("cache", "--json", env=env)
    rows = [r for r in json.loads(listed.stdout) if r["kind"] == "prompt"]
    cut = _paragraph_cut(q1)
    assert sorted(r["tokens"] for r in rows) == [1024, cut, u1.prompt_tokens], rows
    (again, u), (text2, u2) = served(lambda srv: (_chat(srv, q1), _chat(srv, q2)))
    assert again == text1 and u.prompt_tokens_details.cached_tokens == u.prompt_tokens
    assert u2.prompt_tokens_details.cached_tokens == cut
    whole = next(r["path"] for r in rows if r["tokens"] == u1.prompt_tokens)
    with open(whole, "r+b") as f:  # damage the stored tensors
        f.seek(-64, 2)
        f.write(b"\0" * 64)
    damaged, u3, log = served(lambda srv: (*_chat(srv, q1), srv.output()))
    assert damaged == text1 and u3.prompt_tokens_details.cached_tokens == cut  # rebuilt from the document's file
    assert "checksum mismatch" in log and "rebuilding" in log
    gone = cli("cache", "rm", "--all", env=env)
    assert gone.returncode == 0 and "deleted" in gone.stdout and "no cached" in cli("cache", env=env).stdout


@pytest.fixture(scope="module")
def batching():
    srv = LiveServer("--ctx", "2048", "--parallel", "4", "--cache-ram", "0")
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def test_concurrent_streams_decode_in_one_batch_and_answer_as_alone(batching):
    """Four streams at once share each decode step (the weights read once for all of
    them), and each answers exactly what it answers alone."""
    import threading

    prompts = [
        "Name three colours.",
        "Count from one to ten.",
        "Write a haiku about rain.",
        "What is the capital of Italy?",
    ]

    def metric(name):
        _, _, raw = request(batching, "GET", "/metrics")
        return int(next(line.split()[1] for line in raw.decode().splitlines() if line.startswith(f"tightkv:{name} ")))

    steps0, rows0 = metric("decode_steps_total"), metric("decode_rows_total")
    together = [None] * len(prompts)

    def run(i):
        together[i] = _chat(batching, prompts[i], max_tokens=24)[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps, rows = metric("decode_steps_total") - steps0, metric("decode_rows_total") - rows0
    assert rows / steps > 2, (steps, rows)  # most steps carried several streams
    assert together == [_chat(batching, p, max_tokens=24)[0] for p in prompts]
