"""Bad input gets a one-line error naming the file and the problem."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tightkv.errors import GGUFError, TightKVError
from tightkv.gguf.reader import read_gguf
from tiny_gguf import write_gemma3, write_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("m") / "tiny.gguf")


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError) as err:
        read_gguf(tmp_path / "nope.gguf")
    assert "nope.gguf" in _one_line(err) and "no such file" in str(err.value)


def test_not_a_gguf(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFError) as err:
        read_gguf(p)
    assert "not a GGUF" in _one_line(err)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.99])
def test_truncated_file(tiny, tmp_path, keep):
    data = tiny.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GGUFError) as err:
        read_gguf(p)
    assert "cut.gguf" in _one_line(err) and "truncated" in str(err.value)


def test_corrupt_header(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    data[8:24] = b"\xff" * 16  # absurd tensor and key counts
    p = tmp_path / "corrupt.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError) as err:
        read_gguf(p)
    assert "corrupt.gguf" in _one_line(err)


def test_unsupported_architecture(tmp_path):
    p = write_gguf(tmp_path / "arch.gguf", "mamba9", {"{arch}.block_count": 1}, {"x.weight": [[0.0] * 32]})
    from tightkv import Model

    with pytest.raises(GGUFError) as err:
        Model(p)
    assert "unsupported architecture 'mamba9'" in _one_line(err)


def test_unsupported_tensor_type(tmp_path):
    """A block type no model file uses for weights (llama.cpp's activation type Q8_1)."""
    p = write_gemma3(tmp_path / "q8_1.gguf", qtypes={"blk.0.attn_q.weight": "Q8_1"})
    from tightkv import Model

    with pytest.raises(GGUFError) as err:
        Model(p)
    assert "Q8_1" in _one_line(err) and "blk.0.attn_q.weight" in str(err.value)


def test_unknown_model_name():
    from tightkv.registry import resolve

    with pytest.raises(TightKVError) as err:
        resolve("nosuchmodel:7b")
    assert "unknown model 'nosuchmodel:7b'" in _one_line(err)


def _cli(*args, input=None):
    return subprocess.run(
        [sys.executable, "-m", "tightkv.cli", *args], capture_output=True, text=True, input=input, timeout=300
    )


def test_cli_errors_are_one_line(tmp_path, tiny):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:5000])
    for args in (
        ["run", str(tmp_path / "missing.gguf"), "hi"],
        ["run", str(cut), "hi"],
        ["run", str(tiny), "hi", "-n", "100000"],
        ["run", str(tiny), "hi", "--kv", "q9_9"],
        ["run", str(tiny), "hi", "--temperature", "-1"],
    ):
        r = _cli(*args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_cli_runs_a_gguf_path(tiny):
    r = _cli("run", str(tiny), "hello", "-n", "5", "--verbose")
    assert r.returncode == 0, r.stderr
    assert "eval count:           5 token(s)" in r.stderr


def test_cli_debug_shows_traceback(tmp_path):
    r = _cli("--debug", "run", str(tmp_path / "missing.gguf"), "hi")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_copy_is_independent_of_cache_dir(tiny, tmp_path):
    shutil.copy(tiny, tmp_path / "copy.gguf")
    assert read_gguf(tmp_path / "copy.gguf").architecture == "gemma3"
