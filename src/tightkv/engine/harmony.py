"""Harmony, gpt-oss's chat format: whether a chat template speaks it, the template variables
a request's reasoning effort sets, messages as its template reads them, the grammars that
constrain only the final message (or force a call), and a reader that splits a reply into
its channels as the text streams in, a tag or a header cut across pieces included.

A harmony reply is a run of messages. The prompt ends with ``<|start|>assistant``, so the
reply opens with the first message's header; later ones begin ``<|start|>assistant``::

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>commentary<|message|>...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>

What each message becomes (`HarmonyReader`):
- ``analysis``: reasoning (OpenAI's ``reasoning_content``, Ollama's ``thinking``);
- a recipient ``to=functions.NAME`` (or ``to=NAME``) on any channel, NAME among the
  request's tools: a tool call, its body the arguments' JSON as written;
- ``final``, ``commentary`` without a recipient (a preamble the model means the user to see,
  as OpenAI's harmony guide says), or a recipient that is no tool of the request: content.
``<|return|>`` and ``<|call|>`` end the generation (end-of-generation tokens); ``<|end|>``
ends a message, and so does the next ``<|start|>`` or ``<|channel|>`` where a vocabulary
renders ``<|end|>`` as nothing. Text before any header (a model that ignores the format) is
content as written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import TightKVError
from .grammar import json_rule

START, CHANNEL, MESSAGE, END, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"
RETURN, CALL = "<|return|>", "<|call|>"
BODY_ENDS = (END, RETURN, CALL)  # consumed: they end a message
NEXT_HEADER = (START, CHANNEL)  # a message's end where <|end|> renders as nothing: kept, they open the next
HEADER_OPENERS = (START, CHANNEL, CONSTRAIN, "to=", "assistant")
MAX_HEADER = 256  # characters a header may run to before it is taken for text

EFFORTS = ("low", "medium", "high")
EFFORT_ALIASES = {"minimal": "low", "none": "low", "max": "high", "xhigh": "high"}


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony (gpt-oss): it names the channel and message tags."""
    return bool(template) and CHANNEL in template and MESSAGE in template


def effort_level(effort: str | None, think: bool | None) -> str | None:
    """The template's `reasoning_effort` for a request: low, medium or high as asked;
    "minimal" and "none" (OpenAI) or think false (Ollama) are "low", "xhigh" (OpenAI) and "max"
    (Ollama) are "high": gpt-oss
    always reasons, and cannot do less than low or more than high. None: the template's
    default (medium). An unknown level raises ValueError."""
    if effort is None:
        return "low" if think is False else None
    level = EFFORT_ALIASES.get(effort, effort)
    if level not in EFFORTS:
        raise ValueError(effort)
    return level


def harmony_messages(messages: list[dict]) -> list[dict]:
    """Messages as the gpt-oss template reads them: an assistant's reasoning in `thinking`
    (OpenAI's `reasoning_content`); a message that calls tools with reasoning keeps no
    content besides (the template refuses both), as llama.cpp's server does."""
    out = []
    for m in messages:
        reasoning = m.get("reasoning_content")
        if m.get("role") == "assistant" and isinstance(reasoning, str) and reasoning:
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
            m["thinking"] = reasoning
            if m.get("tool_calls"):
                m["content"] = ""
        out.append(m)
    return out


def continued_message(message: dict) -> str:
    """What follows the generation prompt (``<|start|>assistant``) when an assistant's message
    is continued, as llama.cpp prefills it: its reasoning (`thinking` or `reasoning_content`)
    as an analysis message, then the final channel's header and the content so far. A message
    with reasoning and no content yet leaves the analysis open: the reply goes on reasoning."""
    thinking = message.get("thinking") or message.get("reasoning_content") or ""
    content = message.get("content") or ""
    if thinking and not content:
        return f"{CHANNEL}analysis{MESSAGE}{thinking}"
    head = f"{CHANNEL}analysis{MESSAGE}{thinking}{END}{START}assistant" if thinking else ""
    return f"{head}{CHANNEL}final{MESSAGE}{content}"


