"""Anthropic's Messages API through the official `anthropic` SDK against a live `tightkv serve`:
the embedded Gemma 3 270M for text (whole, streamed, stop sequences, structured output, prefix
reuse, count_tokens, errors in Anthropic's shape), Qwen2.5-Coder-0.5B-Instruct for tools
(a tool_use, its tool_result fed back, streamed input_json_delta), and the scripted tiny
Qwen3 of test_server_reasoning for thinking blocks.

The SDK no longer takes temperature as an argument (Claude's newest models dropped it): the
tests send it in the body, as Anthropic's API documents it, through `extra_body`."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_chat_templates import QWEN3
from test_server_helpers import request, running, wait_idle
from tiny_gguf import write_scripted_qwen3

anthropic = pytest.importorskip("anthropic")
pydantic = pytest.importorskip("pydantic")

KEY = "anthropic-test-key"
GREEDY = {"extra_body": {"temperature": 0}}
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
SSE_EVENT = re.compile(rb"event: ([a-z_]+)\ndata: ([^\n]+)\n\n")


def client_of(server, timeout: float = 120):
    """The official client (x-api-key auth, no retries: a test sees every answer)."""
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=timeout)


def anthropic_events(raw: bytes) -> list[tuple[str, dict]]:
    """Parse Anthropic's SSE byte for byte: only `event: NAME\\ndata: <json>\\n\\n`, each
    event's data typed with its name."""
    pos, out = 0, []
    while pos < len(raw):
        m = SSE_EVENT.match(raw, pos)
        assert m, f"bad SSE framing at byte {pos}: {raw[pos : pos + 80]!r}"
        name, data = m.group(1).decode(), json.loads(m.group(2))
        assert data["type"] == name
        out.append((name, data))
        pos = m.end()
    return out


def check_block_order(events: list[tuple[str, dict]]) -> None:
    """message_start, ping, then blocks one at a time (start, deltas, stop; indices 0, 1, ...),
    then message_delta and message_stop."""
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    open_index, next_index = None, 0
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        else:
            assert name in ("content_block_delta", "content_block_stop") and data["index"] == open_index
            if name == "content_block_stop":
                open_index = None
    assert open_index is None


# --- Gemma: text -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    with running("--ctx", "2048", "--parallel", "2", api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


@pytest.fixture(scope="module")
def plain(client):
    """A greedy answer, and the same request again (its prompt then comes from the prefix store)."""
    ask = dict(model="gemma3", max_tokens=24, system="Answer briefly.", messages=COUNT, **GREEDY)
    return client.messages.create(**ask), client.messages.create(**ask)


def test_create_answers_a_message(plain):
    first, again = plain
    assert first.id.startswith("msg_") and first.type == "message" and first.role == "assistant"
    assert first.model == "gemma3:270m"
    (block,) = first.content
    assert block.type == "text" and block.text.strip()
    assert first.stop_reason in ("end_turn", "max_tokens") and first.stop_sequence is None
    assert first.usage.output_tokens > 0 and first.usage.cache_creation_input_tokens == 0
    # the second time the prompt is read from the prefix store: Anthropic counts it as cache reads
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == total
    assert again.usage.cache_read_input_tokens > first.usage.cache_read_input_tokens
    assert again.content[0].text == block.text


