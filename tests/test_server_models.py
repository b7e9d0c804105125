"""Every model of the store served by name (#54 point 1), on a live `tightkv serve` with no
model, in a store of its own: the embedded Gemma 3 270M and Qwen2.5-Coder-0.5B-Instruct added
from its GGUF path by `tightkv create qwen-doc -f Modelfile` (num_ctx, a KV type, SYSTEM).
Through the official `openai` and `ollama` clients: both listed, each loaded by name on its
first request, `keep_alive` 0 unloading, `ps` and llama-server's `/models` telling the
truth, unknown names a 404 in each API's shape. With `--mem` room for one model: a request
for the other evicts the idle one (ps, and the process's RSS from /proc), the first comes
back on its next request, a stream in flight is never cut, and a model that could never fit
is a clear 400."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_server_helpers import openai_client, post, request, running

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")
pytestmark = pytest.mark.slow  # two real models loaded a dozen times: about 90 s on 2 cores

SYSTEM = "You are a terse assistant. Answer in one short sentence."
MODELFILE = f'''# Qwen with its own defaults
FROM {{path}}
PARAMETER num_ctx 1024
PARAMETER kv_cache_type q8_0
PARAMETER temperature 0
SYSTEM """{SYSTEM}"""
'''
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TIGHTKV_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "tightkv.cli", *args], check=False, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def qwen() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    return qwen_path()


@pytest.fixture(scope="module")
def home(tmp_path_factory, qwen) -> Path:
    """A store of its own: the embedded Gemma (its blob linked, its manifest copied), the
    compiled kernels shared, and qwen-doc made by `tightkv create`."""
    from tightkv.registry import DEFAULT_MODEL, embedded_path, lookup, manifest_path

    blob = embedded_path()  # in the user's store (assembled once)
    manifest = manifest_path(lookup(DEFAULT_MODEL))
    home = tmp_path_factory.mktemp("store")
    (home / "blobs").mkdir()
    (home / "blobs" / blob.name).symlink_to(blob)
    (home / "manifests" / "gemma3").mkdir(parents=True)
    (home / "manifests" / "gemma3" / "270m").write_bytes(manifest.read_bytes())
    kernels = Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv") / "kernels"
    if kernels.is_dir():
        (home / "kernels").symlink_to(kernels)
    modelfile = home / "Modelfile"
    modelfile.write_text(MODELFILE.format(path=qwen))
    made = cli(home, "create", "qwen-doc", "-f", str(modelfile))
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[-1] == "success"
    return home


def test_create_list_show_rm(home, qwen):
    """The created model shares the GGUF (a hard link, or the file itself: no copy), lists
    beside Gemma, shows its Modelfile; `rm` of a name made from Gemma keeps Gemma's blob."""
    doc = json.loads((home / "manifests" / "qwen-doc" / "latest").read_text())
    gguf = Path(doc["local_file"]) if doc["local_file"] else home / "blobs" / doc["digest"].replace(":", "-")
    assert os.path.samefile(gguf, qwen)
    assert doc["parameters"] == {"num_ctx": 1024, "kv_cache_type": "q8_0", "temperature": 0.0}
    listed = cli(home, "list").stdout
    assert "qwen-doc:latest" in listed and "gemma3:270m" in listed
    shown = cli(home, "show", "qwen-doc", "--modelfile").stdout
    for line in ("PARAMETER num_ctx 1024", "PARAMETER kv_cache_type q8_0", f'SYSTEM """{SYSTEM}"""'):
        assert line in shown
    (home / "Copyfile").write_text("FROM gemma3:270m\nPARAMETER top_k 5\n")
    assert cli(home, "create", "gemma-copy", "-f", str(home / "Copyfile")).returncode == 0
    gone = cli(home, "rm", "gemma-copy")
    assert gone.returncode == 0 and "deleted 'gemma-copy:latest'" in gone.stdout
    assert "gemma-copy" not in cli(home, "list").stdout
    gemma = json.loads((home / "manifests" / "gemma3" / "270m").read_text())["digest"].replace(":", "-")
    assert (home / "blobs" / gemma).exists()
    assert cli(home, "show", "gemma3:270m", "--parameters").returncode == 0
    bad = cli(home, "create", "x", "-f", str(home / "Badfile"))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1  # one line, no traceback


