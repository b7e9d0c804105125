"""The `/v1/documents` routes on a live `tightkv serve` of the embedded model (a private
TIGHTKV_HOME): upload (file or text), the load as SSE, asking with quoted spans, the clear
errors, the store shared with `tightkv ask`, and chat streams that keep flowing while a
document loads."""

from __future__ import annotations

import json
import threading
import time

import pytest

from cli_helpers import cli, private_home, seed_embedded
from test_server_helpers import openai_client, post, request, running
from web_helpers import FACT, FACT_DOC, QUESTION, events, tiny_pdf, upload


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = private_home(tmp_path_factory.mktemp("docs"))
    seed_embedded(home)
    return home


@pytest.fixture(scope="module")
def server(home):
    with running("--ctx", "4096", env={"TIGHTKV_HOME": str(home)}) as srv:
        yield srv


def loaded(server, doc_id: str) -> dict:
    """Follow a document's load to its end; the `loaded` record (the test fails on an error event)."""
    evs = events(server, f"/v1/documents/{doc_id}/events")
    assert evs[-1]["type"] == "loaded", evs[-1]
    return evs[-1]["document"]


def test_upload_follow_the_load_and_ask(server):
    status, rec = upload(server, "kestrel.md", FACT_DOC.encode())
    assert status == 202 and rec["name"] == "kestrel.md" and rec["status"] in ("queued", "loading")
    evs = events(server, f"/v1/documents/{rec['id']}/events")
    progress = [e for e in evs if e["type"] == "progress"]
    assert progress and progress[-1]["done"] == progress[-1]["total"] > 0 and progress[-1]["rate"] > 0
    doc = evs[-1]["document"]
    assert evs[-1]["type"] == "loaded" and doc["status"] == "loaded" and doc["mode"] == "full"
    assert doc["tokens"] == progress[-1]["total"] and doc["kv"] == "kvarn4" and doc["kv_bytes"] > 0
    assert doc["source"] == "prefill" and doc["warm"] is False

    status, answer = post(server, f"/v1/documents/{rec['id']}/ask", {"question": QUESTION}, timeout=300)
    assert status == 200 and FACT in answer["answer"] and answer["mode"] == "full"
    _, _, raw = request(server, "GET", f"/v1/documents/{rec['id']}/text")
    text = json.loads(raw)["text"]
    assert any(FACT in q["text"] and text[q["start"] : q["end"]] == q["text"] for q in answer["quotes"])

    evs = events(server, f"/v1/documents/{rec['id']}/ask", {"question": QUESTION, "stream": True})
    deltas = "".join(e["text"] for e in evs if e["type"] == "delta")
    assert FACT in deltas and evs[-1]["type"] == "answer" and FACT in evs[-1]["answer"]

    status, again = upload(server, "same-text.md", FACT_DOC.encode())  # the same text: already open
    assert status == 202 and again["id"] == rec["id"] and again["status"] == "loaded" and again["source"] == "ram"
    _, _, raw = request(server, "GET", "/v1/documents")
    row = next(r for r in json.loads(raw)["data"] if r["id"] == rec["id"])
    assert row["cached"] is True and row["tokens"] == doc["tokens"] and row["name"] == "kestrel.md"


def test_pdf_html_and_pasted_text(server):
    status, rec = upload(
        server,
        "kestrel.pdf",
        tiny_pdf(["The keeper of the Kestrel Point lighthouse is Orla Brennan.", "The tower stands 31 metres tall."]),
        mode="full",
    )
    assert status == 202, rec
    assert loaded(server, rec["id"])["mode"] == "full"
    status, rec = upload(server, "page.html", b"<h1>Ferries</h1><p>The ferry leaves at noon.</p>")
    assert status == 202
    _, _, raw = request(server, "GET", f"/v1/documents/{rec['id']}/text")
    assert json.loads(raw)["text"] == "# Ferries\n\nThe ferry leaves at noon.\n"
    status, rec = post(server, "/v1/documents", {"text": "The museum opens at ten.", "name": "notes"})
    assert status == 202 and rec["name"] == "notes"
    assert loaded(server, rec["id"])["tokens"] > 0


def test_clear_errors(server):
    status, body = upload(server, "broken.pdf", b"%PDF-1.7\n1 0 obj garbage")
    assert status == 400 and body["error"]["message"].startswith("broken.pdf: not a readable PDF")
    assert body["error"]["code"] == "unreadable_document"
    status, body = upload(server, "sheet.xlsx", b"PK\x03\x04")
    assert status == 400 and "only text, Markdown, HTML and PDF" in body["error"]["message"]
    status, body = upload(server, "a.txt", b"x", mode="everything")
    assert status == 400 and body["error"]["param"] == "mode"
    status, body = post(server, "/v1/documents", {"text": "   "})
    assert status == 400 and body["error"]["message"] == "the document is empty"
    status, body = post(server, "/v1/documents/0123456789abcdef/ask", {"question": "Who?"})
    assert status == 404 and body["error"]["code"] == "document_not_found"


