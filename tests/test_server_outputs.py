"""Structured output, logprobs, echo and the tokenizer routes through the official `openai`
and `ollama` clients against a live `tightkv serve` of the embedded Gemma 3 270M (a base
model: none of this needs a chat template)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_server_helpers import openai_client, post, running
from tolerances import prob_points

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "gemma3:270m"
PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
}


@pytest.fixture(scope="module")
def server():
    with running("--ctx", "1024", "--parallel", "2") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_json_schema_reply_validates(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=fmt,
        temperature=0,
        max_tokens=60,
    )
    doc = json.loads(reply.choices[0].message.content)
    jsonschema.validate(doc, PERSON)
    assert reply.choices[0].finish_reason == "stop"  # the grammar completed, not the token budget


def test_json_object_streamed_and_sampled(client):
    """A sampled base model may ramble inside an object past any budget (seeds 1, 3 and 4 did at
    200 tokens): the first of a few seeds whose object closes in time is whole, valid JSON."""
    for seed in (5, 2, 3):
        parts = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Some JSON, please."}],
            response_format={"type": "json_object"},
            temperature=0.8,
            seed=seed,
            max_tokens=80,
            stream=True,
        )
        chunks = list(parts)
        if chunks[-1].choices[0].finish_reason == "stop":
            break
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert isinstance(json.loads(text), dict)


def test_gbnf_grammar_extra_field(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Is the sky blue?"}],
        "max_tokens": 8,
        "grammar": 'root ::= ("yes" | "no") "."',
    }
    status, doc = post(server, "/v1/chat/completions", body)
    assert status == 200 and doc["choices"][0]["message"]["content"] in ("yes.", "no.")


def test_bad_grammars_are_400s(server):
    for extra in (
        {"grammar": "root ::= ("},
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
        {"grammar": 'root ::= "a"', "json_schema": PERSON},
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **extra}
        status, doc = post(server, "/v1/chat/completions", body)
        assert status == 400 and doc["error"]["message"], (extra, doc)


def test_chat_logprobs_match_the_model(client, embedded):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 6
    ids = embedded.chat_ids([{"role": "user", "content": "Count to five."}])
    out = embedded.generate(ids, max_tokens=6).ids
    # Model.logits scores every position in one prefill: its weight path rounds otherwise (int8 rows)
    logits = embedded.logits(ids + out[:-1])[len(ids) - 1 :]
    steps = [s.logprob for s in embedded.generate(ids, max_tokens=6, logprobs=3, stream=True) if s.logprob]  # same path
    for i, entry in enumerate(content):
        want = log_softmax(logits[i])
        assert entry.logprob == pytest.approx(steps[i].logprob, abs=1e-4)
        assert np.exp(entry.logprob) == pytest.approx(np.exp(want[out[i]]), abs=prob_points())  # a few points
        assert entry.bytes == list(embedded.tokenizer.token_bytes(out[i]))
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in steps[i].top], abs=1e-4)
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the best token was taken

    streamed = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        stream=True,
    )
    got = [e.logprob for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert got == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_completion_echo_logprobs_as_lm_eval_reads_them(server, embedded):
    ids = embedded.tokenize("The capital of France is Paris", add_bos=True)
    body = {"model": MODEL, "prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    status, doc = post(server, "/v1/completions", body)
    assert status == 200
    lp = doc["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logits = embedded.logits(ids)
    for i in range(1, len(ids)):  # the echo is scored by a prefill, as Model.logits is
        assert lp["token_logprobs"][i] == pytest.approx(log_softmax(logits[i - 1])[ids[i]], abs=2e-3)
        assert max(lp["top_logprobs"][i].values()) >= lp["token_logprobs"][i] - 1e-6
    text = doc["choices"][0]["text"]
    assert text.startswith(embedded.detokenize(ids)) and lp["text_offset"][-1] == len(embedded.detokenize(ids))


def test_completion_of_several_prompts(client):
    """A list of prompts (as lm-eval batches them): each prompt's n choices in turn, each the
    completion it gets alone; usage counts every prompt once."""
    prompts = ["One, two, three,", "The capital of France is"]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=4, temperature=0) for p in prompts]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone) * 2
    parts = list(
        client.completions.create(
            model=MODEL,
            prompt=prompts,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = ["", ""]
    for p in parts:
        for c in p.choices:
            texts[c.index] += c.text
    assert texts == [a.choices[0].text for a in alone] and parts[-1].usage.prompt_tokens == r.usage.prompt_tokens
    echoed = client.completions.create(model=MODEL, prompt=prompts, max_tokens=0, echo=True, logprobs=0)
    assert [c.text for c in echoed.choices] == prompts
    assert all(c.logprobs.token_logprobs[0] is None and len(c.logprobs.tokens) > 2 for c in echoed.choices)
    with pytest.raises(openai.BadRequestError, match="prompt.1"):
        client.completions.create(model=MODEL, prompt=[[2, 40], []], max_tokens=2)


def test_completion_logprobs_streamed(client):
    whole = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=5, temperature=0, logprobs=2)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == 5 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == whole.choices[0].text
    parts = list(
        client.completions.create(
            model=MODEL, prompt="One, two, three,", max_tokens=5, temperature=0, logprobs=2, stream=True
        )
    )
    streamed = [x for p in parts if p.choices and p.choices[0].logprobs for x in p.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_tokenize_routes(server, embedded):
    status, doc = post(server, "/tokenize", {"content": "Hello world"})
    assert status == 200 and doc["tokens"] == embedded.tokenize("Hello world", add_bos=False)
    status, vllm = post(server, "/tokenize", {"prompt": "Hello world", "add_special_tokens": True})
    assert vllm["tokens"] == embedded.tokenize("Hello world", add_bos=True)
    status, back = post(server, "/detokenize", {"tokens": doc["tokens"]})
    assert status == 200 and back["content"] == back["prompt"] == "Hello world"
    status, bad = post(server, "/detokenize", {"tokens": [-1]})
    assert status == 400


def test_ollama_format_schema(server):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=server.url)
    r = c.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person."}],
        format=PERSON,
        options={"temperature": 0, "num_predict": 60},
    )
    jsonschema.validate(json.loads(r.message.content), PERSON)
    r = c.generate(model=MODEL, prompt="A JSON object:", format="json", options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(r.response), dict)


def test_extreme_sampling_values_answer(server):
    """Fuzz findings: a vanishing temperature and repeat penalty once gave NaN probabilities (a 500)."""
    for extra in (
        {"temperature": 1e-38},
        {"repeat_penalty": 1e-45, "temperature": 0.7},
        {"temperature": 1e-38, "repeat_penalty": 1e-45},
        {"top_p": 0, "temperature": 1.0},
    ):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hi, hi, hi."}],
            "max_tokens": 6,
            "seed": 1,
            **extra,
        }
        status, doc = post(server, "/v1/chat/completions", body)
        assert status == 200 and doc["choices"][0]["finish_reason"] in ("stop", "length"), (extra, doc)


@pytest.mark.parametrize(
    "route,extra,words",
    [
        ("chat", {"temperature": 5}, "'temperature': decimal above maximum value. Expected a value <= 2, but got 5"),
        ("chat", {"top_p": 1.5}, "'top_p': decimal above maximum value. Expected a value <= 1"),
        ("chat", {"presence_penalty": -3}, "'presence_penalty': decimal below minimum value. Expected a value >= -2"),
        ("chat", {"frequency_penalty": 2.5}, "'frequency_penalty': decimal above maximum value"),
        ("chat", {"stop": list("abcde")}, "'stop': array too long. Expected an array with maximum length 4"),
        ("chat", {"n": 0}, "'n': integer below minimum value. Expected a value >= 1, but got 0"),
        ("chat", {"max_tokens": 0}, "'max_tokens': integer below minimum value. Expected a value >= 1"),
        ("chat", {"max_completion_tokens": 0}, "'max_completion_tokens': integer below minimum value"),
        ("chat", {"top_logprobs": 21}, "'top_logprobs': integer above maximum value"),
        ("chat", {"tool_choice": "required"}, "'tool_choice' is only allowed when 'tools' are specified"),
        ("chat", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "only allowed when 'tools'"),
        ("completions", {"temperature": 2.5}, "'temperature': decimal above maximum value"),
        ("completions", {"logprobs": 21}, "'logprobs': integer above maximum value. Expected a value <= 20"),
        ("completions", {"max_tokens": -1}, "'max_tokens': integer below minimum value. Expected a value >= 0"),
        ("completions", {"stop": list("abcde")}, "'stop': array too long"),
    ],
)
def test_openai_ranges_are_refused_as_openai_refuses_them(client, route, extra, words):
    """#54 point 7: out of OpenAI's documented ranges is OpenAI's 400, in its words, naming the param."""
    (param,) = extra
    with pytest.raises(openai.BadRequestError) as err:
        if route == "chat":
            ask = [{"role": "user", "content": "x"}]
            logprobs = {"logprobs": True} if param == "top_logprobs" else {}
            client.chat.completions.create(model=MODEL, messages=ask, **{"max_tokens": 2, **logprobs, **extra})
        else:
            client.completions.create(model=MODEL, prompt="x", **{"max_tokens": 2, **extra})
    assert words in err.value.body["message"] and err.value.body["param"] == param