@pytest.fixture(scope="module")
def server(home):
    with running("--parallel", "2", env={"TIGHTKV_HOME": str(home)}, timeout=120) as srv:
        yield srv


def loaded(srv) -> dict[str, dict]:
    status, _, raw = request(srv, "GET", "/api/ps")
    assert status == 200
    return {m["name"]: m for m in json.loads(raw)["models"]}


def wait_for(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def test_openai_client_picks_each_model_by_name(server):
    client = openai_client(server)
    ids = {m.id for m in client.models.list()}
    assert {"gemma3:270m", "qwen-doc:latest"} <= ids
    assert loaded(server) == {}  # nothing loads before a request names it
    for name in ("qwen-doc", "gemma3"):
        reply = client.chat.completions.create(model=name, messages=ASK, max_tokens=4)
        assert reply.model in ("qwen-doc:latest", "gemma3:270m") and reply.usage.completion_tokens >= 1
    ps = loaded(server)
    assert set(ps) == {"gemma3:270m", "qwen-doc:latest"}
    assert ps["qwen-doc:latest"]["context_length"] == 1024 and ps["qwen-doc:latest"]["kv_cache_type"] == "q8_0"
    assert ps["gemma3:270m"]["context_length"] == 4096  # the server's default, not the Modelfile's
    # the Modelfile's SYSTEM comes first unless the request has its own; temperature 0: the same answer twice
    own = client.chat.completions.create(model="qwen-doc", messages=[{"role": "system", "content": SYSTEM}, *ASK])
    other = client.chat.completions.create(model="qwen-doc", messages=[{"role": "system", "content": "Hi."}, *ASK])
    plain = [client.chat.completions.create(model="qwen-doc", messages=ASK, max_tokens=8) for _ in range(2)]
    assert plain[0].usage.prompt_tokens == own.usage.prompt_tokens != other.usage.prompt_tokens
    assert plain[0].choices[0].message.content == plain[1].choices[0].message.content


def test_ollama_client_keep_alive_and_ps(server):
    client = ollama.Client(host=server.url)
    names = {m.model for m in client.list().models}
    assert {"gemma3:270m", "qwen-doc:latest"} <= names
    shown = client.show("qwen-doc")
    assert "num_ctx" in shown.parameters and shown.modelfile.count("PARAMETER") == 3
    reply = client.chat(model="qwen-doc", messages=ASK, keep_alive=0, options={"num_predict": 3})
    assert reply.done and reply.message.content
    wait_for(lambda: "qwen-doc:latest" not in loaded(server))  # unloaded once answered
    again = client.chat(model="qwen-doc", messages=ASK, keep_alive="10m", options={"num_predict": 3})
    assert again.load_duration > 0.2e9  # it waited for the load (a 503 it never saw)
    ps = {m.model: m for m in client.ps().models}
    left = ps["qwen-doc:latest"].expires_at.timestamp() - time.time()
    assert 500 < left <= 600
    loaded_now = client.generate(model="gemma3", prompt="", keep_alive=-1)  # Ollama's load request
    assert loaded_now.done_reason == "load" and "gemma3:270m" in loaded(server)


def test_every_client_on_the_two_models(server):
    """#54's check on one server of two models by name: openai's Responses (streamed), chat
    and embeddings and ollama's embed on each; anthropic's Messages with a forced tool
    (streamed) and count_tokens; LangChain's default structured output of a nested pydantic
    model on Qwen (its Modelfile's SYSTEM and num_ctx in force)."""
    anthropic = pytest.importorskip("anthropic")
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    client, local = openai_client(server), ollama.Client(host=server.url)
    for name, dim in (("gemma3", 640), ("qwen-doc", 896)):
        events = list(client.responses.create(model=name, input="Say hello.", max_output_tokens=8, stream=True))
        assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
        assert events[-1].response.usage.output_tokens >= 1 and events[-1].response.output_text
        vectors = client.embeddings.create(model=name, input=["a cat", "a kitten"]).data
        assert [len(v.embedding) for v in vectors] == [dim, dim]
        assert len(local.embed(model=name, input="a cat").embeddings[0]) == dim
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120).messages
    weather = {
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    with messages.stream(model="qwen-doc", max_tokens=40, tools=[weather], tool_choice=forced, messages=ask) as s:
        reply = s.get_final_message()
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and use.name == "get_weather" and set(use.input) == {"city"}
    assert messages.count_tokens(model="gemma3", messages=ask).input_tokens > 5

    class City(BaseModel):
        name: str
        country: str

    class Trip(BaseModel):
        title: str
        cities: list[City]

    llm = lc.ChatOpenAI(
        base_url=server.url + "/v1", api_key="unused", model="qwen-doc", temperature=0, max_tokens=200, max_retries=0
    )
    trip = llm.with_structured_output(Trip).invoke("Plan a short trip to two cities in France, as JSON.")
    assert isinstance(trip, Trip) and trip.cities and all(c.name for c in trip.cities)


def test_llama_server_router_routes(server):
    status, body = post(server, "/models/unload", {"model": "gemma3"})
    assert status == 200 and body == {"success": True}
    models = {m["id"]: m for m in json.loads(request(server, "GET", "/models")[2])["data"]}
    assert models["gemma3:270m"]["status"] == {"value": "unloaded"}
    assert post(server, "/models/load", {"model": "gemma3:270m"}) == (200, {"success": True})
    models = {m["id"]: m for m in json.loads(request(server, "GET", "/models")[2])["data"]}
    assert models["gemma3:270m"]["status"] == {"value": "loaded"}
    status, body = post(server, "/tokenize", {"model": "qwen-doc", "content": "hello world"})
    assert status == 200 and body["max_model_len"] == 1024


def test_unknown_model_is_a_404_in_each_shape(server, qwen):
    client = openai_client(server)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=ASK, max_tokens=2)
    assert err.value.body["type"] == "not_found_error" and err.value.body["code"] == "model_not_found"
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server.url).chat(model="no-such-model", messages=ASK)
    assert err.value.status_code == 404 and "not found" in err.value.error
    for name in (str(qwen), "hf.co/a/b/c.gguf"):  # files and hub names are not served by a request's say-so
        status, body = post(server, "/v1/chat/completions", {"model": name, "messages": ASK})
        assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = post(server, "/models/load", {"model": "nope"})
    assert status == 404 and "nope" in body["error"]["message"]


