"""Tools through the official `openai` and `ollama` clients against a live `tightkv serve` of
the real Qwen2.5-Coder-0.5B-Instruct (its chat template takes tools, Hermes-style
``<tool_call>``): a named call with valid arguments, the tool's result answered, streamed
deltas, tool_choice none and auto. The model is assembled from PyPI (bench/qwen_model.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_server_helpers import openai_client, post, running

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def qwen() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    return qwen_path()


@pytest.fixture(scope="module")
def server(qwen):
    with running(str(qwen), "--ctx", "2048", "--parallel", "1", timeout=300) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, timeout=300)


def model_id(client) -> str:
    return client.models.list().data[0].id


def test_named_call_then_the_result_answered(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=model_id(client), messages=ASK, tools=[WEATHER, TIME], tool_choice=named, temperature=0, max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert "paris" in args["city"].lower()

    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    # the 0.5B model, left to choose, calls the tool again: "none" asks for the answer
    answer = client.chat.completions.create(
        model=model_id(client),
        messages=history,
        tools=[WEATHER, TIME],
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls
    assert "21" in text


def test_required_call_streamed_as_fragments(client):
    """OpenAI's stream of a call: a first delta with id, type, name and empty arguments, then
    the arguments in fragments as the model writes them; the client's own accumulation
    (`chat.completions.stream`) puts the call back together."""
    parts = list(
        client.chat.completions.create(
            model=model_id(client),
            messages=ASK,
            tools=[WEATHER, TIME],
            tool_choice="required",
            temperature=0,
            max_tokens=80,
            stream=True,
            parallel_tool_calls=False,
        )
    )
    deltas = [d for p in parts if p.choices for d in (p.choices[0].delta.tool_calls or [])]
    assert parts[-1].choices[0].finish_reason == "tool_calls"
    first, *rest = deltas
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name in ("get_weather", "get_time") and first.function.arguments == ""
    assert len(rest) >= 3  # the arguments come in fragments
    assert all(d.index == 0 and d.id is None and d.function.name is None and d.function.arguments for d in rest)
    arguments = "".join(d.function.arguments for d in rest)
    assert isinstance(json.loads(arguments), dict)

    whole = client.chat.completions.create(
        model=model_id(client),
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=0,
        max_tokens=80,
        parallel_tool_calls=False,
    )
    (call,) = whole.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (first.function.name, arguments)

    with client.chat.completions.stream(
        model=model_id(client),
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=0,
        max_tokens=80,
        parallel_tool_calls=False,
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events and "tool_calls.function.arguments.done" in events
    (got,) = final.choices[0].message.tool_calls
    assert (got.function.name, got.function.arguments) == (call.function.name, call.function.arguments)
    assert final.choices[0].finish_reason == "tool_calls"


def test_auto_and_none(client):
    r = client.chat.completions.create(
        model=model_id(client), messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80
    )
    calls = r.choices[0].message.tool_calls or []
    assert all(c.function.name == "get_weather" for c in calls)  # the model chooses; what it calls parses
    r = client.chat.completions.create(
        model=model_id(client), messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8
    )
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")


def test_bad_tools_are_400s(server, client):
    for extra in (
        {"tools": [{"type": "function"}]},
        {"tools": [WEATHER], "tool_choice": "sometimes"},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    ):
        body = {"messages": ASK, "max_tokens": 4, **extra}
        status, doc = post(server, "/v1/chat/completions", body)
        assert status == 400 and doc["error"]["message"], (extra, doc)


def test_ollama_tools(server, client):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=server.url)
    r = c.chat(model=model_id(client), messages=ASK, tools=[WEATHER], options={"temperature": 0, "num_predict": 80})
    for call in r.message.tool_calls or []:
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    assert "tools" in c.show(model_id(client)).capabilities


def test_empty_prompt_without_bos_is_a_400(server):
    """Fuzz finding: Qwen adds no BOS, so an empty prompt left nothing to predict from (a 500)."""
    status, doc = post(server, "/v1/completions", {"prompt": "", "max_tokens": 2})
    assert status == 400 and "nothing to predict from" in doc["error"]["message"]


def test_langchain_bind_tools_and_structured_output(client):
    """LangChain's agents start with bind_tools; with_structured_output's function_calling mode
    is a named tool call under the hood."""
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    llm = lc.ChatOpenAI(
        base_url=str(client.base_url), api_key="unused", model=model_id(client), temperature=0, max_tokens=80
    )
    msg = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke(ASK[0]["content"])
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()
    jsonschema.validate(call["args"], WEATHER["function"]["parameters"])

    class Weather(BaseModel):
        city: str
        unit: str

    got = llm.with_structured_output(Weather, method="function_calling").invoke(ASK[0]["content"])
    assert isinstance(got, Weather) and "paris" in got.city.lower()


def test_langchain_structured_output_default_nested(client):
    """#54 point 5: LangChain's default with_structured_output (json_schema, strict) of a nested
    model. Qwen opens its JSON with "{\n"; a grammar that forced '{"' sent it rambling inside the
    first string until max_tokens (LengthFinishReasonError); bounded whitespace admits it."""
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    class Punchline(BaseModel):
        text: str

    class Joke(BaseModel):
        setup: str
        punchline: Punchline

    llm = lc.ChatOpenAI(
        base_url=str(client.base_url), api_key="unused", model=model_id(client), temperature=0, max_tokens=100
    )
    # (about cats, Qwen's greedy setup at 0.5B loops until max_tokens since the k-quant dots took
    # Q8_K-style activations: the grammar is what is tested here, not the joke)
    got = llm.with_structured_output(Joke, include_raw=True).invoke("Tell me a joke about programmers.")
    assert got["parsing_error"] is None and isinstance(got["parsed"], Joke) and got["parsed"].punchline.text
    assert got["raw"].content.startswith("{\n")  # the model's own first token, admitted


def test_required_call_takes_only_the_schemas_keys(client):
    """#54 point 6: asked about three cities with one call forced, the model once wrote
    {"city": "Paris", "city2": "Rome", "city3": "Oslo"}: a tool's parameters are closed like a
    response format's schema (its own additionalProperties would stand)."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    r = client.chat.completions.create(
        model=model_id(client),
        messages=[{"role": "user", "content": "What is the weather in Paris, Rome and Oslo?"}],
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    (call,) = r.choices[0].message.tool_calls
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_langchain_ollama_bind_tools(server, client):
    lc = pytest.importorskip("langchain_ollama")
    llm = lc.ChatOllama(base_url=server.url, model=model_id(client), temperature=0, num_predict=80)
    msg = llm.bind_tools([WEATHER]).invoke(ASK[0]["content"])
    for call in msg.tool_calls:  # the model chooses (Ollama has no tool_choice); what it calls parses
        assert call["name"] == "get_weather" and isinstance(call["args"], dict)


