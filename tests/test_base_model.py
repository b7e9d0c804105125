"""A base model where a new user meets it (#53 point 2): the embedded Gemma 3 270M has no
chat template, and greedy it loops on one sentence. The README's first command and its
Python example (repeat penalty 1.1, llama-cli's old default, for a model without a chat
template), and the chat on a terminal that shows that default; the web page's plain chat is
in test_web.py."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from cli_helpers import Terminal, cli, private_home, seed_embedded
from tiny_gguf import write_gemma3

PROMPT = r"^>>> $"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = private_home(tmp_path_factory.mktemp("base"))
    seed_embedded(home)
    return {"TIGHTKV_HOME": str(home)}


def repeats(text: str, words: int = 6) -> int:
    """How many times the most frequent run of `words` words occurs in `text`."""
    w = text.split()
    return max(Counter(tuple(w[i : i + words]) for i in range(len(w) - words + 1)).values(), default=0)


def test_the_readme_first_command_does_not_loop(env):
    r = cli("run", "The capital of France is", "-n", "64", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and repeats(r.stdout) <= 2, r.stdout
    greedy = cli("run", "The capital of France is", "-n", "64", "--repeat-penalty", "1", env=env)
    assert greedy.returncode == 0 and repeats(greedy.stdout) >= 3, greedy.stdout  # the loop the default breaks


def test_the_readme_python_example_does_not_loop(env, monkeypatch):
    monkeypatch.setenv("TIGHTKV_HOME", env["TIGHTKV_HOME"])
    from tightkv import Model

    m = Model.from_pretrained("gemma3:270m")
    try:
        assert m.chat_template is None
        text = m.ask("What is gravity?")
    finally:
        m.close()
    assert text.strip() and repeats(text) <= 2, text


def test_the_chat_shows_each_models_default_penalty(env, tmp_path):
    """On a terminal: the base model's chat says it is plain completion and runs with
    repeat_penalty 1.1; a model with a chat template keeps 1 (no penalty); a flag wins."""
    chat_model = write_gemma3(tmp_path / "chat.gguf")
    for args, banner, penalty in [
        ([], r"gemma3:270m \(plain completion: no chat template\)", "1.1"),
        ([str(chat_model)], r"chat\.gguf \(chat\)", "1.0"),
        (["--repeat-penalty", "1.3"], r"plain completion", "1.3"),
    ]:
        t = Terminal([sys.executable, "-m", "tightkv.cli", "run", *args, "--threads", "1"], env=env)
        try:
            t.expect(banner, timeout=120)
            t.expect(PROMPT)
            t.line("/show parameters")
            t.expect(rf"repeat_penalty +{penalty}\n")
            t.expect(PROMPT)
            t.line("/bye")
            assert t.wait() == 0
        finally:
            t.kill()