def test_the_edges_of_openais_ranges_answer(client, server):
    """The bounds themselves are in range; Ollama's routes keep Ollama's ranges (a temperature
    of 5, five stop strings)."""
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        temperature=2,
        top_p=1,
        presence_penalty=-2,
        frequency_penalty=2,
        stop=["a", "b", "c", "d"],
        logprobs=True,
        top_logprobs=20,
        seed=1,
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    body = {"model": MODEL, "prompt": "x", "stream": False, "options": {"temperature": 5, "num_predict": 2}}
    status, doc = post(server, "/api/generate", {**body, "options": {**body["options"], "stop": list("vwxyz")}})
    assert status == 200 and doc["done"], doc


def test_one_long_stop_string(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3, "stop": "a stop string longer than sixteen characters"}
    status, _ = post(server, "/v1/completions", body)
    assert status == 200


def test_n_choices_share_the_prompt(client):
    ask = [{"role": "user", "content": "Name a fruit."}]
    r = client.chat.completions.create(model=MODEL, messages=ask, n=2, temperature=1.0, seed=5, max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1]
    assert 2 <= r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0  # the prompt counted once
    one = client.chat.completions.create(model=MODEL, messages=ask, temperature=1.0, seed=5, max_tokens=8)
    assert r.choices[0].message.content == one.choices[0].message.content  # choice 0 draws with the seed itself
    parts = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ask,
            n=2,
            temperature=1.0,
            seed=5,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = ["", ""]
    for p in parts:
        for c in p.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in r.choices]
    assert parts[-1].usage.completion_tokens == r.usage.completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ask, n=3, max_tokens=2)  # more than --parallel 2


