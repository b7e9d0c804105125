"""The server on a tiny random Gemma 3 with a chat template: SSE and NDJSON
framing byte for byte, Ollama routes, API key, concurrent streams, bad input.

One `tightkv serve` subprocess serves the whole module."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from test_server_helpers import (
    LiveServer,
    ndjson_records,
    post,
    request,
    sse_events,
    stream_socket,
    wait_idle,
    read_until,
    hard_close,
)
from tiny_gguf import write_gemma3

KEY = "test-key-123"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_gemma3(tmp_path_factory.mktemp("srv") / "tiny-chat.gguf")
    srv = LiveServer(str(path), api_key=KEY)
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def chat_body(content="hello", **kw):
    return {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
        **kw,
    }


# --- auth, health, listing -------------------------------------------------------------
def test_api_key_required_everywhere_but_health(server):
    assert request(server, "GET", "/health", auth=False)[0] == 200
    assert request(server, "HEAD", "/health", auth=False)[0] == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", CHAT),
        ("GET", "/api/tags"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ]:
        status, headers, raw = request(server, method, path, chat_body() if method == "POST" else None, auth=False)
        assert status == 401, path
        body = json.loads(raw)
        if path.startswith("/api/"):
            assert body == {"error": body["error"]} and isinstance(body["error"], str)
        else:
            assert body["error"]["type"] == "authentication_error" and set(body["error"]) >= {
                "message",
                "param",
                "code",
            }
    bad = {"Authorization": "Bearer wrong"}
    assert request(server, "GET", "/v1/models", headers=bad)[0] == 401
    assert request(server, "GET", "/v1/models")[0] == 200


def test_models_and_ollama_listing(server):
    status, _, raw = request(server, "GET", "/v1/models")
    doc = json.loads(raw)
    assert status == 200 and doc["object"] == "list"
    assert [m["id"] for m in doc["data"]] == ["tiny-chat"] and doc["data"][0]["object"] == "model"
    status, _, raw = request(server, "GET", "/api/tags")
    tag = json.loads(raw)["models"][0]
    assert tag["name"] == "tiny-chat" and len(tag["digest"]) == 64 and tag["size"] > 0
    assert tag["details"]["format"] == "gguf" and tag["details"]["family"] == "gemma3"
    status, show = post(server, "/api/show", {"model": "tiny-chat"})
    assert status == 200 and show["model_info"]["general.architecture"] == "gemma3"
    assert "<start_of_turn>" in show["template"] and show["model_info"]["tokenizer.ggml.tokens"] is None
    assert show["tightkv"]["chat_template"] is True  # the web page continues text where it is False
    status, _, raw = request(server, "GET", "/api/version")
    version = json.loads(raw)
    assert status == 200 and tuple(map(int, version["version"].split("."))) >= (0, 12) and version["tightkv"]
    status, err = post(server, "/api/chat", {"model": "tiny-chat", "messages": MSG, "think": True, "stream": False})
    assert status == 400 and err["error"] == '"tiny-chat" does not support thinking'
    ps = json.loads(request(server, "GET", "/api/ps")[2])["models"][0]
    assert ps["name"] == "tiny-chat" and ps["kv_cache_type"] and ps["cpu_kernels"]


# --- OpenAI framing ----------------------------------------------------------------------
def test_sse_chat_framing_byte_for_byte(server):
    status, headers, raw = request(server, "POST", CHAT, chat_body(stream=True, stream_options={"include_usage": True}))
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in headers and headers.get("transfer-encoding") == "chunked"
    events = sse_events(raw)
    first, *middle, final, usage = events
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    for e in events:
        assert e["object"] == "chat.completion.chunk" and e["model"] == "tiny-chat" and "usage" in e
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    for e in middle:
        (choice,) = e["choices"]
        assert set(choice["delta"]) == {"content"} and choice["finish_reason"] is None and e["usage"] is None
    assert final["choices"][0]["delta"] == {} and final["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 8
    u = usage["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["prompt_tokens"] > 0
    # each event is compact JSON on one line, exactly as serialized
    for line in raw.split(b"\n\n")[:-2]:
        payload = line[len(b"data: ") :]
        assert payload == json.dumps(json.loads(payload), ensure_ascii=False, separators=(",", ":")).encode()

    # the same request without streaming gives the same text, and usage
    status, doc = post(server, CHAT, chat_body())
    assert status == 200 and doc["object"] == "chat.completion"
    text = "".join(e["choices"][0]["delta"]["content"] for e in middle)
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert doc["usage"]["completion_tokens"] == u["completion_tokens"]


def test_sse_without_include_usage_has_no_usage(server):
    status, _, raw = request(server, "POST", CHAT, chat_body(stream=True))
    events = sse_events(raw)
    assert status == 200 and all("usage" not in e for e in events) and events[-1]["choices"][0]["finish_reason"]


def test_completions_stream_and_json(server):
    body = {"prompt": "hello world", "max_tokens": 6, "temperature": 0}
    status, doc = post(server, "/v1/completions", body)
    assert status == 200 and doc["object"] == "text_completion" and doc["usage"]["completion_tokens"] <= 6
    status, headers, raw = request(
        server, "POST", "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = sse_events(raw)
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and usage["total_tokens"] == doc["usage"]["total_tokens"]
    # the same prompt again: all of it comes from the prefix store, with its logits
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == doc["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == doc["choices"][0]["finish_reason"]
    # token ids as the prompt
    status, doc2 = post(server, "/v1/completions", {**body, "prompt": [2, 40, 41, 42]})
    assert status == 200 and doc2["usage"]["prompt_tokens"] == 4


# --- Ollama framing ----------------------------------------------------------------------
FINAL_FIELDS = [
    "done_reason",
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
]


def test_ndjson_chat_framing(server):
    body = {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "a <b> & c"}],
        "options": {"num_predict": 6, "temperature": 0},
    }
    status, headers, raw = request(server, "POST", "/api/chat", body)
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    records = ndjson_records(raw)
    *chunks, last = records
    for r in chunks:
        assert list(r) == ["model", "created_at", "message", "done"] and r["done"] is False
        assert r["message"]["role"] == "assistant" and r["created_at"].endswith("Z")
    assert list(last) == ["model", "created_at", "message", "done"] + FINAL_FIELDS
    assert last["done"] is True and last["done_reason"] in ("stop", "length") and last["message"]["content"] == ""
    assert last["eval_count"] <= 6 and last["prompt_eval_count"] > 0
    assert last["total_duration"] >= last["prompt_eval_duration"] + last["eval_duration"] > 0
    assert all(isinstance(last[k], int) for k in FINAL_FIELDS[1:])
    # Go escapes <, > and & in JSON strings
    for line in raw.split(b"\n")[:-1]:
        assert b"<" not in line and b">" not in line and b"&" not in line
    # non-streaming: one object with the whole text
    status, doc = post(server, "/api/chat", {**body, "stream": False})
    assert status == 200 and doc["done"] is True
    assert doc["message"]["content"] == "".join(r["message"]["content"] for r in chunks)


def test_ndjson_generate_and_context(server):
    body = {"model": "tiny-chat", "prompt": "hello ndjson", "options": {"num_predict": 5, "temperature": 0}}
    status, headers, raw = request(server, "POST", "/api/generate", body)
    records = ndjson_records(raw)
    last = records[-1]
    assert (
        status == 200
        and list(last) == ["model", "created_at", "response", "done", "done_reason", "context"] + FINAL_FIELDS[1:]
    )
    assert all(list(r) == ["model", "created_at", "response", "done"] for r in records[:-1])
    assert len(last["context"]) == last["prompt_eval_count"] + last["eval_count"]  # a prompt not seen before
    # the context continues a conversation, whose first turn is a stored prefix: fewer tokens evaluated
    status, doc = post(server, "/api/generate", {**body, "stream": False, "context": last["context"]})
    prompt_tokens = len(doc["context"]) - doc["eval_count"]
    assert status == 200 and prompt_tokens > len(last["context"]) and doc["prompt_eval_count"] < prompt_tokens
    # raw mode skips the template; an empty prompt just loads the model
    status, doc = post(server, "/api/generate", {**body, "stream": False, "raw": True})
    assert status == 200 and doc["prompt_eval_count"] < last["prompt_eval_count"]
    status, doc = post(server, "/api/generate", {"model": "tiny-chat"})
    assert status == 200 and doc["done"] is True and doc["done_reason"] == "load" and doc["response"] == ""
    status, doc = post(server, "/api/chat", {"model": "tiny-chat", "messages": None})
    assert status == 200 and doc["done_reason"] == "load"


def test_stop_string_and_context_overflow(server):
    _, doc = post(server, CHAT, chat_body(max_tokens=12, temperature=1.0, seed=3))
    text = doc["choices"][0]["message"]["content"]
    assert len(text) >= 3
    stop = text[1:3]
    _, stopped = post(server, CHAT, chat_body(max_tokens=12, temperature=1.0, seed=3, stop=[stop, "zzzz"]))
    assert stopped["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    # prompt + max_tokens beyond the context: 400, never a silent truncation
    status, err = post(server, CHAT, chat_body(max_tokens=600))
    assert status == 400 and err["error"]["type"] == "exceed_context_size_error"
    assert err["error"]["code"] == "context_length_exceeded"  # OpenAI's code; llama.cpp's type and counts
    assert err["error"]["n_ctx"] > 0 and err["error"]["n_prompt_tokens"] > 0
    # Ollama: num_predict is a cap, and generation stops at the end of the context (num_ctx when smaller)
    body = {"model": "tiny-chat", "prompt": "hi", "stream": False, "options": {"num_predict": 600, "temperature": 0}}
    status, doc = post(server, "/api/generate", body)
    assert status == 200 and doc["done_reason"] == "length" and len(doc["context"]) == 512
    body["options"]["num_ctx"] = 64
    status, doc = post(server, "/api/generate", body)
    assert status == 200 and doc["done_reason"] == "length" and len(doc["context"]) == 64
    body = {"model": "tiny-chat", "prompt": "hi " * 80, "stream": False, "options": {"num_ctx": 16}}
    status, err = post(server, "/api/generate", body)
    assert status == 400 and "does not fit the context of 16 tokens" in err["error"]
    # no max_tokens: up to the end of the context (512)
    status, doc = post(server, "/v1/completions", {"prompt": "x", "temperature": 0})
    u = doc["usage"]
    assert status == 200 and (doc["choices"][0]["finish_reason"] == "stop" or u["total_tokens"] == 512)


# --- concurrency ---------------------------------------------------------------------------
def test_eight_concurrent_streams_are_complete_and_correct(server):
    """8 clients stream ~30 tokens each at once; each stream equals the same request
    answered alone (seeded sampling, so the streams differ); /health stays fast."""
    bodies = [
        chat_body(f"client {i} says hi", max_tokens=30, temperature=2.0, repeat_penalty=1.5, seed=i) for i in range(8)
    ]
    expected = [post(server, CHAT, b)[1]["choices"][0]["message"]["content"] for b in bodies]
    assert len(set(expected)) > 4  # the check below can tell the streams apart
    results: list = [None] * 8
    stop_polling = threading.Event()
    latencies: list[float] = []

    def client(i):
        results[i] = request(server, "POST", CHAT, {**bodies[i], "stream": True}, timeout=120)

    def poll_health():
        while not stop_polling.is_set():
            t = time.perf_counter()
            assert request(server, "GET", "/health", timeout=10)[0] == 200
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)

    poller = threading.Thread(target=poll_health)
    poller.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    stop_polling.set()
    poller.join(30)
    for i, (status, headers, raw) in enumerate(results):
        assert status == 200
        events = sse_events(raw)
        assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == expected[i]
    assert latencies and max(latencies) < 2.0, f"/health took up to {max(latencies):.2f} s"
    wait_idle(server)


def test_disconnects_stop_generation(server):
    """Clients that vanish mid-answer leave nothing running (SSE, NDJSON, and a
    non-streamed request waiting for its whole answer)."""
    before = wait_idle(server)
    for i in range(8):
        if i % 4 == 0:
            sock = stream_socket(server, CHAT, chat_body(max_tokens=450, temperature=2.0, seed=i))
            time.sleep(0.2)
        elif i % 4 == 1:
            body = {"model": "tiny-chat", "prompt": "go", "options": {"num_predict": 450}}
            sock = stream_socket(server, "/api/generate", body)
            read_until(sock, b'"done":false', 2)
        else:
            sock = stream_socket(server, CHAT, chat_body(max_tokens=450, temperature=2.0, seed=i, stream=True))
            read_until(sock, b"data: ", 3)
        hard_close(sock, reset=i % 3 == 0)
    after = wait_idle(server, timeout=10)
    cancelled = after["requests_cancelled_total"] - before["requests_cancelled_total"]
    served = after["requests_served_total"] - before["requests_served_total"]
    # a sampled reply may end (its end-of-turn token) before the server sees its client go
    assert cancelled + served == 8 and cancelled >= 4, (cancelled, served)
    assert after["kv_cache_bytes"] == 0


# --- bad input ----------------------------------------------------------------------------------
MSG = [{"role": "user", "content": "hi"}]
BAD_V1 = [
    (CHAT, b"{", 400),
    (CHAT, b"", 400),
    (CHAT, b"[]", 400),
    (CHAT, b"null", 400),
    (CHAT, b'"x"', 400),
    (CHAT, b"\xff\xfe{}", 400),
    (CHAT, b"[" * 100000, 400),
    (CHAT, b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}', 400),
    (CHAT, b'{"messages":[{"role":"user","content":"hi"}],"temperature":1e999}', 400),
    (CHAT, {}, 400),
    (CHAT, {"messages": []}, 400),
    (CHAT, {"messages": "hi"}, 400),
    (CHAT, {"messages": [1]}, 400),
    (CHAT, {"messages": [{"role": "user"}]}, 400),
    (CHAT, {"messages": [{"content": "x"}]}, 400),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400),
    (CHAT, {"messages": MSG, "max_tokens": "10"}, 400),
    (CHAT, {"messages": MSG, "max_tokens": -1}, 400),
    (CHAT, {"messages": MSG, "max_tokens": 0}, 400),
    (CHAT, {"messages": MSG, "max_tokens": 1.5}, 400),
    (CHAT, {"messages": MSG, "max_tokens": True}, 400),
    (CHAT, {"messages": MSG, "max_tokens": 10**30}, 400),
    (CHAT, {"messages": MSG, "max_completion_tokens": "x"}, 400),
    (CHAT, {"messages": MSG, "temperature": "hot"}, 400),
    (CHAT, {"messages": MSG, "temperature": -1}, 400),
    (CHAT, {"messages": MSG, "top_p": -0.1}, 400),
    (CHAT, {"messages": MSG, "top_p": 2}, 400),
    (CHAT, {"messages": MSG, "top_k": -1}, 400),
    (CHAT, {"messages": MSG, "min_p": 3}, 400),
    (CHAT, {"messages": MSG, "repeat_penalty": 0}, 400),
    (CHAT, {"messages": MSG, "stop": 5}, 400),
    (CHAT, {"messages": MSG, "stop": [1, 2]}, 400),
    (CHAT, {"messages": MSG, "stop": ["a"] * 17}, 400),
    (CHAT, {"messages": MSG, "stop": ["a"] * 5}, 400),  # OpenAI's ranges, #54 point 7
    (CHAT, {"messages": MSG, "temperature": 2.5}, 400),
    (CHAT, {"messages": MSG, "tool_choice": "required"}, 400),
    (CHAT, {"messages": MSG, "seed": "x"}, 400),
    (CHAT, {"messages": MSG, "seed": 1.5}, 400),
    (CHAT, {"messages": MSG, "stream": "yes"}, 400),
    (CHAT, {"messages": MSG, "stream_options": 1}, 400),
    (CHAT, {"messages": MSG, "n": 5}, 400),
    (CHAT, {"messages": MSG, "presence_penalty": 3}, 400),
    (CHAT, {"messages": MSG, "logit_bias": {"a": 1}}, 400),
    (CHAT, {"messages": MSG, "logit_bias": {"\u00b2": 1}}, 400),
    (CHAT, {"messages": MSG, "logit_bias": [1]}, 400),
    (CHAT, {"messages": MSG, "functions": [{"name": "f", "parameters": {}}]}, 400),
    (CHAT, {"messages": MSG, "tools": [{"type": "function"}]}, 400),
    (CHAT, {"messages": MSG, "model": 5}, 400),
    (CHAT, {"messages": MSG, "model": "nope"}, 404),
    (CHAT, {"messages": MSG * 300, "max_tokens": 1}, 400),
    ("/v1/completions", {}, 400),
    ("/v1/completions", {"prompt": []}, 400),
    ("/v1/completions", {"prompt": [10**9]}, 400),
    ("/v1/completions", {"prompt": [-1]}, 400),
    ("/v1/completions", {"prompt": ["a", [1]]}, 400),
    ("/v1/completions", {"prompt": [[1], [10**9]]}, 400),
    ("/v1/completions", {"prompt": ["x"] * 100}, 400),
    ("/v1/completions", {"prompt": 5}, 400),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400),
    ("/v1/completions", {"prompt": "x", "model": "nope"}, 404),
    ("/v1/nothing", {}, 404),
]
BAD_OLLAMA = [
    ("/api/chat", b"{", 400),
    ("/api/chat", {}, 400),
    ("/api/chat", {"messages": MSG}, 400),
    ("/api/chat", {"model": "nope", "messages": MSG}, 404),
    ("/api/chat", {"model": "tiny-chat", "messages": []}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": "x"}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": MSG, "options": {"temperature": "x"}}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": MSG, "options": {"num_predict": "x"}}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": MSG, "options": 5}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": MSG, "format": "yaml"}, 400),
    ("/api/chat", {"model": "tiny-chat", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400),
    ("/api/generate", {"model": "tiny-chat", "prompt": 5}, 400),
    ("/api/generate", {"model": "tiny-chat", "prompt": "x", "context": ["a"]}, 400),
    ("/api/generate", {"model": "tiny-chat", "prompt": "x", "context": [10**9]}, 400),
    ("/api/generate", {"model": "tiny-chat", "prompt": "x", "stream": "no"}, 400),
    ("/api/generate", {"model": "nope", "prompt": "x"}, 404),
    ("/api/show", {}, 400),
    ("/api/show", {"model": "nope"}, 404),
    ("/api/nothing", {}, 404),
]


@pytest.mark.parametrize("path,body,expected", BAD_V1 + BAD_OLLAMA)
def test_bad_input_gets_documented_4xx(server, path, body, expected):
    status, headers, raw = request(server, "POST", path, body, timeout=30)
    assert status == expected, raw[:300]
    doc = json.loads(raw)
    if path.startswith("/api/"):
        assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"]
    else:
        assert set(doc["error"]) >= {"message", "type", "param", "code"} and doc["error"]["message"]
    assert b"Traceback" not in raw


def test_wrong_methods_and_huge_bodies(server):
    status, _, raw = request(server, "GET", CHAT)
    assert status == 405 and "error" in json.loads(raw)
    # a body over the limit is refused from its Content-Length, before it is read
    s = socket.create_connection((server.host, server.port), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n"
        + f"Authorization: Bearer {KEY}\r\n\r\n".encode()
    )
    reply = read_until(s, b"\r\n\r\n")
    s.close()
    assert reply.startswith(b"HTTP/1.1 413")


def test_fuzzed_requests_never_5xx(server):
    """A seeded fuzz over the request fields (our stand-in for schemathesis):
    every answer is 200 or a documented 4xx, quickly; the server stays healthy."""
    rng = random.Random(7)
    values = [
        None,
        True,
        0,
        -1,
        1,
        2,
        0.5,
        1e308,
        -1e308,
        "",
        "x",
        "0",
        [],
        {},
        [1],
        ["a"],
        {"a": 1},
        "tiny-chat",
        [{"role": "user", "content": "x"}],
        10**20,
    ]
    fields = [
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "prompt",
        "options",
        "context",
        "logit_bias",
        "presence_penalty",
        "frequency_penalty",
        "raw",
        "format",
        "keep_alive",
        "response_format",
        "logprobs",
        "system",
    ]
    paths = [CHAT, "/v1/completions", "/api/chat", "/api/generate", "/api/show"]
    for i in range(120):
        body = {"model": "tiny-chat", "messages": MSG, "prompt": "hi", "max_tokens": 2, "options": {"num_predict": 2}}
        for _ in range(rng.randint(1, 4)):
            body[rng.choice(fields)] = rng.choice(values)
        if rng.random() < 0.3:
            body.pop(rng.choice(list(body)), None)
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = 2  # keep valid requests short
        if not isinstance(body.get("options"), dict) or "num_predict" not in body["options"]:
            body["options"] = {
                **(body.get("options") if isinstance(body.get("options"), dict) else {}),
                "num_predict": 2,
            }
        path = paths[i % len(paths)]
        t = time.perf_counter()
        status, _, raw = request(server, "POST", path, body, timeout=60)
        assert status in (200, 400, 404), (path, body, status, raw[:300])
        assert time.perf_counter() - t < 30
        if status != 200:
            json.loads(raw)["error"]
    assert request(server, "GET", "/health")[0] == 200
    wait_idle(server)


# --- tightkv client ------------------------------------------------------------------------------
def test_tightkv_client_with_api_key(server):
    import subprocess
    import sys

    _, doc = post(server, CHAT, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0})
    want = doc["choices"][0]["message"]["content"]
    base = [
        sys.executable,
        "-m",
        "tightkv.cli",
        "client",
        "hello",
        "--url",
        server.url + "/v1",
        "-n",
        "6",
        "--temperature",
        "0",
    ]
    for extra in ([], ["--no-stream"]):
        out = subprocess.run(base + extra + ["--api-key", KEY], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == want + "\n", out.stderr
    out = subprocess.run(
        base, capture_output=True, text=True, timeout=60, env={**__import__("os").environ, "TIGHTKV_API_KEY": "wrong"}
    )
    assert out.returncode == 1 and out.stderr.startswith("error: server answered 401")
    out = subprocess.run(base[:5] + ["--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot reach" in out.stderr and "Traceback" not in out.stderr


def test_keep_alive_zero_unloads_and_the_next_request_loads(server):
    status, doc = post(server, "/api/generate", {"model": "tiny-chat", "keep_alive": 0})
    assert status == 200 and doc["done_reason"] == "unload"
    deadline = time.monotonic() + 10
    while json.loads(request(server, "GET", "/api/ps")[2])["models"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(request(server, "GET", "/api/ps")[2])["models"] == []  # weights and caches freed
    body = {"model": "tiny-chat", "prompt": "hi", "stream": False, "keep_alive": "10m", "options": {"num_predict": 3}}
    status, doc = post(server, "/api/generate", body)
    assert status == 200 and doc["done"] and doc["eval_count"] <= 3
    (ps,) = json.loads(request(server, "GET", "/api/ps")[2])["models"]
    left = datetime.fromisoformat(ps["expires_at"]) - datetime.now(timezone.utc)
    assert timedelta(minutes=9) < left <= timedelta(minutes=10)  # keep_alive, honestly
    status, err = post(server, "/api/generate", {"model": "tiny-chat", "prompt": "hi", "keep_alive": "soon"})
    assert status == 400 and "keep_alive" in err["error"]
    status, _ = post(server, "/api/generate", {"model": "tiny-chat", "keep_alive": -1})  # forever again
    assert status == 200
