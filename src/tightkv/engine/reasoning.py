"""Reasoning blocks: whether a chat template thinks (Qwen3's ``<think>...</think>``), and a
splitter that separates a reply's reasoning from its content as the text streams in, a tag
cut across tokens or pieces included.

It reads the reply as Ollama's thinking parser and llama.cpp's reasoning format "deepseek"
do: leading whitespace, then an opening tag starts the reasoning; the closing tag ends it;
whitespace around the tags belongs to neither side. A reply that begins with anything else
has no reasoning. Where the prompt itself left a block open (a template whose generation
prompt ends with ``<think>``, or an assistant message being continued inside its
reasoning), the reply starts inside the reasoning; where the prompt closed it (Qwen3's
``enable_thinking=False`` writes an empty block), everything is content.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
TAGS = (OPEN, CLOSE)

# splitter states
BEFORE, INSIDE, AFTER = "before", "inside", "after"


def thinking_tags(template: str | None) -> tuple[str, str] | None:
    """The tags a chat template's reasoning goes between; None when it does not think."""
    if template and OPEN in template and CLOSE in template:
        return TAGS
    return None


def thinks(template: str | None) -> bool:
    """Whether a chat template's model reasons before it answers: between tags, or in
    harmony's analysis channel (gpt-oss, `engine.harmony`)."""
    from .harmony import is_harmony

    return thinking_tags(template) is not None or is_harmony(template)


def thinking_plan(template: str | None, think: bool | None, constrained: bool = False) -> tuple[dict, bool]:
    """(template variables, whether the reply's reasoning is split off) for a request's wish
    to think (None: the model's default, which is to think when its template does). A model
    that does not think gets neither. A request whose output a grammar constrains does not
    think: its reply is the constrained text."""
    if thinking_tags(template) is None:
        return {}, False
    on = think is not False and not constrained
    return {"enable_thinking": on}, on


def think_vars(template: str | None, think: bool | str | None) -> dict:
    """The template variables of a chat's wish to think, as Ollama's CLI and API take it
    (`think`: True, False, a level "low" / "medium" / "high", or None for the model's
    default): a harmony template's `reasoning_effort` (`harmony.effort_level`: False is low,
    gpt-oss always reasons), a ``<think>`` template's `enable_thinking` (a level is True),
    nothing for a model that does not think. An unknown level raises ValueError."""
    from .harmony import effort_level, is_harmony

    if is_harmony(template):
        level = effort_level(think, None) if isinstance(think, str) else effort_level(None, think)
        return {"reasoning_effort": level} if level else {}
    if isinstance(think, str):
        effort_level(think, None)  # checked all the same
        think = True
    return thinking_plan(template, think)[0] if think is not None else {}


class PlainReader:
    """The reader of a reply with no reasoning: all of it is content."""

    def feed(self, text: str) -> tuple[str, str]:
        return "", text

    def finish(self) -> tuple[str, str]:
        return "", ""


def reply_reader(template: str | None, prompt: str = ""):
    """A reader that splits a chat reply into (reasoning, content) piece by piece (`feed`,
    then `finish`): harmony's channels (`harmony.HarmonyReader`, no tools: a message to a
    function is content), a ``<think>`` block from where the prompt left it
    (`ReasoningSplitter`), else all content (`PlainReader`)."""
    from .harmony import HarmonyReader, is_harmony

    if is_harmony(template):
        return HarmonyReader(prompt=prompt)
    tags = thinking_tags(template)
    return ReasoningSplitter(tags, start_state(prompt, tags)) if tags else PlainReader()


def start_state(prompt: str, tags: tuple[str, str] = TAGS) -> str:
    """Where the reply begins, from the prompt's end: INSIDE when the prompt left a reasoning
    block open, AFTER when it ends with a closed one, else BEFORE."""
    open_tag, close_tag = tags
    if prompt.rfind(open_tag) > prompt.rfind(close_tag):
        return INSIDE
    if prompt.rstrip().endswith(close_tag):
        return AFTER
    return BEFORE


def _overlap(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Feed it a reply piece by piece; each call returns the (reasoning, content) text that
    is certain by then, holding back only what the next piece may still change: a possible
    beginning of a tag, and whitespace that may turn out to sit next to one."""

    def __init__(self, tags: tuple[str, str] = TAGS, state: str = BEFORE):
        self.open, self.close = tags
        self.state = state
        self.eat_space = state == INSIDE  # whitespace right after an opening tag is dropped
        self.buf = ""  # text not handed out yet

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning, content = [], []
        while True:
            before = (self.state, len(self.buf))
            if self.state == BEFORE:
                self._before(content)
            elif self.state == INSIDE:
                self._inside(reasoning)
            else:
                self._after(content)
            if (self.state, len(self.buf)) == before:
                return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held, once the reply has ended."""
        held, self.buf = self.buf, ""
        if self.state == INSIDE:
            return held.rstrip(), ""
        if self.state == AFTER and self.eat_space:
            return "", held.lstrip()
        return "", held

    def _before(self, content: list[str]) -> None:
        stripped = self.buf.lstrip()
        if stripped.startswith(self.open):
            self.buf = stripped[len(self.open) :]
            self.state, self.eat_space = INSIDE, True
        elif not stripped or self.open.startswith(stripped):
            return  # whitespace, or a tag not complete yet
        else:  # no reasoning: all of it is content, as written
            content.append(self.buf)
            self.buf, self.state, self.eat_space = "", AFTER, False

    def _inside(self, reasoning: list[str]) -> None:
        if self.eat_space:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return
            self.eat_space = False
        end = self.buf.find(self.close)
        if end >= 0:
            reasoning.append(self.buf[:end].rstrip())
            self.buf = self.buf[end + len(self.close) :]
            self.state, self.eat_space = AFTER, True
            return
        keep = _overlap(self.buf, self.close)
        body = self.buf[: len(self.buf) - keep]
        sure = body.rstrip()  # trailing whitespace waits: it may come right before the closing tag
        reasoning.append(sure)
        self.buf = self.buf[len(sure) :]

    def _after(self, content: list[str]) -> None:
        if self.eat_space:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return
            self.eat_space = False
        content.append(self.buf)
        self.buf = ""


def split_reasoning(text: str, tags: tuple[str, str] = TAGS, state: str = BEFORE) -> tuple[str, str]:
    """(reasoning, content) of a whole reply."""
    splitter = ReasoningSplitter(tags, state)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