def test_langchain_with_structured_output(client, server):
    """LangChain's with_structured_output (json_schema, strict), through the OpenAI and the Ollama API (its
    json_mode is OpenAI's json_object, tested above: an open-ended object can outrun a small budget)."""
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Person(BaseModel):  # bounded: a 270M base model left free writes digits until the budget ends
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=120)

    llm = lc.ChatOpenAI(base_url=str(client.base_url), api_key="unused", model=MODEL, temperature=0, max_tokens=100)
    got = llm.with_structured_output(Person, method="json_schema", strict=True).invoke("Invent a person.")
    assert isinstance(got, Person)
    lo = pytest.importorskip("langchain_ollama")
    got = (
        lo.ChatOllama(base_url=server.url, model=MODEL, temperature=0, num_predict=100)
        .with_structured_output(Person, method="json_schema")
        .invoke("Invent a person.")
    )
    assert isinstance(got, Person)


# --- Ollama's logprobs -------------------------------------------------------------------------
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 6}  # Ollama's default penalty would steer


def test_ollama_chat_logprobs_match_the_model(server, embedded):
    ollama = pytest.importorskip("ollama")
    ask = [{"role": "user", "content": "Count to five."}]
    r = ollama.Client(host=server.url).chat(model=MODEL, messages=ask, logprobs=True, top_logprobs=3, options=GREEDY)
    ids = embedded.chat_ids(ask)
    out = embedded.generate(ids, max_tokens=6, stop=embedded.chat_stops()).ids
    steps = [s.logprob for s in embedded.generate(ids, max_tokens=6, logprobs=3, stream=True) if s.logprob]
    logits = embedded.logits(ids + out[:-1])[len(ids) - 1 :]
    assert len(r.logprobs) == r.eval_count == len(out)
    assert "".join(e.token for e in r.logprobs) == r.message.content
    for i, entry in enumerate(r.logprobs):
        assert entry.logprob == pytest.approx(steps[i].logprob, abs=1e-4)
        assert np.exp(entry.logprob) == pytest.approx(np.exp(log_softmax(logits[i])[out[i]]), abs=prob_points())
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in steps[i].top], abs=1e-4)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the best token was taken


