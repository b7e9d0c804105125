"""Harmony (gpt-oss) without a server: the channel reader on scripted pieces (every cut of a
reply, tags and headers cut across pieces), the reasoning effort, messages as the template
reads them, prompts equal to transformers' apply_chat_template, and the grammars that
constrain only the final message (checked token by token against llguidance)."""

from __future__ import annotations

import pytest
from scripted_harmony import gpt_oss_template, write_scripted_harmony

from tightkv.engine import harmony
from tightkv.engine.harmony import HarmonyReader, effort_level, harmony_messages, is_harmony, split_harmony
from tightkv.engine.reasoning import thinks
from tightkv.engine.tools import tool_format
from tightkv.server.replies import new_reply

TEMPLATE = gpt_oss_template()
needs_template = pytest.mark.skipif(TEMPLATE is None, reason="llama.cpp's gpt-oss template is not on this machine")
PROMPT = "<|start|>user<|message|>hi<|end|><|start|>assistant"
NAMES = {"get_weather"}

THOUGHT_THEN_ANSWER = "<|channel|>analysis<|message|>We think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
PREAMBLE_THEN_CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
)
CALL_IN_CHANNEL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'


def read(text: str, cuts: list[int], names=NAMES, prompt=PROMPT, raw=False):
    """(reasoning, content, calls) of `text` fed in the pieces `cuts` make."""
    reader = HarmonyReader(names, prompt, raw)
    got = [reader.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])]
    got.append(reader.finish())
    return (
        "".join(r for r, _ in got),
        "".join(c for _, c in got),
        [(c.name, c.arguments, c.complete) for c in reader.calls],
    )


@pytest.mark.parametrize("text", [THOUGHT_THEN_ANSWER, PREAMBLE_THEN_CALL, CALL_IN_CHANNEL])
def test_every_cut_reads_as_the_whole(text):
    """One cut anywhere (a tag, a header, a recipient cut in two), and every character apart."""
    whole = read(text, [])
    for i in range(1, len(text)):
        assert read(text, [i]) == whole, i
    assert read(text, list(range(1, len(text)))) == whole


def test_channels():
    assert read(THOUGHT_THEN_ANSWER, []) == ("We think.", "Hi!", [])
    assert read(PREAMBLE_THEN_CALL, []) == ("Need weather.", "Checking.", [("get_weather", '{"city": "Paris"}', True)])
    assert read(CALL_IN_CHANNEL, []) == ("", "", [("get_weather", '{"city": "Oslo"}', True)])


def test_end_rendered_as_nothing_and_stray_commentary():
    """A vocabulary that renders <|end|> as nothing: the next <|start|> (or <|channel|>) ends the
    message; "<|channel|>commentary<|channel|>analysis" (gpt-oss-20b does it) is analysis."""
    text = "<|channel|>commentary<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b"
    assert read(text, []) == ("a", "b", [])
    assert read("<|channel|>analysis<|message|>a<|channel|>final<|message|>b", []) == ("a", "b", [])


def test_streamed_pieces_are_out_as_soon_as_certain():
    reader = HarmonyReader(NAMES, PROMPT)
    assert reader.feed("<|channel|>analysis<|mess") == ("", "")
    assert reader.feed("age|>We th") == ("We th", "")
    assert reader.feed("ink.<|e") == ("ink.", "")  # "<|e" may begin <|end|>: held
    assert reader.feed("nd|><|start|>assistant<|channel|>final<|message|>H") == ("", "H")
    reader.feed('<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"ci')
    assert [(c.name, c.arguments, c.complete) for c in reader.calls] == [("get_weather", '{"ci', False)]


def test_a_reply_cut_short():
    """max_tokens inside a message: what it has; a call whose arguments are not whole JSON is
    not complete (<|call|> is no text, so a call ends with the reply when its JSON is whole)."""
    assert read("<|channel|>analysis<|message|>We thi", []) == ("We thi", "", [])
    assert read("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan", []) == ("a", "", [])
    assert read(CALL_IN_CHANNEL[:-4], [])[2] == [("get_weather", '{"city": "Os', False)]


