"""Harmony (gpt-oss's format) through a live `tightkv serve` and the official openai and ollama
clients: analysis as reasoning_content / thinking, final as content, commentary to a function
as a tool call (streamed in fragments), a commentary preamble as content, a reply cut by
max_tokens, structured output over the final message only, a forced call.

The replies are scripted (`scripted_harmony`): a bigram model with gpt-oss's special tokens
and chat template whose greedy reply is ``<|channel|>analysis<|message|>plan<|end|><|start|>
assistant<|channel|>final<|message|>ok<|return|>``, the markup tokens written as control
tokens (as gpt-oss's GGUF has them) and made visible by the loader; `logit_bias` on the token
where another chain branches off picks that one (a preamble then a call with the recipient in
the role header; or a call with the recipient after the channel), through the real sampler."""

from __future__ import annotations

import json

import pytest
from scripted_harmony import BRANCH_BIAS, gpt_oss_template, token_id, write_scripted_harmony
from test_server_helpers import ndjson_records, openai_client, post, request, running, sse_events
from tiny_gguf import gpt2_byte_chars

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
TEMPLATE = gpt_oss_template()
pytestmark = pytest.mark.skipif(TEMPLATE is None, reason="llama.cpp's gpt-oss template is not on this machine")

_BYTE = gpt2_byte_chars()


def P(text: str) -> str:
    """A normal token's vocabulary string (byte-level BPE spells a space "Ġ")."""
    return "".join(_BYTE[b] for b in text.encode())


# the second message's header is spelled in plain pieces ("<|chan", "nel|>"): a tag cut across
# tokens, and no copies of tokens on the path a grammar constrains (llguidance keeps one token
# per text, so a copy would be masked)
ANSWER = [
    *("assistant", "<|channel|>", "analysis", "<|message|>", "pl", "an", "<|end|>", "<|start|>"),
    *(P("assis"), P("tant"), P("<|chan"), P("nel|>"), "final", P("<|mess"), P("age|>"), "ok", "<|return|>"),
]
PREAMBLE_CALL = [  # leaves ANSWER at "commentary" (#3) where it says "final"
    *(P("nel|>"), "commentary#3", "<|message|>#2", P("Let me"), P(" check."), "<|end|>#2"),
    *("<|start|>#2", "assistant#2", P(" to"), P("=functions"), P(".get"), P("_weather"), "<|channel|>#2"),
    *("commentary#2", P(" json"), "<|message|>#3", P('{"city":'), P(' "Paris"}'), "<|call|>"),
]
CHANNEL_CALL = [  # leaves ANSWER at once
    *("assistant", "<|channel|>#3", "commentary#4", P(" to=functions.get_weather"), P(" "), "<|constrain|>"),
    *("json", "<|message|>#4", P('{"city":') + "#2", P(' "Oslo"}'), "<|call|>"),
]
# Under a grammar, llguidance admits only the canonical tokens of text the grammar forces (one
# token per text, the tokenizer's own: no copies, no pieces), so the constrained requests take
# these edges, and a repeat_penalty (`PENALTY`) turns a second "analysis" into "final" (or
# "commentary", for a forced call)
# (the edge assistant -> <|channel|> is ANSWER's: not added twice)
CANONICAL = [["<|start|>", "assistant"], ["<|channel|>", "final", "<|message|>"], ["<|channel|>", "commentary"]]
PENALTY = 1.5
MODEL = "tiny-harmony"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_scripted_harmony(
        tmp_path_factory.mktemp("harmony") / f"{MODEL}.gguf",
        [ANSWER, PREAMBLE_CALL, CHANNEL_CALL, *CANONICAL],
        TEMPLATE,
    )


@pytest.fixture(scope="module")
def server(gguf):
    with running(str(gguf), "--kv", "f16") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def branch(gguf):
    """logit_bias that takes a chain: "call" (PREAMBLE_CALL) or "channel_call" (CHANNEL_CALL)."""
    return {
        "call": {str(token_id(gguf, "commentary#3")): BRANCH_BIAS},
        "channel_call": {str(token_id(gguf, "<|channel|>#3")): BRANCH_BIAS},
    }


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK), temperature=0, **kw)


# --- analysis and final ------------------------------------------------------------------------
def test_openai_analysis_is_reasoning_final_is_content(client):
    r = chat(client, max_tokens=40)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content, m.tool_calls) == ("plan", "ok", None)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 15