# --- grammars (llguidance Lark) ----------------------------------------------------------------
# Analysis messages, written freely, may come first; the markup is text to the grammar (the
# loader makes these tokens user-defined) and <|return|> / <|call|> end it (EOS).
_ANALYSIS = """harmony_analysis: "<|channel|>analysis<|message|>" harmony_thought "<|start|>assistant"
harmony_thought[stop="<|end|>"]: /(?s:.*)/
"""
# the header's content type: " json", " <|constrain|>json" or "<|constrain|>json" (never "json" run
# into the channel or the recipient, which would read as another name)
_JSON_HEAD = '(" " "<|constrain|>"? "json" | "<|constrain|>" "json")? "<|message|>"'


def final_grammar(json_schema: dict | bool | None = None, grammar: str | None = None) -> str:
    """A grammar for a harmony reply whose final message is constrained (to one JSON value of
    `json_schema`, or to the Lark / GBNF `grammar`): analysis messages first, then the final
    channel's header, with or without ``<|constrain|>json``, then the constrained text."""
    from .grammar import json_schema_grammar, lark_grammar

    if json_schema is not None:
        spec = json.loads(json_schema_grammar(json_schema))["grammars"][0]["json_schema"]
        body = f"harmony_body: %json {json.dumps(spec)}"
    else:
        body = re.sub(r"(?m)^start(\s*:)", r"harmony_body\1", lark_grammar(grammar).replace("%llguidance {}", ""))
    head = f'"<|channel|>final" {_JSON_HEAD}'
    return f"%llguidance {{}}\nstart: harmony_analysis* {head} harmony_body\n{_ANALYSIS}{body.strip()}\n"


def call_grammar(tools: list[dict], name: str | None = None) -> str:
    """A grammar for a harmony reply that ends with a call (of the function `name`, or of
    any of `tools`): analysis messages first, then a commentary message to the function (the
    recipient before or after the channel, as the model writes either), its arguments valid
    for the function's schema."""
    chosen = [t for t in tools if t.get("function", t).get("name") == name] if name else tools
    if not chosen:
        raise TightKVError(f"tool_choice names {name!r}, which is not among the tools")
    calls = []
    for t in chosen:
        fn = t.get("function", t)
        args = json_rule(fn.get("parameters") or {"type": "object"})
        to = json.dumps(f"to=functions.{fn['name']}")
        calls.append(f'" " {to} "<|channel|>commentary" {_JSON_HEAD} {args}')
        calls.append(f'"<|channel|>commentary " {to} {_JSON_HEAD} {args}')
    return (
        "%llguidance {}\nstart: harmony_analysis* harmony_call\nharmony_call: "
        + "\n    | ".join(calls)
        + "\n"
        + _ANALYSIS
    )


# --- the reply, read ---------------------------------------------------------------------------
@dataclass
class HarmonyCall:
    name: str
    arguments: str = ""  # the raw JSON text so far
    complete: bool = False


@dataclass
class Header:
    """A message's header: its channel and recipient (a tool call's function name)."""

    channel: str = ""
    recipient: str = ""

    @classmethod
    def parse(cls, text: str) -> Header:
        channels = re.findall(r"<\|channel\|>\s*([A-Za-z_]+)", text)
        recipient = re.search(r"to=([^\s<]+)", text)
        return cls(channels[-1] if channels else "", recipient.group(1) if recipient else "")


def start_header(prompt: str) -> tuple[str, Header | None]:
    """Where a reply begins, from the prompt's end: ("header", None) after ``<|start|>ROLE``
    (the header is still to come), or ("body", its header) where the prompt left a message
    open (``...<|message|>`` and no end: the reply goes on inside it)."""
    at = max(prompt.rfind(START), prompt.rfind(END), prompt.rfind(RETURN), prompt.rfind(CALL))
    tail = prompt[at:] if at >= 0 else ""
    if not tail.startswith(START):
        return "header", None
    if MESSAGE in tail:
        return "body", Header.parse(tail[: tail.index(MESSAGE)])
    return "header", None