def test_recipients_that_are_no_tool_and_plain_text():
    """A message to a function the request did not offer is content, as written; a reply with no
    harmony header at all is plain content."""
    assert read(CALL_IN_CHANNEL, [], names=set()) == ("", '{"city": "Oslo"}', [])
    assert read("Hello <b>there</b>", [3]) == ("", "Hello <b>there</b>", [])


def test_raw_keeps_the_analysis_in_the_content():
    """reasoning_format none: the analysis stays in the content with its markup (llama.cpp's)."""
    assert read(THOUGHT_THEN_ANSWER, [5, 40], raw=True) == (
        "",
        "<|channel|>analysis<|message|>We think.<|end|>Hi!",
        [],
    )


def test_prompt_that_left_a_message_open():
    prompt = PROMPT + "<|channel|>analysis<|message|>Hm"
    assert split_harmony("m.<|end|><|start|>assistant<|channel|>final<|message|>ok", NAMES, prompt)[:2] == ("m.", "ok")


def test_reply_deltas_for_a_streamed_call():
    """The server's `Reply` over the reader: a call starts when its header is read, its
    arguments stream in fragments, and it is done (Ollama's) when the reply ends."""
    reply = new_reply(NAMES, TEMPLATE or "<|channel|><|message|>", PROMPT, True)
    deltas = [reply.feed(p) for p in (PREAMBLE_THEN_CALL[:-9], PREAMBLE_THEN_CALL[-9:])] + [reply.finish()]
    assert deltas[0].reasoning == "Need weather."
    assert [e[0] for e in deltas[0].calls] == ["start", "args"] and deltas[1].calls == [("args", 0, ' "Paris"}')]
    assert deltas[2].done == [(0, "get_weather", {"city": "Paris"})]
    assert reply.openai_message()["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert reply.finish_reason("stop") == "tool_calls" and reply.finish_reason("length") == "length"


def test_effort_levels():
    assert [effort_level(e, None) for e in ("low", "medium", "high", "minimal", "none", "max", "xhigh")] == [
        "low",
        "medium",
        "high",
        "low",
        "low",
        "high",
        "high",
    ]
    assert effort_level(None, None) is None and effort_level(None, True) is None and effort_level(None, False) == "low"
    with pytest.raises(ValueError):
        effort_level("extreme", None)


@needs_template
def test_detection():
    assert is_harmony(TEMPLATE) and thinks(TEMPLATE) and tool_format(TEMPLATE) == "harmony"
    assert not is_harmony("{{ messages }}<think></think>") and not is_harmony(None)


def test_messages_as_the_template_reads_them():
    msgs = [
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "assistant", "content": "c", "reasoning_content": "r2", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "assistant", "content": "done"},
    ]
    out = harmony_messages(msgs)
    assert out[0]["thinking"] == "r" and "reasoning_content" not in out[0]
    assert out[1]["content"] == "" and out[1]["thinking"] == "r2"  # the template refuses both with a call
    assert out[2] == msgs[2]


# --- the prompt, as transformers renders it ------------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "Need the tool.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 degrees.", "reasoning_content": "Easy."},
    {"role": "user", "content": "And tomorrow?"},
]