def test_openai_streamed(server, client):
    deltas = [p.choices[0].delta for p in chat(client, stream=True) if p.choices]
    assert [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)] == ["pl", "an"]
    assert "".join(d.content or "" for d in deltas) == "ok"
    status, _, raw = request(server, "POST", "/v1/chat/completions", {"messages": ASK, "stream": True})
    keys = [list(e["choices"][0]["delta"]) for e in sse_events(raw)]
    assert status == 200 and keys == [
        ["role", "content"],
        ["reasoning_content"],
        ["reasoning_content"],
        ["content"],
        [],
    ]


def test_ollama_chat_and_generate(server):
    c = ollama.Client(host=server.url)
    r = c.chat(model=MODEL, messages=ASK, options={"temperature": 0})
    assert (r.message.thinking, r.message.content, r.done_reason) == ("plan", "ok", "stop")
    parts = list(c.chat(model=MODEL, messages=ASK, options={"temperature": 0}, stream=True))
    assert [p.message.thinking for p in parts if p.message.thinking] == ["pl", "an"]
    assert "".join(p.message.content for p in parts) == "ok" and parts[-1].done_reason == "stop"
    g = c.generate(model=MODEL, prompt="hi", options={"temperature": 0})
    assert (g.thinking, g.response) == ("plan", "ok")


def test_think_values_and_capabilities(server):
    """gpt-oss always reasons: think false asks for low effort (not a 400), levels set it."""
    c = ollama.Client(host=server.url)
    for think in (False, True, "low", "high"):
        r = c.chat(model=MODEL, messages=ASK, think=think, options={"temperature": 0})
        assert (r.message.thinking, r.message.content) == ("plan", "ok"), think
    assert {"thinking", "tools", "completion"} <= set(c.show(MODEL).capabilities)


def test_reasoning_effort_values(server, client):
    for effort in ("low", "medium", "high", "minimal", "none"):
        assert chat(client, reasoning_effort=effort).choices[0].message.content == "ok"
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        chat(client, reasoning_effort="extreme")


def test_reasoning_format_none_keeps_the_analysis(client):
    r = chat(client, extra_body={"reasoning_format": "none"})
    assert r.choices[0].message.content == "<|channel|>analysis<|message|>plan<|end|>ok"


# --- cut short -----------------------------------------------------------------------------------
def test_max_tokens_inside_a_channel(server, client, branch):
    """What the reply has, with finish_reason length: inside the analysis, inside a header,
    inside a call's arguments; never a 500."""
    r = chat(client, max_tokens=4)
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == ("pl", "")
    assert r.choices[0].finish_reason == "length"
    r = chat(client, max_tokens=10)  # ... <|start|>assistant<|chan: the final header not read yet
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content, r.choices[0].finish_reason) == (
        "plan",
        "",
        "length",
    )
    r = chat(client, max_tokens=27, tools=TOOLS, logit_bias=branch["call"])
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments, r.choices[0].finish_reason) == (
        "get_weather",
        '{"city":',
        "length",
    )
    parts = list(chat(client, max_tokens=4, stream=True))
    assert parts[-1].choices[0].finish_reason == "length"
    o = ollama.Client(host=server.url).chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": 4})
    assert (o.message.thinking, o.done_reason) == ("pl", "length")


# --- tool calls ----------------------------------------------------------------------------------
def test_openai_preamble_then_call(client, branch):
    r = chat(client, tools=TOOLS, logit_bias=branch["call"])
    m = r.choices[0].message
    assert (m.reasoning_content, m.content) == ("plan", "Let me check.")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert m.tool_calls[0].id.startswith("call_") and r.choices[0].finish_reason == "tool_calls"


def test_openai_call_streamed_in_fragments(client, branch):
    deltas = [
        p.choices[0].delta for p in chat(client, tools=TOOLS, logit_bias=branch["call"], stream=True) if p.choices
    ]
    calls = [c for d in deltas for c in d.tool_calls or ()]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].function.arguments == ""
    assert [c.function.arguments for c in calls[1:]] == ['{"city":', ' "Paris"}']
    assert [d.content for d in deltas if d.content] == ["Let me", " check."]


