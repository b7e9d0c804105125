"""The reply readers on their own: the reasoning splitter (`engine.reasoning`) and the tool-call
parser (`engine.tool_parse`, streamed through `server.replies.Reply`), fed the same reply in
every cut that streaming can make: each single-character cut, random cuts, and Qwen3's real
token boundaries (``<think>`` and ``</think>`` are tokens of their own there; a byte-level
BPE without them cuts the tags anywhere). Whatever the cuts, the pieces must add up to what
the whole reply reads as."""

from __future__ import annotations

import json
import random

import pytest

from tightkv.engine.reasoning import (
    AFTER,
    BEFORE,
    INSIDE,
    ReasoningSplitter,
    split_reasoning,
    start_state,
    thinking_tags,
)
from tightkv.engine.tool_parse import parse_reply
from tightkv.engine.tools import parse_tool_calls
from tightkv.server.replies import Reply, openai_call_delta

QWEN3_REPLY = "<think>\nThe user wants the weather.\nI should call the tool.\n</think>\n\nLet me check."
# how Qwen3's tokenizer cuts it: the tags and "\n\n" are single tokens
QWEN3_TOKENS = [
    "<think>",
    "\n",
    "The",
    " user",
    " wants",
    " the",
    " weather",
    ".\n",
    "I",
    " should",
    " call",
    " the",
    " tool",
    ".\n",
    "</think>",
    "\n\n",
    "Let",
    " me",
    " check",
    ".",
]