# --- within --mem --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(home, server):
    """A server whose --mem holds one of the two models (and half the other), not both,
    as `plan` prices them (the sizes /api/ps reports)."""
    from tightkv.eval.plan import RUNTIME_BYTES

    for name in ("gemma3", "qwen-doc"):
        assert post(server, "/models/load", {"model": name})[0] == 200
    sizes = [m["size"] for m in loaded(server).values()]
    for name in ("gemma3", "qwen-doc"):  # its memory back: one loaded server at a time on a small machine
        assert post(server, "/models/unload", {"model": name})[0] == 200
    assert len(sizes) == 2
    mem = RUNTIME_BYTES + max(sizes) + min(sizes) // 2
    with running("--mem", str(mem), "--parallel", "2", env={"TIGHTKV_HOME": str(home)}, timeout=120) as srv:
        yield srv


def rss(srv) -> int:
    """The server's resident memory in bytes (/proc/PID/status VmRSS)."""
    text = Path(f"/proc/{srv.proc.pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def test_a_request_for_the_other_model_evicts_the_idle_one(small):
    client = ollama.Client(host=small.url)
    before = rss(small)
    client.generate(model="gemma3", prompt="Hi", options={"num_predict": 2})
    with_gemma = rss(small)
    assert set(loaded(small)) == {"gemma3:270m"}
    client.chat(model="qwen-doc", messages=ASK, options={"num_predict": 2})
    assert set(loaded(small)) == {"qwen-doc:latest"}  # Gemma out, least recently used
    assert post(small, "/models/unload", {"model": "qwen-doc"})[0] == 200
    after = rss(small)
    print(f"RSS: {before >> 20} MiB empty, {with_gemma >> 20} with Gemma, {after >> 20} with Gemma evicted")
    assert after < with_gemma - (with_gemma - before) // 2  # Gemma's memory went back
    client.generate(model="gemma3", prompt="Hi", options={"num_predict": 2})  # and it comes back
    assert set(loaded(small)) == {"gemma3:270m"}


def test_a_stream_in_flight_is_never_cut_by_an_eviction(small):
    client = ollama.Client(host=small.url)
    client.generate(model="gemma3", prompt="", keep_alive="5m")  # loaded
    started, records, other = threading.Event(), [], {}

    def stream():
        for part in client.generate(model="gemma3", prompt="Count: 1, 2, 3,", stream=True, options={"num_predict": 40}):
            records.append(part)
            started.set()

    def ask_qwen():
        other["reply"] = client.chat(model="qwen-doc", messages=ASK, options={"num_predict": 2})
        other["at"] = time.monotonic()

    first = threading.Thread(target=stream)
    first.start()
    assert started.wait(60)
    second = threading.Thread(target=ask_qwen)
    second.start()
    first.join(120)
    ended = time.monotonic()
    second.join(120)
    assert records[-1].done and records[-1].eval_count == 40  # every token, no error line
    assert other["reply"].done and other["at"] > ended  # Qwen loaded once Gemma's stream was done
    assert set(loaded(small)) == {"qwen-doc:latest"}


def test_a_model_that_can_never_fit_is_a_clear_400(small):
    client = ollama.Client(host=small.url)
    big = {"num_ctx": 32768, "kv_cache_type": "f16"}  # Qwen's whole trained context in f16: 384 MiB more KV
    statuses = [s.status for s in client.create(model="qwen-big", from_="qwen-doc", parameters=big, stream=True)]
    assert statuses[0] == "gathering model components" and statuses[-1] == "success"
    with pytest.raises(openai.BadRequestError) as err:  # a 4xx: no retry can help
        openai_client(small).chat.completions.create(model="qwen-big", messages=ASK, max_tokens=2)
    assert err.value.body["code"] == "model_too_large" and "--mem" in err.value.body["message"]
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="qwen-big", messages=ASK)
    assert err.value.status_code == 400 and "needs" in err.value.error
    assert client.delete("qwen-big").status == "success"
    assert "qwen-big:latest" not in {m.model for m in client.list().models}


def test_a_registry_name_not_pulled_is_pulled_on_its_first_request(tmp_path):
    """A known registry name is pulled when a request first names it (progress in the log),
    then loaded and answered: here smollm2:135m from a hub on loopback, a tiny Gemma in its place."""
    from fake_hub import FakeHub
    from tightkv import registry
    from tiny_gguf import write_gemma3

    smol = registry.CATALOG["smollm2:135m"]
    home = tmp_path / "home"
    home.mkdir()
    kernels = Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv") / "kernels"
    if kernels.is_dir():
        (home / "kernels").symlink_to(kernels)
    with FakeHub() as hub:
        hub.add(smol.repo, smol.file, write_gemma3(tmp_path / "hub.gguf").read_bytes())
        with running(env={"HF_ENDPOINT": hub.url, "TIGHTKV_HOME": str(home)}) as srv:
            status, body = post(srv, "/v1/completions", {"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 3})
            assert status == 200 and body["model"] == "smollm2:135m" and body["usage"]["completion_tokens"] >= 1
            assert "pulling smollm2:135m" in srv.output()
            assert "smollm2:135m" in {m["name"] for m in json.loads(request(srv, "GET", "/api/tags")[2])["models"]}
