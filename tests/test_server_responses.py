"""OpenAI's Responses API (/v1/responses) through the official `openai` client, with its
strict response validation (every answer and stream event checked against the client's own
types), against live `tightkv serve`s: the embedded Gemma 3 270M (text, streamed events,
chaining and stored responses, structured output, input_tokens, errors), a tiny scripted
Qwen3 that thinks (reasoning items), and Qwen2.5-Coder-0.5B-Instruct (function calls and
their outputs fed back, and one tool-using turn of the OpenAI Agents SDK)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import BaseModel
from test_chat_templates import QWEN3
from test_server_helpers import post, request, running, wait_idle
from tiny_gguf import write_scripted_qwen3

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

ROUTE = "/v1/responses"
ASK = "Name three colours."


def strict_client(server, timeout: float = 120):
    """The official client, validating every answer against its types (no retries)."""
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout, _strict_response_validation=True
    )


@pytest.fixture(scope="module")
def gemma():
    with running("--ctx", "2048", "--parallel", "2", "--max-queue", "2") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(gemma):
    return strict_client(gemma)


def model_id(client) -> str:
    return client.models.list().data[0].id


def sse_blocks(raw: bytes) -> list[dict]:
    """A Responses stream, framed as OpenAI frames it: `event: TYPE` then `data: {...}` with the
    same type, blocks apart by a blank line, no [DONE]. Returns the events."""
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}" and data.startswith("data: ")
        events.append(event)
    assert raw.endswith(b"\n\n")
    return events


# --- the conversion, without a model --------------------------------------------------------------------
TEXT_THEN_CALL = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("cut", [1, 3, 7, len(TEXT_THEN_CALL)])
def test_output_events_of_a_reply_in_pieces(cut):
    """A message then a call, fed in pieces of every size: the same items, and events the
    client's own types accept, adding up to them."""
    from pydantic import TypeAdapter

    from tightkv.server.replies import Reply
    from tightkv.server.responses import Output

    reply = Reply({"get_weather"})
    output = Output(reply)
    events = []
    for i in range(0, len(TEXT_THEN_CALL), cut):
        events += output.add(reply.feed(TEXT_THEN_CALL[i : i + cut]))
    events += output.add(reply.finish()) + output.close("completed")
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for seq, event in enumerate(events):
        adapter.validate_python({**event, "sequence_number": seq})
    message, call = output.items
    assert message["content"][0]["text"] == "Let me look." and message["status"] == "completed"
    assert (call["name"], call["arguments"], call["status"]) == ("get_weather", '{"city": "Paris"}', "completed")
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == call["arguments"] and call["call_id"] == reply.calls[0].id
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]


def test_input_items_become_chat_messages():
    """Output items fed back join one assistant message; a call's output is a tool message
    naming the tool; a stored conversation is not changed by what follows it."""
    from tightkv.server.responses import input_messages

    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "use the tool"}]}
    stored = input_messages([{"role": "user", "content": "Weather in Paris?"}, thought])
    before = json.loads(json.dumps(stored))
    items = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "21 C"}]},
        {"role": "developer", "content": "Answer briefly."},
    ]
    assert input_messages(items, stored) == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C", "name": "get_weather"},
        {"role": "system", "content": "Answer briefly."},
    ]
    assert stored == before