def cuts(text: str, seed: int = 0, n: int = 30):
    """Ways to stream `text`: whole, one character at a time, every two-piece cut, random cuts."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    rng = random.Random(seed)
    for _ in range(n if len(text) > 2 else 0):
        points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        yield [text[a:b] for a, b in zip([0] + points, points + [len(text)])]


def split_streamed(pieces, state=BEFORE):
    s = ReasoningSplitter(state=state)
    out = [s.feed(p) for p in pieces] + [s.finish()]
    return "".join(r for r, _ in out), "".join(c for _, c in out), out


# --- reasoning -----------------------------------------------------------------------------------
def test_qwen3_reply_split_at_its_own_token_boundaries():
    assert "".join(QWEN3_TOKENS) == QWEN3_REPLY
    reasoning, content, steps = split_streamed(QWEN3_TOKENS)
    assert reasoning == "The user wants the weather.\nI should call the tool."
    assert content == "Let me check."
    # nothing is held longer than it must be: the reasoning flows before the closing tag comes
    assert (
        "".join(r for r, _ in steps[: QWEN3_TOKENS.index("</think>")])
        == "The user wants the weather.\nI should call the tool."
    )


@pytest.mark.parametrize(
    "text, reasoning, content",
    [
        (QWEN3_REPLY, "The user wants the weather.\nI should call the tool.", "Let me check."),
        ("  <think>a</think>b", "a", "b"),
        ("Hello <think>not reasoning</think>", "", "Hello <think>not reasoning</think>"),
        ("<think>\n\n</think>\n\nOnly an answer.", "", "Only an answer."),
        ("<think>cut short by the token budg", "cut short by the token budg", ""),
        ("<think>a </thi", "a </thi", ""),  # a tag cut by the end of the reply is text
        ("<thinking about it", "", "<thinking about it"),
        ("<th", "", "<th"),
        ("\n\n", "", "\n\n"),
        ("", "", ""),
        ("<think>x</think>y</think>z", "x", "y</think>z"),
    ],
)
def test_split_is_the_same_in_every_cut(text, reasoning, content):
    assert split_reasoning(text) == (reasoning, content)
    for pieces in cuts(text):
        got = split_streamed(pieces)[:2]
        assert got == (reasoning, content), pieces


def test_a_prompt_that_opened_or_closed_the_block():
    qwen3_no_think = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert start_state(qwen3_no_think) == AFTER
    assert start_state("<|im_start|>assistant\n<think>\n") == INSIDE  # a template that opens the block itself
    assert start_state("<|im_start|>assistant\n<think>\nLet me see") == INSIDE  # an assistant turn continued
    assert start_state("<|im_start|>assistant\n") == BEFORE
    history = "<|im_start|>assistant\n<think>\nold\n</think>\n\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert start_state(history) == BEFORE
    text = "so it is 4.\n</think>\n\nFour."
    for pieces in cuts(text):
        assert split_streamed(pieces, INSIDE)[:2] == ("so it is 4.", "Four."), pieces
    for pieces in cuts("<think>x</think>y"):
        assert split_streamed(pieces, AFTER)[:2] == ("", "<think>x</think>y")


def test_which_templates_think():
    assert thinking_tags("{{ '<think>\\n\\n</think>\\n\\n' }}") == ("<think>", "</think>")
    assert thinking_tags("<|im_start|>assistant") is None and thinking_tags(None) is None


# --- tool calls ----------------------------------------------------------------------------------
NAMES = {"get_weather", "get_time"}
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'
HERMES = f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n</tool_call>'


def streamed(pieces, names=NAMES, splitter=None):
    """A reply streamed through `Reply`, put back together as a client does it (the openai
    client's accumulation: content appended, each call's arguments appended by index)."""
    reply = Reply(names, splitter)
    content, reasoning, calls = "", "", {}
    for delta in [reply.feed(p) for p in pieces] + [reply.finish()]:
        content += delta.content
        reasoning += delta.reasoning
        for event in delta.calls:
            d = openai_call_delta(reply, event)
            if "id" in d:
                assert d["function"]["arguments"] == "" and d["index"] not in calls
                calls[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "arguments": ""}
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                calls[d["index"]]["arguments"] += d["function"]["arguments"]
    return content, reasoning, [calls[k] for k in sorted(calls)], reply


@pytest.mark.parametrize(
    "text, content, calls",
    [
        (HERMES, "", [("get_weather", WEATHER_ARGS)]),
        ("I'll look it up.\n" + HERMES, "I'll look it up.", [("get_weather", WEATHER_ARGS)]),
        (
            HERMES + "\n" + HERMES.replace("get_weather", "get_time"),
            "",
            [("get_weather", WEATHER_ARGS), ("get_time", WEATHER_ARGS)],
        ),
        # what Qwen2.5-Coder-0.5B writes: the call bare, or fenced
        (f'{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}', "", [("get_weather", WEATHER_ARGS)]),
        (f'```json\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n```', "", [("get_weather", WEATHER_ARGS)]),
        (
            f'Sure:\n```json\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n```\nDone.',
            "Sure:\n\nDone.",
            [("get_weather", WEATHER_ARGS)],
        ),
        (
            f'[TOOL_CALLS][{{"name": "get_time", "arguments": {{"city": "Oslo"}}}}]',
            "",
            [("get_time", '{"city": "Oslo"}')],
        ),
        # Llama 3's key, other key orders, wrapped, and string arguments: whole once complete
        ('{"name": "get_time", "parameters": {"city": "Oslo"}}', "", [("get_time", '{"city": "Oslo"}')]),
        ('{"arguments": {"city": "Oslo"}, "name": "get_time"}', "", [("get_time", '{"city": "Oslo"}')]),
        (
            '<tool_call>{"function": {"name": "get_time", "arguments": "{\\"city\\": \\"Oslo\\"}"}}</tool_call>',
            "",
            [("get_time", '{"city": "Oslo"}')],
        ),
        # arguments with braces and escapes inside strings
        (
            '<tool_call>{"name": "get_time", "arguments": {"city": "a}\\"{b", "n": [1, {"x": "]"}]}}</tool_call>',
            "",
            [("get_time", '{"city": "a}\\"{b", "n": [1, {"x": "]"}]}')],
        ),
        # not calls: content as written
        ('{"name": "unknown", "arguments": {}}', '{"name": "unknown", "arguments": {}}', []),
        ('{"a": 1} is JSON', '{"a": 1} is JSON', []),
        ("Use `x` or ```python\nprint(1)\n```", "Use `x` or ```python\nprint(1)\n```", []),
        ("<tool_call>not json</tool_call> hm", "<tool_call>not json</tool_call> hm", []),
        ("Plain answer.\n", "Plain answer.\n", []),
        ("<tool_", "<tool_", []),
    ],
)
def test_calls_are_the_same_in_every_cut(text, content, calls):
    whole = parse_reply(text, NAMES, final=True)
    assert [(c.name, c.arguments) for c in whole.calls] == calls
    for pieces in cuts(text, n=15):
        got_content, _, got_calls, reply = streamed(pieces)
        assert got_content == content, pieces
        assert [(c["name"], c["arguments"]) for c in got_calls] == calls, pieces
        assert [(c.name, c.arguments) for c in reply.calls] == calls
        assert all(json.loads(c["arguments"]) for c in got_calls)
    expected_tools = [(n, json.loads(a)) for n, a in calls]
    got_content, got_tools = parse_tool_calls(text, NAMES)
    assert [(t.name, t.arguments) for t in got_tools] == expected_tools
    assert got_content == (content.strip() if calls else text)


def test_arguments_stream_in_fragments_as_the_model_writes_them():
    """The call starts once its name is known and its arguments open; they then grow piece by piece."""
    pieces = [
        "<tool",
        "_call>\n",
        '{"name": "get_',
        'weather", "arguments": ',
        '{"city": ',
        '"Par',
        'is", ',
        '"unit": "celsius"}',
        "}\n</tool_call>",
    ]
    reply = Reply(NAMES)
    deltas = [reply.feed(p) for p in pieces] + [reply.finish()]
    events = [e for d in deltas for e in d.calls]
    assert events[0] == ("start", 0)
    fragments = [e[2] for e in events[1:]]
    assert len(fragments) >= 4 and "".join(fragments) == WEATHER_ARGS
    assert deltas[3].calls == [] and deltas[4].calls[0] == ("start", 0)  # out once its arguments open
    assert [d.done for d in deltas if d.done] == [[(0, "get_weather", {"city": "Paris", "unit": "celsius"})]]
    assert all(d.content == "" for d in deltas)


def test_cut_short_call_stays_a_call():
    """A reply cut by max_tokens inside the arguments: the call and the arguments so far, as
    OpenAI sends them (finish_reason "length" says why they are incomplete)."""
    content, _, calls, reply = streamed(['<tool_call>\n{"name": "get_time", "arguments": {"ci'])
    assert calls == [{"id": reply.calls[0].id, "name": "get_time", "arguments": '{"ci'}]
    assert reply.finish_reason("length") == "length" and reply.openai_message()["content"] is None


def test_reasoning_then_a_call():
    """Qwen3 thinks first, then calls: the reasoning is split off before calls are read."""
    text = "<think>\nI need the weather.\n</think>\n\n" + HERMES
    for pieces in cuts(text, n=10):
        content, reasoning, calls, reply = streamed(pieces, splitter=ReasoningSplitter())
        assert (content, reasoning) == ("", "I need the weather.")
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", WEATHER_ARGS)]
    message = reply.openai_message()
    assert message["reasoning_content"] == "I need the weather." and message["content"] is None
    assert reply.finish_reason("stop") == "tool_calls"
