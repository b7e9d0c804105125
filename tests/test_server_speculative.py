"""#55 in the server: speculation per request (llama-server's `speculative.type`,
`speculative.n_max`, `speculative.n_min`; Ollama's `options.spec_type`, `draft_max`,
`draft_min`), the draft counts in the OpenAI answers' `timings` and in `/metrics`, a
server-wide draft model (`-md`) counted once in the server's memory and in `plan`. Through a
live uvicorn server on loopback and the official openai client, on the embedded model."""

from __future__ import annotations

import json

import pytest
from test_server_helpers import metrics, openai_client, post, request, running, sse_events

from tightkv.cli import main

TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens and wrote the weather in a leather logbook: wind from the west, a "
    "falling glass, fog banks on the northern reef."
)
MESSAGES = [{"role": "user", "content": "Repeat the following text exactly, word for word:\n\n" + TEXT}]
TOKENS = 32
CTX = "1024"


@pytest.fixture(scope="module")
def server():
    with running("--ctx", CTX, "--parallel", "1") as srv:
        yield srv


def _chat(srv, **extra):
    client = openai_client(srv)
    return client.chat.completions.create(
        model="gemma3:270m", messages=MESSAGES, max_tokens=TOKENS, temperature=0, extra_body=extra or None
    )


def test_request_turns_speculation_off_and_on_with_the_same_reply(server):
    off = _chat(server, **{"speculative.n_max": 0})
    on = _chat(server, **{"speculative.type": "ngram-simple", "speculative.n_max": 8, "speculative.n_min": 1})
    assert on.choices[0].message.content == off.choices[0].message.content
    assert on.usage.completion_tokens == off.usage.completion_tokens == TOKENS
    timings_off, timings_on = off.model_extra["timings"], on.model_extra["timings"]
    assert "draft_n" not in timings_off  # as llama-server: drafting counts only where there were drafts
    assert timings_on["predicted_n"] == TOKENS and timings_on["predicted_per_second"] > 0
    assert timings_on["prompt_n"] + timings_on["cache_n"] == on.usage.prompt_tokens  # the prompt is cached
    assert timings_off["prompt_n"] > 0 and timings_off["prompt_per_second"] > 0
    assert 0 < timings_on["draft_n_accepted"] <= timings_on["draft_n"]


def test_metrics_count_drafted_and_accepted_tokens(server):
    before = metrics(server)
    reply = _chat(server)  # the server's default: lookup drafts
    after = metrics(server)
    t = reply.model_extra["timings"]
    assert t["draft_n_accepted"] > 0
    drafted = after["spec_decode_num_draft_tokens_total"] - before["spec_decode_num_draft_tokens_total"]
    accepted = after["spec_decode_num_accepted_tokens_total"] - before["spec_decode_num_accepted_tokens_total"]
    assert (drafted, accepted) == (t["draft_n"], t["draft_n_accepted"])


def test_streamed_completion_carries_timings_on_its_last_chunk(server):
    prompt = "Copy this line twice.\n" + TEXT + "\n" + TEXT[:60]
    whole = openai_client(server).completions.create(
        model="gemma3:270m", prompt=prompt, max_tokens=TOKENS, temperature=0, extra_body={"speculative.n_max": 0}
    )
    body = {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "stream": True}
    status, _, raw = request(server, "POST", "/v1/completions", body)
    assert status == 200
    chunks = sse_events(raw)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole.choices[0].text
    assert all("timings" not in c for c in chunks[:-1])
    last = chunks[-1]["timings"]
    assert last["predicted_n"] == TOKENS and last["draft_n_accepted"] > 0
    assert "draft_n" not in whole.model_extra["timings"]


def test_streamed_chat_carries_timings_on_its_last_chunk(server):
    whole = _chat(server)
    chunks = list(
        openai_client(server).chat.completions.create(
            model="gemma3:270m", messages=MESSAGES, max_tokens=TOKENS, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert [bool(c.model_extra.get("timings")) for c in chunks].count(True) == 1
    last = chunks[-1].model_extra["timings"]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert last["predicted_n"] == TOKENS and last["draft_n_accepted"] > 0


def test_ollama_options_turn_speculation_off_with_the_same_reply(server):
    body = {"model": "gemma3:270m", "messages": MESSAGES, "stream": False, "options": {"num_predict": 16}}
    _, plain = post(server, "/api/chat", {**body, "options": {"num_predict": 16, "temperature": 0}})
    status, off = post(
        server, "/api/chat", {**body, "options": {"num_predict": 16, "temperature": 0, "spec_type": "none"}}
    )
    assert status == 200 and off["message"]["content"] == plain["message"]["content"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"speculative.type": "draft"}, "speculative.type"),  # no -md on this server
        ({"speculative.n_max": 2, "speculative.n_min": 5}, "speculative"),
        ({"speculative.n_max": -1}, "speculative.n_max"),
        ({"speculative.type": "eagle"}, "speculative.type"),
        ({"speculative.p_min": 0.5}, "speculative.p_min"),
    ],
)
def test_bad_speculation_options_are_a_400(server, extra, param):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        _chat(server, **extra)
    assert err.value.status_code == 400
    assert (err.value.body or {}).get("param") == param


def test_server_draft_model_counted_once_and_drafting_per_request(server, embedded, tmp_path):
    """`serve MODEL -md DRAFT` (the embedded model drafting for itself): its memory is the plain
    server's plus the draft's (`eval.plan.draft_bytes`: weights, buffers, f16 KV at the
    context), as `plan -md` counts it, and a request's `speculative.type` picks draft or lookup
    with the same reply."""
    from tightkv.eval.plan import draft_bytes
    from tightkv.registry import resolve

    path = resolve(None)
    extra = draft_bytes(path, int(CTX))
    plain = metrics(server)["models_bytes"]
    with running("gemma3:270m", "--ctx", CTX, "--parallel", "1", "-md", str(path)) as srv:
        assert metrics(srv)["models_bytes"] == plain + extra
        drafted = _chat(srv)  # the server's -md: draft-model speculation
        lookup = _chat(srv, **{"speculative.type": "ngram-simple"})
        assert drafted.choices[0].message.content == lookup.choices[0].message.content
        assert drafted.model_extra["timings"]["draft_n_accepted"] > 0
    out = tmp_path / "plan.json"
    assert main(["plan", "-c", CTX, "-md", str(path), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["draft"] == extra > 0
    assert main(["plan", "-c", CTX, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["draft"] == 0


def test_requests_decoding_together_speculate_with_the_same_replies():
    """Two requests at once on a server of two slots: their drafts ride in the same forward
    passes, and each reply equals its reply without speculation (the official client)."""
    from concurrent.futures import ThreadPoolExecutor

    others = [{"role": "user", "content": "Repeat the following text exactly, word for word:\n\n" + TEXT[::-1]}]
    with running("--ctx", CTX, "--parallel", "2") as srv:
        client = openai_client(srv)

        def ask(messages, extra=None):
            return client.chat.completions.create(
                model="gemma3:270m", messages=messages, max_tokens=TOKENS, temperature=0, extra_body=extra
            )

        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(ask, [MESSAGES, others]))
        alone = [ask(m, {"speculative.n_max": 0}) for m in (MESSAGES, others)]
        assert [r.choices[0].message.content for r in together] == [r.choices[0].message.content for r in alone]
        assert together[0].model_extra["timings"]["draft_n_accepted"] > 0


def test_serve_refuses_a_draft_model_without_a_model(capsys):
    assert main(["serve", "-md", "gemma3:270m", "--port", "0"]) != 0
    assert "-md/--model-draft drafts for the MODEL served" in capsys.readouterr().err
