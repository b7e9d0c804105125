"""gpt-oss's harmony replies in `tightkv run` (one-shot and the chat, through the real entry
point) and `Model.chat`: the analysis channel shown as Ollama's CLI shows a thinking model
("Thinking...", the reasoning, "...done thinking.", then the answer), hidden by
--hidethinking, the final channel as the answer, no markup ever printed; --think levels; an
assistant message continued with its reasoning and the final channel's open header.

The replies are scripted (`scripted_harmony`): a bigram model with gpt-oss's special tokens and
chat template whose greedy reply is ``<|channel|>analysis<|message|>plan<|end|><|start|>
assistant<|channel|>final<|message|>ok<|return|>``; the real tiny gpt-oss (random weights)
checks that its gibberish comes out with no markup."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_helpers import Terminal, assert_one_line_error, cli, private_home
from scripted_harmony import gpt_oss_template, write_scripted_harmony
from tiny_gguf import gpt2_byte_chars

TEMPLATE = gpt_oss_template()
pytestmark = pytest.mark.skipif(TEMPLATE is None, reason="llama.cpp's gpt-oss template is not on this machine")
GPT_OSS = Path(__file__).parent / "data" / "families" / "gpt-oss" / "gpt-oss-f32.gguf"
MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|constrain|>")
_BYTE = gpt2_byte_chars()


def P(text: str) -> str:
    """A normal token's vocabulary string (byte-level BPE spells a space "Ġ")."""
    return "".join(_BYTE[b] for b in text.encode())


# as tests/test_server_harmony.py's ANSWER: the second header in plain pieces (a tag cut across tokens)
ANSWER = [
    *("assistant", "<|channel|>", "analysis", "<|message|>", "pl", "an", "<|end|>", "<|start|>"),
    *(P("assis"), P("tant"), P("<|chan"), P("nel|>"), "final", P("<|mess"), P("age|>"), "ok", "<|return|>"),
]
SHOWN = "Thinking...\nplan\n...done thinking.\n\nok\n"  # Ollama's CLI, writing to a pipe


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_scripted_harmony(tmp_path_factory.mktemp("harmony") / "tiny-harmony.gguf", [ANSWER], TEMPLATE)


@pytest.fixture
def env(tmp_path):
    return {"TIGHTKV_HOME": str(private_home(tmp_path))}


def run(gguf, env, *flags: str, prompt: str = "hello"):
    return cli("run", str(gguf), prompt, "--threads", "1", "--kv", "f32", *flags, env=env)


def test_one_shot_shows_the_analysis_as_thinking(gguf, env):
    r = run(gguf, env)
    assert (r.returncode, r.stdout) == (0, SHOWN), r.stderr
    for flags in (["--hidethinking"], ["--think=false"]):  # gpt-oss cannot stop reasoning: false hides it
        r = run(gguf, env, *flags)
        assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    r = run(gguf, env, "--think", "high")
    assert (r.returncode, r.stdout) == (0, SHOWN), r.stderr
    assert_one_line_error(run(gguf, env, "--think=hard"), "--think takes true, false, low, medium or high")


def test_real_gpt_oss_prints_no_markup(env):
    r = cli("run", str(GPT_OSS), "hello", "-n", "12", "--threads", "1", "--kv", "f32", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and not any(tag in r.stdout for tag in MARKUP), r.stdout


def test_chat_shows_thinking_and_keeps_the_reasoning(gguf, tmp_path):
    argv = [sys.executable, "-m", "tightkv.cli", "run", str(gguf), "--threads", "1", "--kv", "f32", "--verbose"]
    t = Terminal(argv, env={"TIGHTKV_HOME": str(private_home(tmp_path))})
    try:
        t.expect(r"^>>> $", timeout=120)
        t.line("hello")
        t.expect(r"hello\nThinking\.\.\.\nplan\n\.\.\.done thinking\.\n\nok\n")
        t.expect(r"finish reason: +stop")
        t.expect(r"^>>> $")
        t.line("/set think low")
        t.expect(r"Set 'think' mode \(low\)\.")
        t.line("/set think hard")
        t.expect(r"error: /set think takes low, medium or high, got 'hard'")
        t.line("/set hidethinking")
        t.expect(r"Set 'hidethinking' mode\.")
        t.line("again")  # the first turn's answer goes back into the prompt with its reasoning
        t.expect(r"again\nok\n")
        t.expect(r"finish reason: +stop")
        t.expect(r"^>>> $")
        t.line("/bye")
        assert t.wait() == 0
        assert "\x1b[38;5;245m" in t.raw.decode()  # grey reasoning on a terminal
        assert not any(tag in t.text for tag in MARKUP), t.text
    finally:
        t.kill()


@pytest.fixture(scope="module")
def model(gguf):
    from tightkv import Model

    with Model(gguf, threads=1, kv="f32") as m:
        yield m


def test_model_chat_returns_the_final_channel(model):
    ask = [{"role": "user", "content": "hello"}]
    assert (model.chat(ask), model.last_reasoning) == ("ok", "plan")
    assert model.chat(ask, think="high", reset=True) == "ok"
    assert "Reasoning: high" in model.chat_text(ask, template_vars={"reasoning_effort": "high"})
    with pytest.raises(Exception, match="think must be true, false, low, medium or high"):
        model.chat(ask, think="hard")


def test_continuing_an_assistant_message(model):
    """Continued, the assistant's reasoning is an analysis message and its content the open
    final message: the prompt is the template's whole conversation without its <|return|>."""
    ask = [{"role": "user", "content": "hello"}]
    partial = {"role": "assistant", "content": "o", "reasoning_content": "plan"}
    text = model.chat_text([*ask, partial])
    whole = model.chat_text([*ask, partial], continue_final=False, add_generation_prompt=False)
    assert text.endswith("<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>final<|message|>o")
    assert whole == text + "<|return|>"
    alone = model.chat_text([{"role": "assistant", "content": "o"}])  # a conversation of that one message
    assert alone.endswith("<|end|><|start|>assistant<|channel|>final<|message|>o")
    # reasoning and no content yet: the analysis stays open, and the reply goes on reasoning
    thinking = {"role": "assistant", "content": "", "reasoning_content": "pl"}
    assert model.chat_text([*ask, thinking]).endswith("<|start|>assistant<|channel|>analysis<|message|>pl")
    assert (model.chat([*ask, thinking], reset=True), model.last_reasoning) == ("ok", "an")


def test_client_shows_the_reasoning_content(gguf, env):
    """`tightkv client` against a live server: the reply's reasoning_content as `run` shows it."""
    from test_server_helpers import running

    with running(str(gguf), "--kv", "f32") as srv:
        for extra, want in (([], SHOWN), (["--no-stream"], SHOWN), (["--hidethinking"], "ok\n")):
            r = cli("client", "hello", "--url", srv.url, *extra, env=env)
            assert (r.returncode, r.stdout) == (0, want), r.stderr