def test_ollama_generate_logprobs_streamed_and_whole(server):
    from test_server_helpers import ndjson_records, request

    body = {"model": MODEL, "prompt": "One, two, three,", "raw": True, "logprobs": True, "options": GREEDY}
    status, whole = post(server, "/api/generate", {**body, "stream": False})
    assert status == 200 and len(whole["logprobs"]) == whole["eval_count"] == 6
    assert all(set(e) == {"token", "logprob", "bytes"} for e in whole["logprobs"])  # no top_logprobs asked
    assert all(bytes(e["bytes"]).decode() == e["token"] for e in whole["logprobs"])
    assert list(whole).index("logprobs") == len(whole) - 1  # Go's field order: last on generate
    status, _, raw = request(server, "POST", "/api/generate", body)
    records = ndjson_records(raw)
    streamed = [e for rec in records for e in rec.get("logprobs", [])]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in whole["logprobs"]], abs=1e-5)
    for rec in records[:-1]:  # each record carries the logprobs of the tokens whose text it brings
        assert "".join(e["token"] for e in rec.get("logprobs", [])) == rec["response"]
    status, plain = post(server, "/api/generate", {**body, "logprobs": False, "stream": False})
    assert "logprobs" not in plain
    status, err = post(
        server,
        "/api/chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
    )
    assert status == 400 and err == {"error": "top_logprobs must be between 0 and 20"}


# --- an assistant message last is continued --------------------------------------------------------
def test_plain_continuation_without_a_template(client, server, embedded):
    """The embedded Gemma has no chat template: the conversation is plain text, and a last
    assistant message ends it as written (no "Assistant:" turn opened after it)."""
    ollama = pytest.importorskip("ollama")
    history = [{"role": "user", "content": "Count from one to ten."}, {"role": "assistant", "content": "one, two,"}]
    text = "User: Count from one to ten.\nAssistant: one, two,"
    ids = embedded.tokenize(text)
    want = embedded.generate(ids, max_tokens=8, stop=embedded.chat_stops())
    r = client.chat.completions.create(model=MODEL, messages=history, temperature=0, max_tokens=8)
    assert r.choices[0].message.content == want.text and r.usage.prompt_tokens == len(ids)
    r = ollama.Client(host=server.url).chat(model=MODEL, messages=history, options={**GREEDY, "num_predict": 8})
    assert r.message.content == want.text
    # vLLM's way of asking for a new turn instead
    turn = client.chat.completions.create(
        model=MODEL, messages=history, temperature=0, max_tokens=2, extra_body={"continue_final_message": False}
    )
    assert turn.usage.prompt_tokens == len(embedded.tokenize(text + "\nAssistant:"))
