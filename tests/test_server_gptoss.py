"""The real tiny gpt-oss (tests/data/families/gpt-oss: the gpt-oss architecture, harmony's
special tokens and the real chat template, random weights) through a live `tightkv serve` and
the official openai client: its harmony reply read by channel.

Random weights write gibberish, so each request is steered through the real sampler: the
structured-output grammar (analysis messages, then the final channel's header, then JSON)
fixes the markup, and a logit_bias of -100 on the tokens that can begin "analysis" (or
"final") picks the channel; `<|end|>` barred keeps an analysis open until max_tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_server_helpers import openai_client, running

openai = pytest.importorskip("openai")
GGUF = Path(__file__).parent / "data" / "families" / "gpt-oss" / "gpt-oss-f32.gguf"
MODEL = GGUF.stem
ASK = [{"role": "user", "content": "Is the sky blue?"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|return|>")


@pytest.fixture(scope="module")
def vocab() -> list[str]:
    from gguf import GGUFReader

    f = GGUFReader(str(GGUF)).fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]).decode() for i in f.data]


def bar(vocab: list[str], *, starting: str = "", exact: str = "") -> dict[str, int]:
    """logit_bias -100 on the tokens that begin the word `starting`, or on the token `exact`."""
    ids = [i for i, t in enumerate(vocab) if (t and starting.startswith(t)) or t == exact]
    assert ids
    return {str(i): -100 for i in ids}


@pytest.fixture(scope="module")
def client():
    with running(str(GGUF), "--kv", "f32") as srv:
        yield openai_client(srv)


def no_markup(*texts: str | None) -> bool:
    return not any(tag in (t or "") for t in texts for tag in MARKUP)


def test_structured_output_is_the_final_channel(client, vocab):
    """json_schema: the grammar admits analysis first; barred from it, the model opens the
    final channel, and its JSON is the content, with no reasoning and no markup."""
    kw = dict(
        model=MODEL,
        messages=ASK,
        temperature=0,
        max_tokens=40,
        response_format=JSON_FORMAT,
        logit_bias=bar(vocab, starting="analysis"),
    )
    r = client.chat.completions.create(**kw)
    m, choice = r.choices[0].message, r.choices[0]
    assert isinstance(json.loads(m.content)["ok"], bool) and choice.finish_reason == "stop"
    assert getattr(m, "reasoning_content", None) is None and no_markup(m.content)
    parts = [p.choices[0].delta for p in client.chat.completions.create(**kw, stream=True) if p.choices]
    assert "".join(d.content or "" for d in parts) == m.content  # streamed, it adds up to the same
    assert not any(getattr(d, "reasoning_content", None) for d in parts)


def test_max_tokens_inside_the_analysis(client, vocab):
    """Barred from "final" and from ending a message, the model reasons until max_tokens: the
    reasoning is what it wrote of the analysis, the content empty, finish_reason length."""
    bias = {**bar(vocab, starting="final"), **bar(vocab, exact="<|end|>")}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=12, response_format=JSON_FORMAT, logit_bias=bias
    )
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    assert reasoning and not m.content and no_markup(reasoning, m.content)
    # the same reply, continued by the client: its reasoning goes back as the assistant's, and
    # the prompt leaves the analysis open (engine.harmony.continued_message), so what comes is
    # more reasoning, never a header written as content
    more = client.chat.completions.create(
        model=MODEL,
        messages=[*ASK, {"role": "assistant", "content": "", "reasoning_content": reasoning}],
        temperature=0,
        max_tokens=4,
        logit_bias=bar(vocab, exact="<|end|>"),
    )
    m2 = more.choices[0].message
    more_reasoning = getattr(m2, "reasoning_content", None)
    assert more.choices[0].finish_reason == "length" and more_reasoning and not m2.content
    assert no_markup(more_reasoning)