def test_recipient_after_the_channel(client, branch):
    r = chat(client, tools=TOOLS, logit_bias=branch["channel_call"])
    m = r.choices[0].message
    assert m.content is None and getattr(m, "reasoning_content", None) is None
    assert (m.tool_calls[0].function.name, m.tool_calls[0].function.arguments) == ("get_weather", '{"city": "Oslo"}')


def test_a_call_to_no_tool_of_the_request_is_content(client, branch):
    r = chat(client, logit_bias=branch["channel_call"])
    assert r.choices[0].message.content == '{"city": "Oslo"}' and r.choices[0].message.tool_calls is None


def test_history_with_reasoning_calls_and_results(server, client):
    """Earlier turns (reasoning, a call, its result, an answer) go back through the template
    (the prompt itself is checked against transformers in test_harmony) and are answered."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [
        {"role": "assistant", "content": None, "reasoning_content": "need it", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    ]
    r = chat(client, messages=history, tools=TOOLS)
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == ("plan", "ok")
    o = ollama.Client(host=server.url).chat(
        model=MODEL,
        messages=ASK
        + [
            {
                "role": "assistant",
                "content": "",
                "thinking": "need it",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": '{"temp": 21}'},
        ],
        tools=TOOLS,
        options={"temperature": 0},
    )
    assert (o.message.thinking, o.message.content) == ("plan", "ok")


@pytest.fixture(scope="module")
def call_server(tmp_path_factory):
    """A second model whose greedy reply is the preamble and the call (Ollama has no logit_bias)."""
    chain = ANSWER[: ANSWER.index(P("nel|>"))] + PREAMBLE_CALL
    path = write_scripted_harmony(tmp_path_factory.mktemp("harmony-call") / f"{MODEL}.gguf", [chain], TEMPLATE)
    with running(str(path), "--kv", "f16") as srv:
        yield srv


def test_ollama_calls_whole_and_streamed(call_server):
    c = ollama.Client(host=call_server.url)
    r = c.chat(model=MODEL, messages=ASK, tools=TOOLS, options={"temperature": 0})
    assert (r.message.thinking, r.message.content, r.done_reason) == ("plan", "Let me check.", "stop")
    assert [(t.function.name, dict(t.function.arguments)) for t in r.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    parts = list(c.chat(model=MODEL, messages=ASK, tools=TOOLS, options={"temperature": 0}, stream=True))
    calls = [t for p in parts for t in p.message.tool_calls or ()]
    assert [(t.function.name, dict(t.function.arguments)) for t in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(p.message.content for p in parts) == "Let me check."
    status, _, raw = request(
        call_server,
        "POST",
        "/api/chat",
        {"model": MODEL, "messages": ASK, "tools": TOOLS, "options": {"temperature": 0}},
    )
    records = ndjson_records(raw)
    assert status == 200 and records[-1]["done"] is True and records[-1]["done_reason"] == "stop"


# --- structured output, forced calls --------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes"]}}, "required": ["answer"]}


def test_structured_output_constrains_the_final_message_only(server, client):
    """The model writes its analysis freely ("plan"), then the final message is the JSON."""
    penalty = {"repeat_penalty": PENALTY}
    r = chat(
        client,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        extra_body=penalty,
    )
    m = r.choices[0].message
    assert (m.reasoning_content, json.loads(m.content), r.choices[0].finish_reason) == (
        "plan",
        {"answer": "yes"},
        "stop",
    )
    o = ollama.Client(host=server.url).chat(
        model=MODEL, messages=ASK, format=SCHEMA, options={"temperature": 0, **penalty}
    )
    assert (o.message.thinking, json.loads(o.message.content)) == ("plan", {"answer": "yes"})
    body = {"messages": ASK, "grammar": 'root ::= "yes" | "no"', **penalty}
    status, doc = post(server, "/v1/chat/completions", body)
    assert status == 200 and doc["choices"][0]["message"]["content"] in ("yes", "no")
    assert doc["choices"][0]["message"]["reasoning_content"] == "plan"


def test_forced_call(client):
    r = chat(client, tools=TOOLS, tool_choice="required", max_tokens=60, extra_body={"repeat_penalty": PENALTY})
    m = r.choices[0].message
    assert m.reasoning_content == "plan" and r.choices[0].finish_reason == "tool_calls"
    assert m.tool_calls[0].function.name == "get_weather"
    assert json.loads(m.tool_calls[0].function.arguments)["city"] in ("Paris", "Oslo")
