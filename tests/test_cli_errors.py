"""Each bad input gets one 'error: ...' line on stderr and a non-zero exit, no
traceback (``--debug`` shows it): unknown names, missing and corrupt files, no disk
space, bad flag values, an overflowing context, RoPE-scaling limits."""

from __future__ import annotations

import pytest

from cli_helpers import assert_one_line_error, cli, private_home
from tightkv.cli import main
from tightkv.errors import TightKVError
from tiny_gguf import write_gemma3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("e") / "tiny.gguf")


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = private_home(tmp_path)
    monkeypatch.setenv("TIGHTKV_HOME", str(h))
    return h


def one_line(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert rc != 0
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


@pytest.mark.parametrize(
    "args,needles",
    [
        (["run", "qwen3:8b", "hi"], ["unknown model 'qwen3:8b'"]),
        (["show", "nosuch"], ["unknown model 'nosuch'"]),
        (["pull", "llama9:1b"], ["unknown model 'llama9:1b'"]),
        (["rm", "gemma3:270m"], ["model 'gemma3:270m' not found"]),
        (["show", "qwen3:0.6b"], ["not pulled yet (run: tightkv pull qwen3:0.6b)"]),
        (["run", "/nonexistent/model.gguf", "hi"], ["model.gguf", "no such file"]),
        (["pull", "./local.gguf"], ["is a file path"]),
        (["run", "TINY", "hi", "--kv", "q9_9"], ["unknown KV cache type 'q9_9'"]),
        (["run", "TINY", "hi", "-ctk", "q8_0", "--kv", "f16"], ["either --kv or --cache-type-k"]),
        (["run", "TINY", "hi", "-ctv", "q3_x"], ["error: -ctv: unknown KV cache type 'q3_x'"]),
        (["run", "TINY", "hi", "--cache-type-k", "q3_x"], ["error: --cache-type-k: unknown KV cache type 'q3_x'"]),
        (["run", "TINY", "hi", "-ctk", "q8_0", "-ctv", "progressive"], ["error: -ctv: "]),  # a preset is not one side
        (["run", "TINY", "hi", "--kv", "q3_x"], ["error: --kv: unknown KV cache type 'q3_x'"]),
        (["ppl", "TINY", "--file", "TINY", "--compare", "f16,tq4", "-ctk", "q8_0"], ["either --compare or --kv"]),
        (["niah", "TINY", "-ctk", "q9"], ["error: -ctk: unknown KV cache type 'q9'"]),
        (["niah", "TINY", "--needle", "x", "--question", "y?", "--answer", " "], ["must not be empty"]),
        (["bench", "TINY", "--kv", "tq4", "--compare", "f16"], ["either --compare or --kv"]),
        (["ask", "--doc", "TINY", "-ctv", "zz", "q?"], ["error: -ctv: unknown KV cache type 'zz'"]),
        (["run", "TINY", "hi", "--temperature", "-1"], ["temperature must be >= 0"]),
        (["run", "TINY", "hi", "-n", "0"], ["--max-tokens must be at least 1"]),
        (["run", "TINY", "hi", "-n", "100000", "--threads", "1"], ["exceeds the context of 512 tokens"]),
        (
            ["run", "TINY", "hi", "-c", "1024", "--threads", "1"],
            ["error: -c/--ctx 1024 exceeds the model's trained context of 512", "pass --rope-scale 2 to stretch it"],
        ),
        (
            ["niah", "TINY", "-c", "1024", "--threads", "1"],  # no --rope-scale here: the verb that has it
            ["error: -c/--ctx 1024 exceeds", "`tightkv run` can stretch it with --rope-scale 2"],
        ),
        (
            ["run", "TINY", "hi", "-c", "4096", "--rope-scale", "2", "--threads", "1"],
            ["-c/--ctx 4096 exceeds 1024 tokens"],
        ),
        (["run", "TINY", "hi", "--rope-scale", "0.5", "--threads", "1"], ["factor must be >= 1"]),
        (["run", "TINY", "hi", "--threads", "0"], ["--threads must be at least 1"]),
    ],
)
def test_bad_input_is_one_line(args, needles, tiny, home, capsys):
    args = [str(tiny) if a == "TINY" else a for a in args]
    one_line(capsys, main(args), *needles)


@pytest.mark.parametrize(
    "args",
    [["run", "hi", "--temperature", "abc"], ["run", "hi", "-n", "many"], ["show", "gemma3", "-c", "x"], ["pull"]],
)
def test_unparsable_flag_values_are_one_line(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "usage:" not in err, err


def test_kv_cache_type_from_the_environment(tiny, home, monkeypatch, capsys):
    monkeypatch.setenv("TIGHTKV_KV_CACHE_TYPE", "q7_7")
    one_line(capsys, main(["run", str(tiny), "hi", "--threads", "1"]), "TIGHTKV_KV_CACHE_TYPE", "q7_7")
    monkeypatch.setenv("TIGHTKV_KV_CACHE_TYPE", "q8_0")
    assert main(["run", str(tiny), "hi", "-n", "2", "--threads", "1", "--verbose"]) == 0
    assert "kv cache:" in capsys.readouterr().err


def test_corrupt_file(tiny, tmp_path, home, capsys):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:4000])
    one_line(capsys, main(["run", str(cut), "hi"]), "cut.gguf", "truncated")
    one_line(capsys, main(["show", str(cut)]), "cut.gguf", "truncated")


