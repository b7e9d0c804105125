"""The server app in-process (no subprocess): /health while loading and after a
failed load, the OpenAPI document, scheduler limits, CLI errors."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tightkv.server.app import ServerConfig, create_app
from tightkv.engine.requests import TextRequest
from tightkv.server.scheduler import Job, Scheduler, Unavailable
from tiny_gguf import write_gemma3

starlette_testclient = pytest.importorskip("starlette.testclient")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("unit") / "unit.gguf")


def test_health_is_503_while_loading_then_ok(gguf):
    from tightkv import Model

    release = threading.Event()

    def slow_load():
        release.wait(30)
        return Model(gguf, threads=1)

    app = create_app(ServerConfig(model=str(gguf)), load=slow_load)
    with starlette_testclient.TestClient(app) as tc:
        r = tc.get("/health")
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        r = tc.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        assert r.headers["retry-after"] == "1"
        r = tc.post("/api/chat", json={"model": "unit", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json() == {"error": "Loading model"}
        release.set()
        for _ in range(300):
            if tc.get("/health").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert tc.get("/health").json() == {"status": "ok"}
        r = tc.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_failed_load_is_reported(gguf):
    failures = []

    def bad_load():
        raise RuntimeError("boom")

    app = create_app(ServerConfig(model=str(gguf)), load=bad_load, on_failure=failures.append)
    with starlette_testclient.TestClient(app) as tc:
        for _ in range(100):
            if failures:
                break
            threading.Event().wait(0.05)
        r = tc.get("/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Model failed to load"
        r = tc.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and "boom" not in r.text
    assert str(failures[0]) == "boom"


def test_openapi_documents_request_bodies(gguf):
    app = create_app(ServerConfig(model=str(gguf)), load=lambda: None)
    doc = app.openapi()
    for path in ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/api/show"):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert "messages" in chat["required"]
    for path in ("/v1/models", "/api/tags", "/api/version", "/health", "/metrics"):
        assert path in doc["paths"]


class _FakeModel:
    context_length = 100
    kv = "f16"

    def new_cache(self):
        return []

    def generate(self, ids, max_tokens, stream, cache, **kw):
        raise AssertionError("not reached")


def test_scheduler_bounds_the_queue():
    import asyncio

    loop = asyncio.new_event_loop()
    gate = threading.Event()

    def load():
        gate.wait(10)
        return _FakeModel()

    sch = Scheduler(load, parallel=1, max_queue=1)
    sch.start()
    job = Job(TextRequest([1]), loop)
    with pytest.raises(Unavailable, match="Loading"):
        sch.submit(job)
    sch.stop(timeout=0)  # stops once loaded
    gate.set()
    sch._thread.join(10)
    loop.close()

    sch = Scheduler(lambda: _FakeModel(), parallel=1, max_queue=1)
    sch.state = "ready"  # not started: jobs stay in the inbox
    sch.submit(Job(TextRequest([1]), loop))
    sch.submit(Job(TextRequest([1]), loop))
    with pytest.raises(Unavailable) as err:
        sch.submit(Job(TextRequest([1]), loop))
    assert err.value.retry_after >= 1


def test_serve_cli_errors_are_one_line(tmp_path, gguf):
    from test_server_helpers import free_port

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(gguf.read_bytes()[:1000])
    for args, text in [
        (["no-such-model-xyz"], "error:"),
        ([str(tmp_path / "missing.gguf")], "error:"),
        (["--port", "70000"], "--port"),
        (["--parallel", "0"], "--parallel"),
        ([str(bad), "--port", str(free_port())], "corrupt or truncated"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "tightkv.cli", "serve", *args], capture_output=True, text=True, timeout=120
        )
        assert out.returncode != 0 and text in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_a_job_being_prepared_still_counts_against_the_queue():
    """The worker tokenizes a job outside the lock; a submit meanwhile must see it (CI race)."""
    import asyncio

    loop = asyncio.new_event_loop()
    entered, release = threading.Event(), threading.Event()

    class SlowModel(_FakeModel):  # tokenizing its prompt takes until released
        chat_template = None

        def tokenize(self, text, add_bos=True):
            entered.set()
            release.wait(10)
            raise ValueError("done")

    sch = Scheduler(lambda: SlowModel(), parallel=1, max_queue=0)
    sch.start()
    try:
        for _ in range(100):
            if sch.state == "ready":
                break
            time.sleep(0.05)
        sch.submit(Job(TextRequest("a prompt"), loop))
        assert entered.wait(10)
        with pytest.raises(Unavailable):
            sch.submit(Job(TextRequest([1]), loop))
    finally:
        release.set()
        sch.stop()
        loop.close()


def test_a_lazy_load_is_seen_only_once_its_listing_knows_the_model(gguf):
    """A request that waits for a lazy load (the every-model server's first request) must
    find the model's listing filled in: the web page's document list reads its KV type
    to say which stored caches open warm (a race that showed in CI as 'stored')."""
    import asyncio

    from tightkv import Model
    from tightkv.server.pool import Resident, ensure_loaded

    told, release = threading.Event(), threading.Event()
    listing = {}

    def ready(model):
        told.set()
        release.wait(30)  # the listing is still being filled in
        listing["kv"] = str(model.kv)

    sch = Scheduler(lambda: Model(gguf, threads=1), parallel=1, max_queue=1, on_ready=ready, lazy=True)
    sch.start()
    resident = Resident(None, sch, pinned=False)

    async def wait_for_load():
        task = asyncio.ensure_future(ensure_loaded(resident, timeout=60))
        await asyncio.get_running_loop().run_in_executor(None, told.wait, 60)
        await asyncio.sleep(0.3)
        assert not task.done() and sch.model is None  # loaded, but not seen before its listing is
        release.set()
        await task
        return listing.get("kv")

    try:
        assert asyncio.run(wait_for_load()) == "kvarn4"
        assert sch.model is not None and sch.batch is not None
    finally:
        release.set()
        sch.stop(timeout=10)
