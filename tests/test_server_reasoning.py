"""Reasoning through a live `tightkv serve`: Ollama's `think` with `message.thinking` (chat) and
`thinking` (generate), OpenAI's `reasoning_content` (whole and streamed), on a tiny Qwen3
written by `gguf.GGUFWriter` with Qwen3's real chat template (its `enable_thinking` logic).

No thinking model can be downloaded here, so the model's reply is written in advance: a
bigram model (`tiny_gguf.write_scripted_qwen3`) whose greedy reply after the generation
prompt is ``<think>plan</think>ok``, streamed as the tokens "<th", "ink>", "pl", "an", "</",
"think>", "ok": both tags arrive cut in two, as a byte-level vocabulary without tag tokens
would cut them."""

from __future__ import annotations

import pytest

from test_chat_templates import QWEN3
from test_server_helpers import ndjson_records, openai_client, post, request, running, sse_events
from tiny_gguf import write_scripted_qwen3

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

CHAIN = ["Ċ", "<th", "ink>", "pl", "an", "</", "think>", "ok", "<|im_end|>"]
REPLY = "<think>plan</think>ok"
ASK = [{"role": "user", "content": "hello"}]
MODEL = "tiny-think"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_scripted_qwen3(
        tmp_path_factory.mktemp("think") / f"{MODEL}.gguf", CHAIN, QWEN3, extra_tokens=("<th", "ink>", "</", "think>")
    )
    with running(str(path), "--kv", "f16") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def ollama_chat(server, **kw):
    return ollama.Client(host=server.url).chat(
        model=MODEL, messages=kw.pop("messages", ASK), options={"temperature": 0, "num_predict": 12}, **kw
    )


# --- Ollama ------------------------------------------------------------------------------------
def test_ollama_chat_thinks_by_default_and_when_asked(server):
    for think in (None, True, "high"):
        r = ollama_chat(server, think=think)
        assert (r.message.thinking, r.message.content) == ("plan", "ok"), think
        assert r.done_reason == "stop" and r.eval_count == 7


def test_ollama_think_false_leaves_the_reply_alone(server):
    """think false renders Qwen3's empty block (enable_thinking false) and reads nothing out."""
    r = ollama_chat(server, think=False)
    assert r.message.content == REPLY and not r.message.thinking


def test_ollama_chat_streamed(server):
    parts = list(ollama_chat(server, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "plan"
    assert "".join(p.message.content for p in parts) == "ok"
    # the reasoning flows before the closing tag comes: "pl" and "an" each in a record of its own
    assert [p.message.thinking for p in parts if p.message.thinking] == ["pl", "an"]
    status, _, raw = request(
        server, "POST", "/api/chat", {"model": MODEL, "messages": ASK, "options": {"temperature": 0}}
    )
    records = ndjson_records(raw)
    assert status == 200 and records[-1]["done"] is True
    for rec in records[:-1]:  # Ollama's field order; thinking only where there is some
        assert list(rec) == ["model", "created_at", "message", "done"]
        assert list(rec["message"]) in (["role", "content"], ["role", "content", "thinking"])


def test_ollama_generate_thinks(server):
    c = ollama.Client(host=server.url)
    r = c.generate(model=MODEL, prompt="hello", options={"temperature": 0, "num_predict": 12})
    assert (r.thinking, r.response) == ("plan", "ok")
    parts = list(c.generate(model=MODEL, prompt="hello", options={"temperature": 0}, stream=True))
    assert "".join(p.thinking or "" for p in parts) == "plan" and "".join(p.response for p in parts) == "ok"
    r = c.generate(model=MODEL, prompt="hello", think=False, options={"temperature": 0})
    assert r.response == REPLY and not r.thinking


def test_ollama_think_values_and_capabilities(server):
    status, err = post(server, "/api/chat", {"model": MODEL, "messages": ASK, "think": "hard", "stream": False})
    assert status == 400 and err == {
        "error": 'invalid think value: "hard" (must be "high", "medium", "low", "max", true, or false)'
    }
    caps = ollama.Client(host=server.url).show(MODEL).capabilities
    assert "thinking" in caps and "completion" in caps


def test_ollama_history_thinking_goes_back_to_the_template(server):
    """An earlier assistant message's `thinking` is rendered by the template as
    `reasoning_content` (Qwen3's drops it for turns before the last question)."""
    history = ASK + [{"role": "assistant", "content": "ok", "thinking": "plan"}, {"role": "user", "content": "again"}]
    r = ollama_chat(server, messages=history)
    assert (r.message.thinking, r.message.content) == ("plan", "ok")


# --- OpenAI ------------------------------------------------------------------------------------
def test_openai_reasoning_content(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=12)
    message = r.choices[0].message
    assert (message.reasoning_content, message.content) == ("plan", "ok")
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 7


def test_openai_reasoning_streamed(server, client):
    parts = list(client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, stream=True))
    deltas = [p.choices[0].delta for p in parts if p.choices]
    assert [getattr(d, "reasoning_content", None) for d in deltas if getattr(d, "reasoning_content", None)] == [
        "pl",
        "an",
    ]
    assert "".join(d.content or "" for d in deltas) == "ok"
    status, _, raw = request(
        server, "POST", "/v1/chat/completions", {"messages": ASK, "temperature": 0, "stream": True}
    )
    events = sse_events(raw)
    keys = [list(e["choices"][0]["delta"]) for e in events]
    assert keys == [["role", "content"], ["reasoning_content"], ["reasoning_content"], ["content"], []]


def test_openai_thinking_off_or_left_in_the_content(client):
    off = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        temperature=0,
        max_tokens=12,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert (
        off.choices[0].message.content == REPLY and getattr(off.choices[0].message, "reasoning_content", None) is None
    )
    effort = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=12, reasoning_effort="none"
    )
    assert effort.choices[0].message.content == REPLY
    kept = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=12, extra_body={"reasoning_format": "none"}
    )
    assert kept.choices[0].message.content == REPLY


def test_constrained_reply_does_not_think(server):
    """A grammar constrains the whole reply, so the request is rendered without thinking."""
    body = {"messages": ASK, "max_tokens": 4, "grammar": 'root ::= "yes" | "no"'}
    status, doc = post(server, "/v1/chat/completions", body)
    assert (
        status == 200
        and doc["choices"][0]["message"] == {"role": "assistant", "content": doc["choices"][0]["message"]["content"]}
        and doc["choices"][0]["message"]["content"] in ("yes", "no")
    )


def test_continuing_an_assistant_message_inside_its_reasoning(server, client):
    """The assistant's last message is continued (no new turn): it left its reasoning block
    open, so the reply starts inside it: "an" is reasoning, "ok" the answer."""
    history = ASK + [{"role": "assistant", "content": "<think>\npl"}]
    r = client.chat.completions.create(model=MODEL, messages=history, temperature=0, max_tokens=12)
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == ("an", "ok")
    r = ollama_chat(server, messages=history)
    assert (r.message.thinking, r.message.content) == ("an", "ok")


def test_bad_reasoning_fields_are_400s(server):
    for extra in (
        {"chat_template_kwargs": {"messages": []}},
        {"reasoning_format": "xml"},
        {"continue_final_message": True, "add_generation_prompt": True},
        {"continue_final_message": True},
    ):
        status, doc = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, **extra})
        assert status == 400 and doc["error"]["message"], (extra, doc)
