"""The official `openai` client and `tightkv client` against a live `tightkv serve`
of the embedded Gemma 3 270M; queue overflow and clients killed mid-stream.

One server subprocess for the module: context 2048, 2 requests decoded at once,
2 more may wait."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tightkv.server.scheduler import RELEASE_AFTER_S

from test_server_helpers import hard_close, openai_client, post, read_until, request, running, stream_socket, wait_idle

openai = pytest.importorskip("openai")

MODEL = "gemma3:270m"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with running("--ctx", "2048", "--parallel", "2", "--max-queue", "2") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def ask(client, content, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0, **kw
    )


def test_models_list(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "tightkv"


def test_chat_streamed_and_not_agree_with_usage(client):
    whole = ask(client, "Name three colors.", max_tokens=16)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 16 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    chunks = list(ask(client, "Name three colors.", max_tokens=16, stream=True, stream_options={"include_usage": True}))
    *content, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in content)
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == text
    assert content[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1


def test_stop_strings(client):
    base = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0)
    text = base.choices[0].text
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[2]
    cut = text[: text.index(stop)]
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0, stop=[stop, "never-seen"]
    )
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_sampling_extras_and_seed(client):
    extra = {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1}
    a, b = (
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=10,
            temperature=0.9,
            top_p=0.95,
            seed=42,
            extra_body=extra,
        )
        for _ in range(2)
    )
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logit_bias_and_penalties(server, client):
    """OpenAI's logit_bias bans or forces a token; frequency and presence penalties steer a
    repetitive continuation the way `Model.generate` with the same options does (llama.cpp's
    penalties over the last 64 tokens of prompt and reply)."""
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"

    def complete(**kw):
        return client.completions.create(
            model=MODEL, prompt=prompt, **{"max_tokens": 8, "temperature": 0, **kw}
        ).choices[0]

    base = complete().text
    _, toks = post(server, "/tokenize", {"content": base, "add_special": False, "with_pieces": True})
    first = toks["tokens"][0]  # {"id", "piece"}
    assert base.startswith(first["piece"])
    assert not complete(logit_bias={str(first["id"]): -100}).text.startswith(first["piece"])
    _, forced = post(server, "/tokenize", {"content": " dog", "add_special": False})
    assert complete(logit_bias={str(forced["tokens"][0]): 100}, max_tokens=1).text == " dog"
    steered = complete(frequency_penalty=1.5, presence_penalty=1.0).text
    assert steered != base
    status, doc = post(
        server,
        "/api/generate",
        {
            "model": MODEL,
            "prompt": prompt,
            "raw": True,
            "stream": False,
            "options": {
                "num_predict": 8,
                "temperature": 0,
                "repeat_penalty": 1.0,
                "frequency_penalty": 1.5,
                "presence_penalty": 1.0,
            },
        },
    )
    assert status == 200 and doc["response"] == steered
    for bad in (
        {"logit_bias": {"x": 1}},
        {"logit_bias": {"5": 101}},
        {"logit_bias": {"99999999": 1}},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
    ):
        with pytest.raises(openai.BadRequestError):
            complete(**bad)


def test_errors_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, "hi", max_tokens=100_000)
    assert err.value.status_code == 400 and err.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])


def test_concurrent_clients_get_their_own_answers(client):
    prompts = ["The sky is", "My favourite food is", "Water boils at"]
    alone = [ask(client, p, max_tokens=12).choices[0].message.content for p in prompts]
    together: list = [None] * 3

    def run(i):
        together[i] = "".join(
            c.choices[0].delta.content or "" for c in ask(client, prompts[i], max_tokens=12, stream=True)
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone


def test_ollama_chat_on_the_real_model(server):
    status, doc = post(
        server,
        "/api/chat",
        {
            "model": MODEL,
            "stream": False,
            "messages": [{"role": "user", "content": "Say hello."}],
            "options": {"num_predict": 8, "temperature": 0},
        },
    )
    assert status == 200 and doc["message"]["content"] and doc["eval_count"] <= 8
    status, doc = post(
        server,
        "/api/generate",
        {"model": "gemma3", "prompt": "1, 2, 3,", "stream": False, "options": {"num_predict": 6, "temperature": 0}},
    )
    assert status == 200 and doc["response"]


def test_tightkv_client_both_modes(server, client):
    want = ask(client, "Say hello.", max_tokens=10).choices[0].message.content
    base = [
        sys.executable,
        "-m",
        "tightkv.cli",
        "client",
        "Say hello.",
        "--url",
        server.url,
        "-n",
        "10",
        "--temperature",
        "0",
    ]
    for extra in ([], ["--no-stream"]):
        out = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout == want + "\n"


def test_tightkv_client_samples_like_run_by_default(server, client):
    """No sampling flags: greedy, as `tightkv run` (the server's own OpenAI default is 1.0);
    the flags `run` has reach the server, extras included."""
    question = "What is the capital of France?"
    greedy = ask(client, question, max_tokens=12).choices[0].message.content
    cmd = [sys.executable, "-m", "tightkv.cli", "client", question, "--url", server.url, "-n", "12"]
    for _ in range(2):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout == greedy + "\n", (out.stdout, out.stderr)
    sampled = (
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=12,
            temperature=1.5,
            seed=7,
            extra_body={"top_k": 50, "repeat_penalty": 1.3},
        )
        .choices[0]
        .message.content
    )
    flags = ["--temperature", "1.5", "--seed", "7", "--top-k", "50", "--repeat-penalty", "1.3"]
    out = subprocess.run(cmd + flags, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == sampled + "\n", (out.stdout, out.stderr)
    assert sampled != greedy  # the flags changed the answer, so they were sent


def test_full_queue_answers_503_with_retry_after(server):
    """2 decoding + 2 waiting fill this server; more are refused at once."""
    wait_idle(server)
    body = {
        "messages": [{"role": "user", "content": "Count to one hundred."}],
        "max_tokens": 300,
        "temperature": 0,
        "stream": True,
    }
    socks = [stream_socket(server, CHAT, body) for _ in range(6)]
    try:
        heads = [read_until(s, b"\r\n\r\n") for s in socks]
        statuses = [int(h.split(b" ", 2)[1]) for h in heads]
        assert sorted(statuses) == [200] * 4 + [503] * 2, statuses
        for head in heads:
            if b" 503 " in head.split(b"\r\n")[0]:
                assert b"\r\nretry-after: " in head.lower()
                # the body follows the head: an OpenAI-shaped error
                sock = socks[heads.index(head)]
                rest = head.split(b"\r\n\r\n", 1)[1] + sock.recv(65536)
                assert json.loads(rest)["error"]["type"] == "unavailable_error"
    finally:
        for s in socks:
            hard_close(s, reset=True)
    wait_idle(server, timeout=30)


KILLED_CLIENT = r"""
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
c.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "Tell a long story."}],
          "max_tokens": 400, "stream": True}), {"Content-Type": "application/json"})