# --- text -------------------------------------------------------------------------------------------
def test_text_as_chat_completions_answer_it(client):
    """The same conversation through both APIs: the same greedy text and token counts."""
    kw = {"temperature": 0, "model": model_id(client)}
    r = client.responses.create(
        input=ASK, instructions="Answer briefly.", max_output_tokens=24, metadata={"run": "a"}, **kw
    )
    chat = client.chat.completions.create(
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": ASK}],
        max_tokens=24,
        **kw,
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.metadata == {"run": "a"}
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert r.output_text == chat.choices[0].message.content and r.output_text.strip()
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert chat.usage.prompt_tokens_details.cached_tokens == u.input_tokens  # the prompt the response stored
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens_details.reasoning_tokens == 0
    finished = chat.choices[0].finish_reason
    assert (r.status, item.status) == (("completed",) * 2 if finished == "stop" else ("incomplete",) * 2)
    count = client.responses.input_tokens.count(input=ASK, instructions="Answer briefly.", model=kw["model"])
    assert count.object == "response.input_tokens" and count.input_tokens == u.input_tokens


def test_cut_by_length_is_incomplete(client):
    r = client.responses.create(input="Count from one to fifty.", max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete" and r.completed_at is None


def test_stream_events_add_up_to_the_whole_answer(gemma, client):
    kw = {"input": ASK, "max_output_tokens": 16, "temperature": 0}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 2 and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    created, last = events[0].response, events[-1].response
    assert events[2].item.content == [] and events[3].part.text == ""  # as they were when added
    assert created.status == "in_progress" and created.output == [] and created.id == last.id
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == last.output_text == whole.output_text
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")} | {events[2].item.id, events[-2].item.id}
    assert item_ids == {last.output[0].id}
    assert (last.usage.input_tokens, last.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)
    status, headers, raw = request(gemma, "POST", ROUTE, {**kw, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert [e["type"] for e in sse_blocks(raw)] == kinds


def test_the_client_stream_helper(client):
    with client.responses.stream(model=model_id(client), input="Say hello.", max_output_tokens=40, temperature=0) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == text


def test_two_responses_decode_in_one_batch(gemma, client):
    """A whole response and a streamed one at once share decode steps, and each answers
    as it does alone."""
    kw = {"input": "Count from one to fifty.", "max_output_tokens": 16, "temperature": 0}
    alone = client.responses.create(**kw)

    def streamed():
        return "".join(e.delta for e in client.responses.create(stream=True, **kw) if e.type.endswith("text.delta"))

    before = wait_idle(gemma)
    with ThreadPoolExecutor(2) as pool:
        whole, text = pool.submit(client.responses.create, **kw), pool.submit(streamed)
        both = [whole.result().output_text, text.result()]
    after = wait_idle(gemma)
    assert both == [alone.output_text] * 2 and alone.usage.output_tokens == 16
    steps = after["decode_steps_total"] - before["decode_steps_total"]
    assert after["decode_rows_total"] - before["decode_rows_total"] > steps  # some steps carried both


# --- stored responses and chaining -------------------------------------------------------------------------
def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(input="My name is Ada. Say hi.", max_output_tokens=12, temperature=0)
    second = client.responses.create(
        input="What is my name?", previous_response_id=first.id, max_output_tokens=12, temperature=0
    )
    assert second.previous_response_id == first.id and "Ada" in second.output_text
    u1, u2 = first.usage, second.usage
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
    again = client.responses.retrieve(first.id)
    assert again.model_dump() == first.model_dump()
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError) as lost:
        client.responses.retrieve(first.id)
    assert lost.value.body["code"] == "response_not_found"
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(input="And?", previous_response_id=first.id, max_output_tokens=4)
    assert gone.value.body["param"] == "previous_response_id"
    assert gone.value.body["code"] == "previous_response_not_found"


def test_store_false_keeps_nothing(client):
    r = client.responses.create(input="Hi.", max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


# --- structured output -------------------------------------------------------------------------------------
class City(BaseModel):
    name: str
    population: int


def test_text_format_json_schema(client):
    r = client.responses.parse(
        model=model_id(client),
        input="Give the capital of France as JSON with its population.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed" and isinstance(r.output_parsed, City)
    assert r.text.format.type == "json_schema" and r.text.format.name == "City"
    loose = client.responses.create(  # ("...with a key 'ok'." alone: a password of digits past 60 tokens)
        input="A JSON object with a key 'ok' set to true.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    assert loose.status == "completed" and isinstance(json.loads(loose.output_text), dict)


# --- errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 5}, "input"),
        ({"input": "x", "temperature": 5}, "temperature"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input.0.content.0"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input.0.name"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
        ({"input": []}, "input"),
    ],
)
def test_bad_bodies_are_400s_in_openai_shape(gemma, body, param):
    status, doc = post(gemma, ROUTE, body)
    assert status == 400 and set(doc["error"]) == {"message", "type", "param", "code"}, doc
    assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["param"] == param, doc
    assert "\n" not in doc["error"]["message"]


def test_errors_through_the_client(gemma, client):
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="no-such-model", input="x")
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.input_tokens.count(input="x", tool_choice="required")
    status, _, raw = request(gemma, "POST", ROUTE, b"{not json")
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_fuzzed_bodies_never_5xx(gemma):
    """A seeded fuzz over the fields and input items of both POST routes: every answer is a
    200 or a 4xx in OpenAI's shape, and the server stays healthy."""
    rng = random.Random(54)
    text = {"type": "input_text", "text": "hi"}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    items = [
        {"role": "user", "content": [text]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
        {"role": "developer", "content": "be brief"},
        {"role": "tool", "content": "x"},
        call,
        dict(call, arguments="{not json"),
        {"type": "function_call_output", "call_id": "c1", "output": "21"},
        {"type": "function_call_output", "call_id": "c1", "output": [text, 5]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
        {"type": "reasoning", "content": "t"},
        {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
        {"type": "item_reference", "id": "x"},
        "hi",
        5,
    ]
    values = [None, True, 0, -1, 1, 2, 0.5, 1e308, "", "x", [], {}, [1], ["a"], {"a": 1}, 10**20, "gemma3"]
    values += [
        [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        [{"type": "function", "name": "f", "parameters": {"type": 5}}],
        [{"type": "function", "name": 5}],
        [{"type": "file_search"}],
        "required",
        "none",
        {"type": "function", "name": "f"},
        {"type": "function"},
        {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        {"format": {"type": "json_schema", "schema": {"type": 5}}},
        {"format": {"type": "json_object"}},
        {"format": "json"},
        {"effort": "low"},
        {"effort": 5},
        "resp_nope",
        {"k": "v"},
    ]
    fields = ["model", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "text"]
    fields += ["reasoning", "stream", "store", "metadata", "parallel_tool_calls", "previous_response_id", "truncation"]
    seen = set()
    for i in range(80):
        body = {"input": [rng.choice(items) for _ in range(rng.randint(1, 3))] if i % 2 else "hi"}
        body["max_output_tokens"] = 2
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(fields + ["input"])] = rng.choice(values)
        if isinstance(body.get("max_output_tokens"), int) and not isinstance(body["max_output_tokens"], bool):
            body["max_output_tokens"] = min(body["max_output_tokens"], 2)  # keep valid requests short
        path = ROUTE if i % 3 else ROUTE + "/input_tokens"
        status, _, raw = request(gemma, "POST", path, body, timeout=60)
        assert status in (200, 400, 404), (path, body, status, raw[:300])
        seen.add(status)
        if status != 200:
            error = json.loads(raw)["error"]
            assert error["type"] in ("invalid_request_error", "not_found_error") and "\n" not in error["message"]
    assert seen >= {200, 400} and request(gemma, "GET", "/health")[0] == 200


# --- reasoning: a scripted Qwen3 that thinks --------------------------------------------------------------
THINKS = ["Ċ", "<th", "ink>", "pl", "an", "</", "think>", "ok", "<|im_end|>"]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    path = write_scripted_qwen3(
        tmp_path_factory.mktemp("think") / "tiny-think.gguf",
        THINKS,
        QWEN3,
        extra_tokens=("<th", "ink>", "</", "think>"),
    )
    with running(str(path), "--kv", "f16") as srv:
        yield strict_client(srv)


def test_reasoning_items(thinker):
    r = thinker.responses.create(input="hello", max_output_tokens=12, temperature=0)
    reasoning, message = r.output
    assert message.type == "message" and message.content[0].text == "ok"
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "plan" and reasoning.id.startswith("rs_")
    assert r.output_text == "ok" and r.usage.output_tokens == 7
    assert r.usage.output_tokens_details.reasoning_tokens == 2  # "pl", "an"
    events = list(thinker.responses.create(input="hello", max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events if not e.type.endswith(".delta")]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.delta for e in events if e.type == "response.reasoning_text.delta"] == ["pl", "an"]
    assert events[-1].response.output[0].content[0].text == "plan"
    off = thinker.responses.create(input="hello", max_output_tokens=12, temperature=0, reasoning={"effort": "none"})
    assert [i.type for i in off.output] == ["message"] and off.output_text == "<think>plan</think>ok"
    # the reasoning item fed back with the message: the conversation goes on
    more = thinker.responses.create(input=[*r.output, {"role": "user", "content": "again"}], max_output_tokens=12)
    assert more.output_text == "ok"


# --- reasoning: a scripted harmony (gpt-oss) model ------------------------------------------------------
@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    from scripted_harmony import gpt_oss_template, write_scripted_harmony
    from test_server_harmony import ANSWER

    template = gpt_oss_template()
    if template is None:
        pytest.skip("llama.cpp's gpt-oss template is not on this machine")
    path = write_scripted_harmony(tmp_path_factory.mktemp("harmony") / "tiny-harmony.gguf", [ANSWER], template)
    with running(str(path), "--kv", "f16") as srv:
        yield strict_client(srv)


def test_harmony_analysis_is_a_reasoning_item(harmony):
    """gpt-oss's analysis channel is the reasoning item, its final channel the message, at
    every effort (the template's reasoning_effort; none and minimal are low there)."""
    for effort in ("low", "medium", "high", "minimal", "none"):
        r = harmony.responses.create(input="Weather in Paris?", reasoning={"effort": effort}, max_output_tokens=40)
        assert [(i.type, (i.content[0].text)) for i in r.output] == [("reasoning", "plan"), ("message", "ok")], effort
        assert r.reasoning.effort == effort and r.usage.output_tokens_details.reasoning_tokens >= 1


# --- tools: Qwen2.5-Coder ------------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "additionalProperties": False,
        "required": ["city"],
        "properties": {"city": {"type": "string"}},
    },
    "strict": True,
}
WEATHER_ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def qwen():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    with running(str(qwen_path()), "--ctx", "2048", "--parallel", "1", timeout=300) as srv:
        yield srv


@pytest.fixture(scope="module")
def coder(qwen):
    return strict_client(qwen, timeout=300)


@pytest.mark.slow
def test_function_call_and_its_output_fed_back(coder):
    kw = {"model": model_id(coder), "temperature": 0, "max_output_tokens": 60}
    r = coder.responses.create(
        input=WEATHER_ASK, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, **kw
    )
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    args = json.loads(call.arguments)
    jsonschema.validate(args, WEATHER["parameters"])
    assert "paris" in args["city"].lower() and r.status == "completed"

    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21}'}
    # the 0.5B model, left to choose, calls the tool again: "none" asks for the answer
    kw |= {"tools": [WEATHER], "tool_choice": "none"}
    answer = coder.responses.create(input=[{"role": "user", "content": WEATHER_ASK}, *r.output, result], **kw)
    assert [i.type for i in answer.output] == ["message"] and "21" in answer.output_text
    chained = coder.responses.create(input=[result], previous_response_id=r.id, **kw)
    assert chained.output_text == answer.output_text
    assert chained.usage.input_tokens == answer.usage.input_tokens
    # the same prompt again: all of it from the prefix store
    assert chained.usage.input_tokens_details.cached_tokens == chained.usage.input_tokens


@pytest.mark.slow
def test_function_call_streamed(coder):
    events = list(
        coder.responses.create(
            model=model_id(coder),
            input=WEATHER_ASK,
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,
            max_output_tokens=60,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    added, done, final = events[2].item, events[-2].item, events[-1].response
    assert added.type == "function_call" and added.arguments == "" and added.status == "in_progress"
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments == done.arguments == final.output[0].arguments
    assert (added.id, added.call_id) == (done.id, done.call_id) and done.status == "completed"
    assert "paris" in json.loads(arguments)["city"].lower()


@pytest.mark.slow
def test_openai_agents_sdk_runs_a_tool_using_turn(qwen):
    """The Agents SDK's Responses model on our server, streamed: the agent calls the tool
    (required), reads its result, and answers with it (the 0.5B model, left to choose,
    calls the tool again: a hook asks for the answer, tool_choice none, as the chat tests do)."""
    pytest.importorskip("agents")
    from agents import (
        Agent,
        AgentHooks,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"Sunny and 21 degrees Celsius in {city}."

    class AnswerAfterTheTool(AgentHooks):
        async def on_tool_end(self, context, agent, tool, result):
            agent.model_settings = agent.model_settings.resolve(ModelSettings(tool_choice="none"))

    async def turn():
        client = openai.AsyncOpenAI(base_url=qwen.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        agent = Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            model=OpenAIResponsesModel(model=(await client.models.list()).data[0].id, openai_client=client),
            tools=[get_weather],
            model_settings=ModelSettings(
                temperature=0, max_tokens=60, tool_choice="required", parallel_tool_calls=False
            ),
            hooks=AnswerAfterTheTool(),
            reset_tool_choice=False,
        )
        run = Runner.run_streamed(agent, WEATHER_ASK, max_turns=3)
        items = [e.item.type async for e in run.stream_events() if e.type == "run_item_stream_event"]
        return run, items

    run, items = asyncio.run(turn())
    assert items == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert [c.lower() for c in asked] == ["paris"] and "21" in run.final_output