def test_full_mode_on_a_document_past_the_context(server, essays_file):
    text = essays_file.read_text()[:30000]  # about 7,000 tokens: past the 4,096-token context
    status, rec = post(server, "/v1/documents", {"text": text, "name": "essays.txt", "mode": "full"})
    assert status == 202
    evs = events(server, f"/v1/documents/{rec['id']}/events")
    err = evs[-1]
    assert err["type"] == "error" and err["status"] == 400 and err["error"]["code"] == "context_length_exceeded"
    assert err["error"]["message"].startswith("essays.txt is ") and "choose auto or RLV mode" in err["error"]["message"]
    _, _, raw = request(server, "GET", f"/v1/documents/{rec['id']}")
    assert json.loads(raw)["status"] == "failed"
    status, rec = post(server, f"/v1/documents/{rec['id']}/open", {"mode": "auto"})  # RLV reads it in parts
    assert status == 202
    doc = loaded(server, rec["id"])
    assert doc["mode"] == "rlv" and doc["tokens"] > 4096


def test_rlv_mode_streams_its_reads(server, essays_file):
    essay = essays_file.read_text()[:12000]  # about 2,800 tokens: past the working memory, so auto reads in RLV
    text = FACT_DOC + "\n## Essays\n\n" + essay
    status, rec = post(server, "/v1/documents", {"text": text, "name": "long.md"})
    assert status == 202 and loaded(server, rec["id"])["mode"] == "rlv"
    evs = events(server, f"/v1/documents/{rec['id']}/ask", {"question": QUESTION, "stream": True})
    reads = [e for e in evs if e["type"] == "read"]
    answer = evs[-1]
    assert reads and reads[0]["read"] == 1 and reads[0]["kind"] == "lookup" and reads[0]["sections"]
    assert answer["type"] == "answer" and answer["mode"] == "rlv" and FACT in answer["answer"]
    assert any(FACT in q["text"] and text.startswith(q["text"], q["start"]) for q in answer["quotes"])


@pytest.mark.slow  # two `tightkv ask` processes
def test_the_store_is_shared_with_tightkv_ask(server, home, tmp_path):
    path = tmp_path / "kestrel.md"
    path.write_text(FACT_DOC)
    status, rec = upload(server, "kestrel.md", FACT_DOC.encode())
    assert status == 202 and loaded(server, rec["id"])["tokens"] > 0
    env = {"TIGHTKV_HOME": str(home)}
    out = cli("ask", "--doc", str(path), "--json", QUESTION, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["document"]["cache_source"] == "disk" and FACT in result["answers"][0]["answer"]

    other = tmp_path / "ferry.md"  # asked from the terminal first: listed here, and opened warm
    other.write_text("# Ferry\n\nThe ferry to the outer islands leaves twice a day, at nine and at four.\n")
    assert cli("ask", "--doc", str(other), "--json", "When does the ferry leave?", env=env, timeout=300).returncode == 0
    _, _, raw = request(server, "GET", "/v1/documents")
    row = next(r for r in json.loads(raw)["data"] if r["name"] == "ferry.md")
    assert row["cached"] is True and row["status"] == "stored"
    status, _ = post(server, f"/v1/documents/{row['id']}/open", {})
    doc = loaded(server, row["id"])
    assert status == 202 and doc["source"] == "disk" and doc["warm"] is True


def test_chat_streams_flow_while_a_document_loads(server, essays_file):
    client = openai_client(server, timeout=300)
    stamps: list[float] = []
    first, done = threading.Event(), threading.Event()

    def chat():
        stream = client.completions.create(
            model="gemma3:270m", prompt="Once upon a time", max_tokens=400, temperature=0, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.monotonic())
                first.set()
            if done.is_set():
                stream.close()  # the server stops the generation
                break

    worker = threading.Thread(target=chat)
    worker.start()
    assert first.wait(120)
    text = essays_file.read_text()[40000:46500]  # about 1,600 tokens: full mode, four prefill chunks
    status, rec = post(server, "/v1/documents", {"text": text, "name": "essay.txt"})
    assert status == 202
    seen: dict[str, float] = {}
    for t, e in events_with_times(server, f"/v1/documents/{rec['id']}/events"):
        if e["type"] == "progress" and e["done"] > 0:
            seen.setdefault("first_chunk", t)
        if e["type"] == "loaded":
            seen["loaded"] = t
    done.set()
    worker.join(300)
    during = [s for s in stamps if seen["first_chunk"] < s < seen["loaded"]]
    assert len(during) >= 3, (len(stamps), seen, stamps[:5])


def events_with_times(server, path: str) -> list[tuple[float, dict]]:
    """An SSE stream's events, each with the time it arrived."""
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=300)
    conn.request("GET", path, headers=server.headers())
    resp = conn.getresponse()
    out = []
    try:
        for line in resp:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                out.append((time.monotonic(), json.loads(line[6:])))
    finally:
        conn.close()
    return out


def test_a_server_at_capacity_says_so(home):
    with running("--ctx", "2048", "--parallel", "1", "--max-queue", "0", env={"TIGHTKV_HOME": str(home)}) as srv:
        client = openai_client(srv, timeout=300)
        first = threading.Event()

        def chat():
            for chunk in client.completions.create(
                model="gemma3:270m", prompt="Once upon a time", max_tokens=120, temperature=0, stream=True
            ):
                first.set()

        worker = threading.Thread(target=chat)
        worker.start()
        assert first.wait(120)
        status, headers, raw = request(srv, "POST", "/v1/documents", {"text": FACT_DOC})
        worker.join(300)
    body = json.loads(raw)
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert body["error"]["message"] == "the server is busy: too many requests are waiting"
