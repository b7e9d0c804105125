"""Ollama's Modelfile (`tightkv.modelfile`) and the store's created models
(`registry.create_model`, `find_created`, `remove`, `resolve`) in a store of their own, on a
tiny GGUF: no model runs here."""

from __future__ import annotations

import os

import pytest

from tightkv.errors import TightKVError
from tightkv.modelfile import Modelfile, parse, sampling_defaults, with_system
from tiny_gguf import write_gemma3


def test_parse_reads_ollama_syntax():
    mf = parse(
        "# a comment\n"
        "from ./model.gguf\n"
        "PARAMETER num_ctx 2048\n"
        "PARAMETER kv_cache_type Q8_0\n"
        "PARAMETER temperature 0.2\n"
        'PARAMETER stop "<|im_end|>"\n'
        "PARAMETER stop END\n"
        'SYSTEM """Be brief.\n'
        'Really."""\n'
        'TEMPLATE "{{ .Prompt }}"\n'
    )
    assert mf.base == "./model.gguf"
    assert mf.parameters == {
        "num_ctx": 2048,
        "kv_cache_type": "Q8_0",
        "temperature": 0.2,
        "stop": ["<|im_end|>", "END"],
    }
    assert mf.system == "Be brief.\nReally." and mf.template == "{{ .Prompt }}"
    assert parse(mf.text()) == mf  # what `show --modelfile` prints reads back the same
    assert sampling_defaults(mf.parameters) == {"temperature": 0.2, "stop": ["<|im_end|>", "END"]}


@pytest.mark.parametrize(
    "text, error",
    [
        ("PARAMETER num_ctx 5\n", "no FROM"),
        ("FROM x\nPARAMETER num_ctx many\n", "line 2: 'num_ctx' takes an integer"),
        ("FROM x\nPARAMETER num_ctx 0\n", "num_ctx must be positive"),
        ("FROM x\nPARAMETER mirostat 1\n", "unknown parameter 'mirostat'"),
        ("FROM x\nPARAMETER kv_cache_type q9_9\n", "kv_cache_type"),
        ("FROM x\nADAPTER lora.gguf\n", "ADAPTER is not supported"),
        ("FROM x\nWHATEVER y\n", "unknown instruction 'WHATEVER'"),
        ('FROM x\nSYSTEM """never closed\n', "unterminated"),
    ],
)
def test_parse_errors_name_the_line(text, error):
    with pytest.raises(TightKVError, match=error):
        parse(text)


def test_with_system_only_where_the_chat_has_none():
    ask = [{"role": "user", "content": "hi"}]
    assert with_system(ask, "S")[0] == {"role": "system", "content": "S"}
    own = [{"role": "system", "content": "mine"}, *ask]
    assert with_system(own, "S") == own and with_system(ask, None) == ask


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGHTKV_HOME", str(tmp_path / "home"))
    return tmp_path


def test_create_links_the_gguf_and_rm_removes_only_the_name(store):
    from tightkv.registry import create_model, find_created, list_installed, remove, resolve

    gguf = write_gemma3(store / "tiny.gguf")
    statuses = []
    made = create_model("Tiny", Modelfile(str(gguf), {"num_ctx": 64}, "Be brief."), report=statuses.append)
    assert made.name == "tiny:latest" and made.parameters == {"num_ctx": 64} and made.system == "Be brief."
    assert [s["status"] for s in statuses][-2:] == ["writing manifest", "success"]
    assert os.path.samefile(resolve("tiny"), gguf)  # the blob is the file itself: no copy
    child = create_model("tiny:v2", Modelfile("tiny", {"temperature": 0.5}))  # FROM a name: inherits
    assert child.parameters == {"num_ctx": 64, "temperature": 0.5} and child.system == "Be brief."
    assert child.digest == made.digest
    assert {m.name for m in list_installed()} == {"tiny:latest", "tiny:v2"}
    assert remove(["tiny"]) == ["tiny:latest"]
    assert find_created("tiny") is None and resolve("tiny:v2").is_file()  # the blob stays for v2
    remove(["tiny:v2"])
    assert gguf.is_file() and list_installed() == []  # the user's file is never deleted


def test_create_refuses_bad_names_and_files(store):
    from tightkv.registry import create_model

    (store / "notes.gguf").write_text("not a model")
    with pytest.raises(TightKVError, match="not a GGUF"):
        create_model("x", Modelfile(str(store / "notes.gguf")))
    with pytest.raises(TightKVError, match="invalid model name"):
        create_model("a/b", Modelfile(str(store / "notes.gguf")))
    with pytest.raises(TightKVError, match="unknown model"):
        create_model("x", Modelfile("no-such-model"))
    with pytest.raises(TightKVError, match="names the registry's gemma3:270m"):
        create_model("gemma3", Modelfile(str(store / "notes.gguf")))