def _overlap(text: str, tags: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins one of `tags`."""
    return max((n for t in tags for n in range(1, min(len(t), len(text) + 1)) if text.endswith(t[:n])), default=0)


class HarmonyReader:
    """Feed it a reply piece by piece; each call returns the (reasoning, content) text that is
    certain by then, and `calls` grows as tool calls appear (a call's arguments grow as they
    stream). `names`: the request's tool names; `raw`: analysis messages go to the content
    as written, markup and all (llama.cpp's reasoning_format none)."""

    def __init__(self, names: set[str] | None = None, prompt: str = "", raw: bool = False):
        self.names, self.raw = names or set(), raw
        self.state, header = start_header(prompt)
        self.header = header or Header()
        self.buf = ""  # text not read yet
        self.calls: list[HarmonyCall] = []

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        out = {"reasoning": [], "content": []}
        while self._step(out, final=False):
            pass
        return "".join(out["reasoning"]), "".join(out["content"])

    def finish(self) -> tuple[str, str]:
        """What is still held, once the reply has ended (a message cut short ends there)."""
        out = {"reasoning": [], "content": []}
        while self._step(out, final=True):
            pass
        if self.state == "body":
            self._end_body(out, cut=True)
        elif self.buf.strip() and not _looks_like_header(self.buf):
            out["content"].append(self.buf)
        self.buf = ""
        return "".join(out["reasoning"]), "".join(out["content"])

    # --- states ---------------------------------------------------------------------------
    def _step(self, out: dict, final: bool) -> bool:
        """Read what the buffer decides; False when it must wait for more."""
        if not self.buf:
            return False
        if self.state == "header":
            return self._read_header(out)
        if self.state == "text":
            out["content"].append(self.buf)
            self.buf = ""
            return False
        return self._read_body(out, final)

    def _read_header(self, out: dict) -> bool:
        end = self.buf.find(MESSAGE)
        if end < 0:
            if not _looks_like_header(self.buf) or len(self.buf) > MAX_HEADER:
                self.state = "text"  # no harmony here: the reply is plain text
                return True
            return False
        self.header = Header.parse(self.buf[:end])
        self.buf = self.buf[end + len(MESSAGE) :]
        self.state = "body"
        kind = self._kind()
        if kind == "call":
            self.calls.append(HarmonyCall(self._function()))
        elif kind == "reasoning" and self.raw:
            out["content"].append(f"{CHANNEL}{self.header.channel}{MESSAGE}")
        return True

    def _read_body(self, out: dict, final: bool) -> bool:
        hits = [(self.buf.find(t), t) for t in BODY_ENDS + NEXT_HEADER]
        hits = [(i, t) for i, t in hits if i >= 0]
        if hits:
            i, tag = min(hits)
            self._emit(out, self.buf[:i])
            self.buf = self.buf[i + len(tag) :] if tag in BODY_ENDS else self.buf[i:]
            self._end_body(out)
            return True
        keep = 0 if final else _overlap(self.buf, BODY_ENDS + NEXT_HEADER)
        self._emit(out, self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return False

    def _emit(self, out: dict, text: str) -> None:
        if not text:
            return
        kind = self._kind()
        if kind == "call":
            self.calls[-1].arguments += text
        elif kind == "reasoning" and not self.raw:
            out["reasoning"].append(text)
        else:
            out["content"].append(text)

    def _end_body(self, out: dict, cut: bool = False) -> None:
        """A message has ended (`cut`: with the reply; <|call|> ends a call there, as it is
        no text, so a call is complete when its arguments are whole JSON)."""
        kind = self._kind()
        if kind == "call":
            self.calls[-1].complete = not cut or _is_json(self.calls[-1].arguments)
        elif kind == "reasoning" and self.raw:
            out["content"].append(END)
        self.state, self.header = "header", Header()

    def _kind(self) -> str:
        if self.header.recipient and self._function() in self.names:
            return "call"
        return "reasoning" if self.header.channel == "analysis" else "content"

    def _function(self) -> str:
        return self.header.recipient.removeprefix("functions.")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _looks_like_header(text: str) -> bool:
    """Whether text held before a ``<|message|>`` may still be a header (else it is text)."""
    head = text.lstrip()
    return not head or any(head.startswith(o) or o.startswith(head) for o in HEADER_OPENERS)


def split_harmony(text: str, names: set[str] | None = None, prompt: str = "") -> tuple[str, str, list[HarmonyCall]]:
    """(reasoning, content, calls) of a whole reply."""
    reader = HarmonyReader(names, prompt)
    r1, c1 = reader.feed(text)
    r2, c2 = reader.finish()
    return r1 + r2, c1 + c2, reader.calls