def hf_render(messages: list[dict], **extra) -> str:
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|return|>", unk_token="<unk>")
    return tok.apply_chat_template(
        messages, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True, **extra
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tightkv.api import Model

    chain = ["assistant", "<|channel|>", "final", "<|message|>", "ok", "<|return|>"]
    return Model(str(write_scripted_harmony(tmp_path_factory.mktemp("h") / "h.gguf", [chain], TEMPLATE)))


def prepared_text(model, messages, **kw):
    from tightkv.engine.requests import ChatRequest, prepare

    return prepare(model, ChatRequest(messages, **kw)).text


@needs_template
@pytest.mark.parametrize("effort", [None, "low", "medium", "high"])
def test_prompt_equals_transformers(model, effort):
    """Reasoning effort, an earlier call with its analysis, the tool's result, an earlier answer
    (its analysis dropped): as transformers renders the same messages (reasoning as
    `thinking`, arguments as objects, which is what the template reads)."""
    import json

    hf_messages = [
        {**m, "thinking": m["reasoning_content"], "content": m["content"] or ""} if "reasoning_content" in m else m
        for m in HISTORY
    ]
    hf_messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in hf_messages]
    hf_messages[2]["tool_calls"] = [{**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    expected = hf_render(hf_messages, tools=TOOLS, **({"reasoning_effort": effort} if effort else {}))
    text = prepared_text(model, HISTORY, tools=TOOLS, effort=effort)
    assert text == expected
    assert f"Reasoning: {effort or 'medium'}" in text
    assert "<|channel|>analysis<|message|>Need the tool.<|end|>" not in text  # a later final drops it
    assert '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}' in text
    result = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    assert result + json.dumps('{"temp": 21}') + "<|end|>" in text  # the result as a JSON string


@needs_template
def test_analysis_of_a_pending_call_is_kept(model):
    """The call not yet answered by a final message: its analysis is rendered (the template's
    one case of analysis in a prompt), as transformers does."""
    msgs = HISTORY[:4]
    hf = [dict(m) for m in msgs]
    hf[2] = {
        "role": "assistant",
        "content": "",
        "thinking": "Need the tool.",
        "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    text = prepared_text(model, msgs, tools=TOOLS)
    assert text == hf_render(hf, tools=TOOLS)
    assert "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>" in text


@needs_template
def test_think_and_effort_set_the_template(model):
    ask = [{"role": "user", "content": "hi"}]
    assert "Reasoning: low" in prepared_text(model, ask, think=False)
    assert "Reasoning: high" in prepared_text(model, ask, think=True, effort="max")
    assert "Reasoning: medium" in prepared_text(model, ask, think=True)
    kw = prepared_text(model, ask, effort="high", template_vars={"reasoning_effort": "low"})
    assert "Reasoning: low" in kw  # chat_template_kwargs win
    from tightkv.errors import RequestError

    with pytest.raises(RequestError, match="reasoning_effort"):
        prepared_text(model, ask, effort="extreme")


# --- grammars --------------------------------------------------------------------------------
def accepts(model, grammar: str, text: str) -> bool:
    from tightkv.engine.grammar import Constraint, lark_grammar

    c = Constraint(lark_grammar(grammar), model.tokenizer)
    for t in model.tokenizer.encode(text, add_bos=False, special=True):
        if not c.allows(t):
            return False
        c.accept(t)
    return c.accepting


@needs_template
def test_final_grammar_leaves_the_analysis_free(model):
    g = harmony.final_grammar({"type": "object", "properties": {"a": {"enum": ["yes"]}}, "required": ["a"]})
    final = '<|channel|>final<|message|>{"a": "yes"}'
    assert accepts(model, g, final)
    assert accepts(model, g, "<|channel|>analysis<|message|>any {text} here<|end|><|start|>assistant" + final)
    assert accepts(model, g, '<|channel|>final <|constrain|>json<|message|>{"a": "yes"}')
    assert not accepts(model, g, '<|channel|>finaljson<|message|>{"a": "yes"}')  # "json" apart from the channel
    assert not accepts(model, g, '<|channel|>final<|message|>{"a": "no"}')
    assert not accepts(model, g, '{"a": "yes"}')  # the final channel's header first
    lark = harmony.final_grammar(grammar='root ::= "yes" | "no"')
    assert accepts(model, lark, "<|channel|>final<|message|>no") and not accepts(
        model, lark, "<|channel|>final<|message|>x"
    )


@needs_template
def test_call_grammar_either_header(model):
    g = harmony.call_grammar(TOOLS)
    assert accepts(model, g, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "x"}')
    assert accepts(
        model,
        g,
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "x"}',
    )
    assert not accepts(model, g, '<|channel|>commentary to=functions.other json<|message|>{"city": "x"}')
    assert not accepts(model, g, '<|channel|>commentary to=functions.get_weatherjson<|message|>{"city": "x"}')
    assert not accepts(model, g, '<|channel|>commentary to=functions.get_weather json<|message|>{"town": "x"}')