r = c.getresponse()
while True:
    line = r.readline()
    if line.startswith(b"data: ") and b'"content":""' not in line:
        print("streaming", flush=True)
        break
import time
time.sleep(600)
"""


def test_killed_clients_leave_no_leaked_generation(server):
    """20 clients die mid-stream (4 killed processes, 16 sockets closed with RST or
    FIN): every generation stops (cancelled, or finished before the server saw its
    client go), caches are freed, CPU goes idle and memory comes back within 10% of
    the baseline."""
    proc = psutil.Process(server.proc.pid)
    wait_idle(server)
    status, _, _ = request(
        server, "POST", CHAT, {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 30, "stream": True}
    )
    assert status == 200
    before = wait_idle(server)
    time.sleep(RELEASE_AFTER_S + 0.5)  # the idle worker has handed freed memory back
    baseline = proc.memory_info().rss
    for i in range(20):
        if i % 5 == 0:
            child = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, str(server.port)], stdout=subprocess.PIPE)
            assert child.stdout.readline() == b"streaming\n"
            child.kill()
            child.wait(10)
            child.stdout.close()
        else:
            sock = stream_socket(
                server,
                CHAT,
                {
                    "messages": [{"role": "user", "content": f"Story number {i}."}],
                    "max_tokens": 400,
                    "stream": True,
                    "temperature": 0.7,
                    "seed": i,
                },
            )
            read_until(sock, b"data: ", 3)
            hard_close(sock, reset=i % 2 == 0)
    after = wait_idle(server, timeout=15)
    time.sleep(RELEASE_AFTER_S + 0.5)
    cancelled = after["requests_cancelled_total"] - before["requests_cancelled_total"]
    served = after["requests_served_total"] - before["requests_served_total"]
    # a sampled reply may end (its end-of-turn token) before the server sees its client go
    assert cancelled + served == 20 and cancelled >= 10, (cancelled, served)
    assert after["kv_cache_bytes"] == 0
    # CPU idle: under 0.3 s of CPU time over 2 s of wall time
    t0 = sum(proc.cpu_times()[:2])
    time.sleep(2.0)
    busy = sum(proc.cpu_times()[:2]) - t0
    assert busy < 0.3, f"server used {busy:.2f} s of CPU while idle"
    rss = proc.memory_info().rss
    assert rss <= 1.10 * baseline, f"RSS {rss / 2**20:.0f} MiB vs baseline {baseline / 2**20:.0f} MiB"
    assert request(server, "GET", "/health")[0] == 200
