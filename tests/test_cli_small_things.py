"""The small things a new user notices (issue 23, point 7), each run as the user
runs it: --debug after the verb, `show` and `plan` on the embedded model by
default, one unit family for sizes, a busy port for `serve`, help for every flag."""

from __future__ import annotations

import argparse
import re
import socket
import time

import pytest

from cli_helpers import assert_one_line_error, cli, private_home, seed_embedded
from tightkv.cli import build_parser


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = private_home(tmp_path_factory.mktemp("small"))
    seed_embedded(home)
    return {"TIGHTKV_HOME": str(home)}


@pytest.mark.parametrize(
    "args",
    [
        ["--debug", "run", "qwen3:8b", "hi"],
        ["run", "--debug", "qwen3:8b", "hi"],
        ["run", "qwen3:8b", "hi", "--debug"],
        ["show", "nosuch", "--debug"],
    ],
)
def test_debug_before_or_after_the_verb_shows_the_traceback(args, env):
    r = cli(*args, env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr and "unknown model" in r.stderr, r.stderr
    without = cli(*[a for a in args if a != "--debug"], env=env)
    assert_one_line_error(without, "unknown model")


def test_show_defaults_to_the_embedded_model_in_binary_units(env):
    r = cli("show", env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^    name +gemma3:270m$", r.stdout, re.M), r.stdout
    assert re.search(r"^    size +\d+\.\d MiB$", r.stdout, re.M), r.stdout
    f16 = re.search(r"^    f16 +[\d,]+ +([\d.]+) (MiB|GiB) +1\.00x$", r.stdout, re.M)
    assert f16, r.stdout
    assert not re.search(r"\d (KB|MB|GB)\b", r.stdout), r.stdout  # not Ollama's decimal units here
    assert (
        "KV cache at 32768 tokens" in r.stdout and "KV cache at 32768 tokens" in cli("show", "-c", "0", env=env).stdout
    )
    assert re.search(r"^    cpu kernels +(avx512\S*|avx2|portable), \d+ threads$", r.stdout, re.M), r.stdout


def test_show_says_when_the_kernels_are_off(env):
    r = cli("show", env={**env, "TIGHTKV_NO_COMPILE": "1"})
    assert r.returncode == 0, r.stderr
    assert re.search(
        r"^    cpu kernels +unavailable \(.*TIGHTKV_NO_COMPILE.*\): the slow torch reference path runs$", r.stdout, re.M
    ), r.stdout


def test_plan_names_the_model_and_warns_past_the_trained_context(env):
    r = cli("plan", "-c", "200000", "--mem", "16GB", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "model     gemma3:270m", lines[0]  # not the blob's path
    assert lines[-1] == (
        "warning: 200000 tokens exceed the model's trained context of 32768; running it needs "
        "--rope-scale 7 (linear RoPE scaling, at some loss of quality)"
    ), r.stdout
    within = cli("plan", "-c", "0", "--mem", "16GB", env=env)
    assert within.returncode == 0 and "context   32768 tokens (trained 32768)" in within.stdout
    assert "warning" not in within.stdout and "\neverything fits\nrecommended: --kv f16 " in within.stdout


def test_serve_on_a_busy_port_is_one_error_line(env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = cli("serve", "--port", str(port), "--threads", "1", env=env, timeout=60)
        elapsed = time.monotonic() - t0
    assert_one_line_error(r, f"port {port} on 127.0.0.1 is already in use", "--port")
    assert len(r.stderr.strip().splitlines()) == 1 and "serving" not in r.stderr, r.stderr
    assert elapsed < 30  # refused before the model loads


def _flags_without_help() -> set[tuple[str, str]]:
    parser, _ = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {
        (verb, (action.option_strings or [action.metavar or action.dest])[0])
        for verb, sub in verbs.items()
        for action in sub._actions
        if not action.help
    }


def test_every_flag_has_help():
    assert not _flags_without_help()


def test_ask_cap_is_the_library_default():
    from tightkv.commands.ask import ANSWER_TOKENS
    from tightkv.documents.prompts import ANSWER_TOKENS as LIBRARY

    assert ANSWER_TOKENS == LIBRARY


@pytest.mark.parametrize(
    "verb,needles",
    [
        ("rm", ["NAME", "a pulled model"]),
        ("bench", ["--n-prompt", "prompt tokens", "--n-gen", "decode steps", "--json", "JSON file"]),
        (
            "run",
            [
                "--temperature",
                "0 (the default) always picks the likeliest token",
                "--top-k",
                "--top-p",
                "--min-p",
                "--repeat-penalty",
                "--seed",
                "-c CTX, --ctx CTX context length in tokens (default, or 0: the model's trained context)",
                "--debug show tracebacks",
            ],
        ),
        ("client", ["--temperature", "0 (the default)", "--top-k"]),
        ("ask", ["answer tokens at most (default 96); the answer ends at the end of its first sentence or line"]),
    ],
)
def test_help_as_the_user_reads_it(verb, needles):
    r = cli(verb, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    for needle in needles:
        assert needle in text, (needle, r.stdout)


def test_cache_takes_list_as_the_top_level_does(env):
    """`tightkv list` (alias `ls`) lists models; `tightkv cache list` lists caches as `cache ls` does."""
    listed, ls = cli("cache", "list", env=env), cli("cache", "ls", env=env)
    assert listed.returncode == 0 and ls.returncode == 0, listed.stderr
    assert listed.stdout == ls.stdout == cli("cache", env=env).stdout
    assert cli("cache", "list", "--json", env=env).stdout.strip().startswith("[")