def test_stream_adds_up_to_the_message(client, plain):
    first, _ = plain
    with client.messages.stream(
        model="gemma3", max_tokens=24, system="Answer briefly.", messages=COUNT, **GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == first.content[0].text
    assert final.stop_reason == first.stop_reason and final.usage.output_tokens == first.usage.output_tokens
    assert final.id.startswith("msg_") and final.model == first.model


def test_stream_events_byte_for_byte(server, plain):
    body = {"model": "gemma3", "max_tokens": 24, "system": "Answer briefly.", "messages": COUNT}
    status, headers, raw = request(server, "POST", "/v1/messages", {**body, "stream": True, "temperature": 0})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = anthropic_events(raw)
    check_block_order(events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas) == plain[0].content[0].text
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": plain[0].stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == plain[0].usage.output_tokens


def test_one_engine_with_chat_completions(server, client):
    """A prompt a chat completion read is taken whole from the prefix store by the same
    conversation sent to /v1/messages; and two messages at once decode in one batch."""
    openai = pytest.importorskip("openai")
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    system, question = "You are a poet.", "Write a long poem about the sea."
    chat.chat.completions.create(
        model="gemma3",
        max_tokens=1,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
    )
    ask = {"model": "gemma3", "max_tokens": 16, "system": system, "messages": [{"role": "user", "content": question}]}
    r = client.messages.create(**ask, **GREEDY)
    assert r.usage.input_tokens == 0 and r.usage.cache_read_input_tokens > 10

    before = wait_idle(server)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: client.messages.create(**ask, **GREEDY), range(2)))
    after = wait_idle(server)
    assert [b.content[0].text for b in both] == [r.content[0].text] * 2 and r.usage.output_tokens == 16
    steps = after["decode_steps_total"] - before["decode_steps_total"]
    rows = after["decode_rows_total"] - before["decode_rows_total"]
    assert rows > steps  # some steps carried both replies


def test_max_tokens_and_stop_sequences(client, plain):
    cut = client.messages.create(model="gemma3", max_tokens=2, messages=COUNT, **GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    text = plain[0].content[0].text
    word = text.split()[1]  # a word the greedy answer writes
    stopped = client.messages.create(
        model="gemma3", max_tokens=24, system="Answer briefly.", messages=COUNT, stop_sequences=[word], **GREEDY
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[: text.index(word)]


def test_structured_output_with_parse(client):
    class Capital(pydantic.BaseModel):
        city: str

    r = client.messages.parse(
        model="gemma3",
        max_tokens=40,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        output_format=Capital,
        **GREEDY,
    )
    assert r.stop_reason == "end_turn" and isinstance(r.parsed_output, Capital) and r.parsed_output.city


def test_count_tokens_is_the_prompt(client, plain):
    counted = client.messages.count_tokens(model="gemma3", system="Answer briefly.", messages=COUNT)
    usage = plain[0].usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens
    bare = client.messages.count_tokens(model="gemma3", messages=COUNT)
    assert 0 < bare.input_tokens < counted.input_tokens
    # a prompt over the context (2048) is counted, and refused by messages.create
    long = [{"role": "user", "content": "the sea " * 1500}]
    assert client.messages.count_tokens(model="gemma3", messages=long).input_tokens > 3000
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="gemma3", max_tokens=8, messages=long)
    assert err.value.body["error"]["type"] == "invalid_request_error" and "context" in err.value.message


@pytest.mark.parametrize(
    "body, where",
    [
        ({"model": "gemma3", "messages": COUNT}, "'max_tokens': is required"),
        ({"model": "gemma3", "max_tokens": 8, "messages": []}, "'messages'"),
        ({"model": "gemma3", "max_tokens": 8, "messages": COUNT, "temperature": 1.5}, "'temperature'"),
        ({"model": "gemma3", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "'messages.0.role'"),
        (
            {
                "model": "gemma3",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
            },
            "'messages.0.content.0': image blocks are not supported",
        ),
        (
            {"model": "gemma3", "max_tokens": 8, "messages": COUNT, "tool_choice": {"type": "any"}},
            "'tool_choice' any needs 'tools'",
        ),
        (
            {
                "model": "gemma3",
                "max_tokens": 8,
                "messages": COUNT,
                "thinking": {"type": "enabled", "budget_tokens": 9},
            },
            "'thinking.budget_tokens' must be at least 1024",
        ),
        (
            {"model": "gemma3", "max_tokens": 8, "messages": COUNT, "stop_sequences": [" "]},
            "'stop_sequences.0' must contain non-whitespace",
        ),
        (
            {"model": "gemma3", "max_tokens": 8, "messages": COUNT, "tools": [{"name": "f", "input_schema": {}}]},
            "'tools.0.input_schema' must be a JSON schema of type object",
        ),
    ],
)
def test_bad_bodies_are_anthropic_400s(client, body, where):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.post("/v1/messages", cast_to=object, body=body)
    assert err.value.status_code == 400
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert where in err.value.body["error"]["message"] and "\n" not in err.value.body["error"]["message"]


def test_every_route_answers_in_anthropic_shape(server, client):
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=COUNT)
    assert err.value.body["error"]["type"] == "not_found_error" and "claude-sonnet-4-5" in err.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=COUNT)
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.count_tokens(
            model="gemma3", messages=COUNT
        )
    assert err.value.body["error"]["type"] == "authentication_error"
    for method, path, body, status in [
        ("POST", "/v1/messages", b"{not json", 400),
        ("POST", "/v1/messages/count_tokens", b"[]", 400),
        ("GET", "/v1/messages", None, 405),
        ("POST", "/v1/messages/batches", {}, 404),
    ]:
        got, _, raw = request(server, method, path, body)
        answer = json.loads(raw)
        assert got == status and answer["type"] == "error" and set(answer["error"]) == {"type", "message"}, answer