def test_rope_scaling_in_the_api(tiny):
    from tightkv import Model

    with pytest.raises(TightKVError, match="rope_scaling=4"):
        Model(tiny, context_length=2000, threads=1)
    with pytest.raises(TightKVError, match="only 'linear'"):
        Model(tiny, context_length=1024, rope_scaling={"type": "yarn", "factor": 2}, threads=1)
    with Model(tiny, context_length=2048, rope_scaling=4, threads=1) as m:
        assert m.context_length == 2048 == m.max_context_length
        assert m.args.rope_scale == pytest.approx(0.25)  # global layers see positions / 4
        assert m.generate("hi", max_tokens=2).stats.generated_tokens <= 2
    with Model(tiny, context_length=1024, rope_scaling={"type": "linear", "factor": 2}, threads=1) as m:
        assert m.args.rope_scale == pytest.approx(0.5)


def test_subprocess_has_no_traceback_and_debug_shows_it(home):
    env = {"TIGHTKV_HOME": str(home)}
    assert_one_line_error(cli("run", "qwen3:8b", "hello", env=env), "unknown model 'qwen3:8b'")
    r = cli("--debug", "run", "qwen3:8b", "hello", env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr and "unknown model" in r.stderr


def test_chat_overflow_in_the_api(tiny):
    from tightkv import Model
    from tightkv.errors import ContextOverflowError

    with Model(tiny, context_length=48, threads=1) as m:
        long = [{"role": "user", "content": "word " * 40}]
        with pytest.raises(ContextOverflowError, match=r"prompt of \d+ tokens .*the context of 48 tokens"):
            m.chat(long, max_tokens=4)


def test_cli_start_and_import_stay_light():
    import subprocess
    import sys

    code = (
        "import sys, tightkv, tightkv.cli; tightkv.cli.build_parser(); "
        "heavy = [m for m in ('torch', 'huggingface_hub') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_a_pasted_paragraph_is_the_prompt(home):
    """#53: a prompt longer than a file name may be (255 bytes) is the prompt of the default
    model, not an OSError from asking the file system whether it is a file."""
    from cli_helpers import seed_embedded

    from tightkv.registry import is_model_name, looks_like_path

    para = "Why do TCP/IP stacks buffer what they send? " * 8  # 352 bytes, spaces and a slash
    assert not is_model_name(para)
    assert not looks_like_path("x" * 300) and not looks_like_path("a\0b")
    seed_embedded(home)
    r = cli("run", para, "-n", "2", "--threads", "1", env={"TIGHTKV_HOME": str(home)})
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_a_truncated_file_names_the_tensor_cut_short(qtype, tmp_path, home):
    """A download cut off in a tensor's data (numpy's failed reshape was the error): one line
    naming the tensor, by how much it is short and how much of the file is there."""
    import gguf

    whole = write_gemma3(tmp_path / f"whole-{qtype}.gguf", qtype=qtype)
    tensors = sorted(gguf.GGUFReader(whole).tensors, key=lambda t: t.data_offset)
    t = tensors[len(tensors) // 2]
    have = int(t.n_bytes) // 3
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: int(t.data_offset) + have])
    r = cli("run", str(cut), "hi", env={"TIGHTKV_HOME": str(home)})
    line = assert_one_line_error(r, "cut.gguf: truncated GGUF: ", f"tensor {t.name} (")
    assert f"is cut short by {int(t.n_bytes) - have:,} bytes ({have:,} bytes of its {int(t.n_bytes):,} bytes" in line
    assert f"the {len(tensors) - len(tensors) // 2 - 1} tensors after it are missing" in line
    assert "reshape" not in r.stderr and "shape" not in line
