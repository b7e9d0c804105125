"""Ollama's /api/pull (progress as NDJSON records) and /api/delete against a live server,
the downloads from a hub-like server on loopback (tests/fake_hub.py)."""

from __future__ import annotations

import json

import pytest

from fake_hub import FakeHub
from test_server_helpers import LiveServer, post, request
from tightkv import registry
from tiny_gguf import write_gemma3

SMOL = registry.CATALOG["smollm2:135m"]


@pytest.fixture(scope="module")
def hub_and_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pull")
    data = write_gemma3(tmp / "hub.gguf").read_bytes()
    with FakeHub() as hub:
        hub.add(SMOL.repo, SMOL.file, data)
        srv = LiveServer(
            str(write_gemma3(tmp / "tiny-chat.gguf")), env={"HF_ENDPOINT": hub.url, "TIGHTKV_HOME": str(tmp / "home")}
        )
        try:
            yield hub, srv.wait_ready()
        finally:
            srv.stop()


def test_pull_streams_progress_then_delete(hub_and_server):
    _, server = hub_and_server
    status, _, raw = request(server, "POST", "/api/pull", {"model": "smollm2:135m"})
    records = [json.loads(line) for line in raw.decode().splitlines()]
    assert status == 200 and records[0] == {"status": "pulling manifest"} and records[-1] == {"status": "success"}
    progress = [r for r in records if "completed" in r]
    assert progress and progress[-1]["completed"] == progress[-1]["total"] > 0
    assert progress[-1]["digest"].startswith("sha256:") or progress[-1]["digest"]
    assert {"status": "verifying sha256 digest"} in records and {"status": "writing manifest"} in records

    status, doc = post(server, "/api/pull", {"model": "smollm2:135m", "stream": False})  # pulled: at once
    assert status == 200 and doc == {"status": "success"}
    status, _, _ = request(server, "DELETE", "/api/delete", {"model": "smollm2:135m"})
    assert status == 200
    status, _, raw = request(server, "DELETE", "/api/delete", {"model": "smollm2:135m"})
    assert status == 404 and "not found" in json.loads(raw)["error"]


def test_pull_of_the_served_model_and_of_nothing(hub_and_server):
    _, server = hub_and_server
    status, doc = post(server, "/api/pull", {"model": "tiny-chat", "stream": False})
    assert status == 200 and doc == {"status": "success"}
    status, doc = post(server, "/api/pull", {"model": "no-such-model:1b", "stream": False})
    assert status == 400 and doc["error"]
    status, _, raw = request(server, "DELETE", "/api/delete", {"model": "tiny-chat"})
    assert status == 400 and "serves" in json.loads(raw)["error"]