def test_langchain_streamed_call_chunks_merge(client):
    """LangChain merges streamed tool-call chunks by index (name from the first, arguments
    concatenated): the merged message holds the call with valid arguments."""
    import functools
    import operator

    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(
        base_url=str(client.base_url), api_key="unused", model=model_id(client), temperature=0, max_tokens=80
    )
    chunks = list(llm.bind_tools([WEATHER], tool_choice="get_weather").stream(ASK[0]["content"]))
    assert sum(1 for c in chunks if c.tool_call_chunks) >= 3
    merged = functools.reduce(operator.add, chunks)
    (call,) = merged.tool_calls
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()
    jsonschema.validate(call["args"], WEATHER["function"]["parameters"])


def test_ollama_streamed_calls_match_the_whole_reply(server, client):
    """Ollama streams each call once complete (arguments as an object); the stream adds up to
    the whole answer."""
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": 80}
    whole = c.chat(model=model_id(client), messages=ASK, tools=[WEATHER, TIME], options=options)
    parts = list(c.chat(model=model_id(client), messages=ASK, tools=[WEATHER, TIME], options=options, stream=True))
    calls = [(t.function.name, dict(t.function.arguments)) for p in parts for t in p.message.tool_calls or []]
    assert calls == [(t.function.name, dict(t.function.arguments)) for t in whole.message.tool_calls or []]
    assert "".join(p.message.content for p in parts) == whole.message.content


def test_assistant_message_last_is_continued(server, client, qwen):
    """An assistant message last is continued as llama.cpp's server does: the conversation
    before it with the generation prompt, then its content as written, no end of turn."""
    from tightkv import Model

    history = [
        {"role": "user", "content": "Write a Python function that adds two numbers."},
        {"role": "assistant", "content": "```python\ndef add("},
    ]
    m = Model(str(qwen), kv="kvarn4")
    text = m.chat_text(history[:1]) + history[1]["content"]
    assert m.chat_text(history) == text and text.endswith("<|im_start|>assistant\n```python\ndef add(")
    ids = m.chat_tokens(text)
    want = m.generate(ids, max_tokens=8, stop=m.chat_stops()).text
    r = client.chat.completions.create(model=model_id(client), messages=history, temperature=0, max_tokens=8)
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == want
    assert "a" in want and "<|im_start|>" not in want  # the signature goes on: no new turn
    o = (
        pytest.importorskip("ollama")
        .Client(host=server.url)
        .chat(
            model=model_id(client),
            messages=history,
            options={"temperature": 0, "num_predict": 8, "repeat_penalty": 1.0},
        )
    )
    assert o.message.content == want and o.prompt_eval_count <= len(ids)
    vllm = client.chat.completions.create(
        model=model_id(client),
        messages=history,
        temperature=0,
        max_tokens=8,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert vllm.choices[0].message.content == want
