"""`tightkv run` through a real terminal (a pty): the interactive chat keeps its KV
cache across turns, and the REPL commands, Ctrl-C and Ctrl-D behave; plus the
one-shot and piped forms."""

from __future__ import annotations

import re
import sys
import time

import pytest

from cli_helpers import Terminal, assert_one_line_error, cli, private_home
from tiny_gguf import write_gemma3

STATS = (
    r"prompt eval count: +(\d+) token\(s\) \((\d+) cached\)(?:.|\n)*?"
    r"\neval count: +(\d+) token\(s\)(?:.|\n)*?finish reason: +\w+\n"
)
PROMPT = r"^>>> $"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Gemma 3 with a chat template and a 4096-token context."""
    return write_gemma3(tmp_path_factory.mktemp("chat") / "chat.gguf", context=4096)


@pytest.fixture
def home(tmp_path):
    return private_home(tmp_path)


def chat(model, home, *flags: str) -> Terminal:
    argv = [sys.executable, "-m", "tightkv.cli", "run", str(model), "--threads", "1", *flags]
    return Terminal(argv, env={"TIGHTKV_HOME": str(home)})


def turn_stats(t: Terminal) -> tuple[int, int, int]:
    """(prompt tokens, cached tokens, generated tokens) from a turn's --verbose stats."""
    m = t.expect(STATS, timeout=120)
    t.expect(PROMPT)
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def new_turn_tokens(model_path, message: str) -> int:
    """Tokens a follow-up turn adds after the previous reply: the end of the reply's
    turn, the user turn, and the start of the model's turn (the template's text)."""
    from tightkv import Model

    with Model(model_path, threads=1) as m:
        text = f"<end_of_turn>\n<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n"
        return len(m.tokenize(text, add_bos=False, special=True))


def test_three_turn_chat_prefills_only_new_tokens(chat_model, home):
    t = chat(chat_model, home, "--verbose", "-n", "6", "--kv", "f32")
    try:
        t.expect(r"Send a message \(/\? for help", timeout=120)
        t.expect(PROMPT)
        t.line("hello")
        p1, c1, g1 = turn_stats(t)
        assert c1 == 0 and g1 > 0
        t.line("again please")
        p2, c2, g2 = turn_stats(t)
        assert c2 == p1 + g1  # turn 1's prompt and reply stay in the cache ...
        assert p2 - c2 == new_turn_tokens(chat_model, "again please")  # ... only the new turn is prefilled
        t.line('"""')  # a multi-line message
        t.expect(r"^\.\.\. $")
        t.line("line one")
        t.line('line two"""')
        p3, c3, g3 = turn_stats(t)
        assert c3 == p2 + g2 and p3 - c3 == new_turn_tokens(chat_model, "line one\nline two")

        t.line("/set parameter temperature 0.5")
        t.expect("Set parameter 'temperature' to '0.5'")
        t.expect(PROMPT)
        t.line("/set parameter top_k abc")
        t.expect(r"error: parameter top_k takes int values, got 'abc'")
        t.line("/set parameter num_ctx 100000")
        t.expect(r"error: context_length 100000 exceeds the model's trained context of 4096 tokens")
        t.line("/set parameter presence_penalty 0.5")
        t.expect("Set parameter 'presence_penalty' to '0.5'")
        t.expect(PROMPT)
        t.line("/set parameter repeat_last_n -2")
        t.expect(r"error: repeat_last_n must be >= -1 \(-1: the whole context\), got -2")
        t.line("/show parameters")
        t.expect(r"temperature\s+0.5")
        t.expect(r"presence_penalty\s+0.5")
        t.line("/show")
        t.expect(r"architecture\s+gemma3")
        t.expect(rf"context in use\s+{p3 + g3} of 4096 tokens")
        t.line("/nonsense")
        t.expect(r"error: unknown command '/nonsense'")
        t.line("/clear")
        t.expect("Cleared session context")
        t.expect(PROMPT)
        t.line("fresh start")
        p4, c4, _ = turn_stats(t)
        assert c4 == 0  # /clear dropped the conversation and its cache
        t.line("/bye")
        assert t.wait() == 0
    finally:
        t.kill()


def test_ctrl_c_stops_a_reply_and_ctrl_d_exits(chat_model, home):
    t = chat(chat_model, home, "-n", "3000", "--temperature", "1", "--seed", "3")
    try:
        t.expect(PROMPT, timeout=120)
        t.line("tell me a long story")
        t.expect(r"tell me a long story\n\n{20}", timeout=120)  # the reply is streaming (3000 tokens take a while)
        start = time.monotonic()
        t.send("\x03")
        t.expect(r"\(stopped\)", timeout=30)
        assert time.monotonic() - start < 10
        t.expect(PROMPT)
        t.line("/show")  # still alive, cache consistent
        t.expect(r"context in use\s+\d+ of 4096 tokens")
        t.expect(PROMPT)
        t.send("\x04")  # Ctrl-D on an empty line
        assert t.wait() == 0
    finally:
        t.kill()


def test_context_overflow_in_chat_is_an_error_not_an_exit(chat_model, home):
    t = chat(chat_model, home, "-c", "40", "-n", "4")
    try:
        t.expect(PROMPT, timeout=120)
        t.line("hello")
        t.expect(PROMPT)
        t.line("a much longer message that will not fit in forty tokens of context at all")
        t.expect(r"error: prompt of \d+ tokens (plus max_tokens 4 )?(does not fit|exceeds) the context of 40 tokens")
        t.expect(PROMPT)
        t.line("/bye")
        assert t.wait() == 0
    finally:
        t.kill()


def test_one_shot_streams_and_pipes(chat_model, home):
    env = {"TIGHTKV_HOME": str(home)}
    r = cli(
        "run",
        str(chat_model),
        "hello",
        "-n",
        "3",
        "--verbose",
        "--threads",
        "1",
        "-ctk",
        "q8_0",
        "-ctv",
        "tq4",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"prompt eval count: +\d+ token\(s\) \(0 cached\)", r.stderr)
    assert "eval count:           3 token(s)" in r.stderr and "Traceback" not in r.stderr
    assert re.search(r"^cpu kernels: +(avx512\S*|avx2|portable), \d+ threads$", r.stderr, re.M), r.stderr
    r = cli("run", str(chat_model), "-n", "2", "--threads", "1", env=env, input="hello from stdin\n")  # piped prompt
    assert r.returncode == 0, r.stderr
    r = cli("run", str(chat_model), "--threads", "1", env=env, input="")
    assert_one_line_error(r, "no prompt given")