def test_fuzzed_bodies_never_5xx(server):
    """A seeded fuzz over the fields of both routes: every answer is a 200 or a 4xx in
    Anthropic's shape, and the server stays healthy."""
    rng = random.Random(54)
    block = {"type": "text", "text": "hi"}
    values = [None, True, 0, -1, 1, 2, 0.5, 1e308, "", "x", [], {}, [1], ["a"], {"a": 1}, "gemma3", 10**20]
    values += [
        [block],
        [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        [{"type": "tool_result", "tool_use_id": "t", "content": [block]}],
        [{"role": "user", "content": [block, {"type": "thinking", "thinking": "x"}]}],
        [{"role": "assistant", "content": "x"}],
        [{"name": "f", "input_schema": {"type": "object"}}],
        {"type": "enabled", "budget_tokens": 1024},
        {"type": "tool", "name": "f"},
        {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        {"format": {"type": "json_schema", "schema": {"type": 5}}},
    ]
    fields = ["model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k"]
    fields += ["stream", "tools", "tool_choice", "thinking", "metadata", "output_config"]
    seen = set()
    for i in range(80):
        body = {"model": "gemma3", "messages": COUNT, "max_tokens": 2}
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(fields)] = rng.choice(values)
        if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
            body["max_tokens"] = min(body["max_tokens"], 2)  # keep valid requests short
        path = "/v1/messages" if i % 3 else "/v1/messages/count_tokens"
        status, _, raw = request(server, "POST", path, body, timeout=60)
        assert status in (200, 400, 404), (path, body, status, raw[:300])
        seen.add(status)
        if status != 200:
            answer = json.loads(raw)
            assert answer["type"] == "error" and answer["error"]["type"] in ("invalid_request_error", "not_found_error")
    assert seen >= {200, 400} and request(server, "GET", "/health")[0] == 200


# --- a model's Modelfile defaults -----------------------------------------------------------
TERSE = "You are terse. Answer in three words."


@pytest.fixture(scope="module")
def terse_client(tmp_path_factory):
    """`tightkv serve gemma-terse`, a name `tightkv create` made over the embedded GGUF in a
    store of its own: PARAMETER temperature 0 and a SYSTEM prompt."""
    from tightkv.registry import embedded_path

    home = tmp_path_factory.mktemp("store")
    kernels = Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv") / "kernels"
    if kernels.is_dir():
        (home / "kernels").symlink_to(kernels)
    modelfile = home / "Modelfile"
    modelfile.write_text(f'FROM {embedded_path()}\nPARAMETER temperature 0\nSYSTEM """{TERSE}"""\n')
    env = {**os.environ, "TIGHTKV_HOME": str(home)}
    made = subprocess.run(
        [sys.executable, "-m", "tightkv.cli", "create", "gemma-terse", "-f", str(modelfile)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    with running("gemma-terse", "--ctx", "1024", api_key=KEY, env={"TIGHTKV_HOME": str(home)}) as srv:
        yield client_of(srv)


def test_modelfile_defaults_apply_and_the_request_wins(terse_client):
    c = terse_client
    count = c.messages.count_tokens
    assert count(model="gemma-terse", messages=COUNT).input_tokens == (
        count(model="gemma-terse", system=TERSE, messages=COUNT).input_tokens
    )  # the model's SYSTEM where the request has none
    assert count(model="gemma-terse", system="Hi.", messages=COUNT).input_tokens < (
        count(model="gemma-terse", messages=COUNT).input_tokens
    )
    # PARAMETER temperature 0: greedy without asking, as greedy as asking for it
    ask = {"model": "gemma-terse", "max_tokens": 12, "messages": COUNT}
    assert c.messages.create(**ask).content == c.messages.create(**ask, **GREEDY).content


# --- Qwen2.5-Coder: tools ------------------------------------------------------------------
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "additionalProperties": False,
        "required": ["city", "unit"],
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    },
}
TIME = {
    "name": "get_time",
    "description": "The local time in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m"  # the served id: the GGUF's name


@pytest.fixture(scope="module")
def qwen_client():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    with running(str(qwen_path()), "--ctx", "2048", "--parallel", "1", api_key=KEY, timeout=300) as srv:
        yield client_of(srv, timeout=300)


@pytest.mark.slow
def test_tool_use_then_its_result_answered(qwen_client):
    jsonschema = pytest.importorskip("jsonschema")
    r = qwen_client.messages.create(
        model=QWEN,
        max_tokens=80,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_weather"},
        **GREEDY,
    )
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert "paris" in call.input["city"].lower()

    result = {"type": "tool_result", "tool_use_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}
    history = ASK + [{"role": "assistant", "content": r.content}, {"role": "user", "content": [result]}]
    # the 0.5B model, left to choose, calls the tool again: "none" asks for the answer
    answer = qwen_client.messages.create(
        model=QWEN, max_tokens=60, messages=history, tools=[WEATHER, TIME], tool_choice={"type": "none"}, **GREEDY
    )
    assert answer.stop_reason == "end_turn" and [b.type for b in answer.content] == ["text"]
    assert "21" in answer.content[0].text
    with_tools = qwen_client.messages.count_tokens(model=QWEN, messages=history, tools=[WEATHER, TIME])
    without = qwen_client.messages.count_tokens(model=QWEN, messages=history)
    assert with_tools.input_tokens > without.input_tokens > 0


@pytest.mark.slow
def test_tool_use_streamed_as_input_json_deltas(qwen_client):
    kinds, parts = [], []
    with qwen_client.messages.stream(
        model=QWEN,
        max_tokens=80,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **GREEDY,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                parts.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (call,) = final.content
    assert call.type == "tool_use" and call.name in ("get_weather", "get_time") and call.id.startswith("toolu_")
    assert len(parts) >= 3 and json.loads("".join(parts)) == call.input  # the arguments come in fragments
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]  # the SDK drops pings


# --- a model that thinks ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    chain = ["Ċ", "<th", "ink>", "pl", "an", "</", "think>", "ok", "<|im_end|>"]
    path = write_scripted_qwen3(
        tmp_path_factory.mktemp("think") / "tiny-think.gguf", chain, QWEN3, extra_tokens=("<th", "ink>", "</", "think>")
    )
    with running(str(path), "--kv", "f16", api_key=KEY) as srv:
        yield srv


def test_thinking_blocks_whole_and_streamed(think_server):
    c = client_of(think_server)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    ask = {"model": "tiny-think", "max_tokens": 2048, "messages": [{"role": "user", "content": "hello"}]}
    r = c.messages.create(thinking=thinking, **ask, **GREEDY)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in r.content] == [
        ("thinking", "plan"),
        ("text", "ok"),
    ]
    assert r.content[0].signature == "" and r.stop_reason == "end_turn"
    status, _, raw = request(
        think_server,
        "POST",
        "/v1/messages",
        {**ask, "temperature": 0, "stream": True, "thinking": thinking},
    )
    assert status == 200
    events = anthropic_events(raw)
    check_block_order(events)
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta"]
    off = c.messages.create(thinking={"type": "disabled"}, **ask, **GREEDY)
    # Qwen3's empty block rendered (enable_thinking false): the reply is left alone
    assert [(b.type, b.text) for b in off.content] == [("text", "<think>plan</think>ok")]
