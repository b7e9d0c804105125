"""One choice's reply as it streams, read for what the routes answer beyond text: the
reasoning split off (a model that thinks, `engine.reasoning`), then the tool calls read out
of the content (a request with tools, `engine.tool_parse`); or, for a harmony model
(gpt-oss), its channels read by `engine.harmony` (analysis, final, calls). Both APIs build their answers,
streamed or whole, from the same `Reply`, so a streamed answer adds up to the whole one."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..engine.harmony import HarmonyReader, is_harmony
from ..engine.reasoning import ReasoningSplitter, start_state, thinking_tags
from ..engine.tool_parse import parse_reply


@dataclass
class CallState:
    """A call as far as it has been sent: OpenAI's id, the name, the arguments text."""

    id: str
    name: str
    arguments: str = ""
    done: bool = False


@dataclass
class Delta:
    """What one piece of the reply adds. `calls` in order: ("start", index) when a call's
    name is known, ("args", index, fragment) as its arguments grow; `done` lists the calls
    complete by now as (index, name, arguments as an object), for Ollama."""

    reasoning: str = ""
    content: str = ""
    calls: list[tuple] = field(default_factory=list)
    done: list[tuple] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls or self.done)


class Reply:
    """Feed the reply's text piece by piece (`feed`), then `finish`; each returns a `Delta`.
    `names`: the request's tool names (none: no calls are looked for); `splitter`: a
    `ReasoningSplitter` when the model's reasoning is to be split off; `harmony`: a
    `HarmonyReader`, which reads reasoning, content and calls alike (no splitter then)."""

    def __init__(
        self,
        names: set[str] | None = None,
        splitter: ReasoningSplitter | None = None,
        harmony: HarmonyReader | None = None,
    ):
        self.names = names or set()
        self.splitter, self.harmony = splitter, harmony
        self.text = ""  # the content side so far, before its calls are read out
        self.reasoning = ""
        self.content = ""  # as sent
        self.calls: list[CallState] = []

    def feed(self, text: str) -> Delta:
        if self.harmony:
            return self._channels(*self.harmony.feed(text))
        reasoning, content = self.splitter.feed(text) if self.splitter else ("", text)
        return self._advance(reasoning, content, final=False)

    def finish(self) -> Delta:
        if self.harmony:
            return self._channels(*self.harmony.finish())
        reasoning, content = self.splitter.finish() if self.splitter else ("", "")
        return self._advance(reasoning, content, final=True)

    def whole(self, text: str) -> "Reply":
        """Read a whole reply at once (a non-streamed answer)."""
        self.feed(text)
        self.finish()
        return self

    def _advance(self, reasoning: str, content: str, final: bool) -> Delta:
        delta = Delta(reasoning=reasoning)
        self.reasoning += reasoning
        self.text += content
        if not self.names:
            delta.content = content
        else:
            self._read_calls(delta, final)
        self.content += delta.content
        return delta

    def _channels(self, reasoning: str, content: str) -> Delta:
        """What a harmony reader made of a piece: its calls are the reader's, not parsed."""
        delta = Delta(reasoning=reasoning, content=content)
        self.reasoning += reasoning
        self.content += content
        self._sync_calls(self.harmony.calls, delta)
        return delta

    def _read_calls(self, delta: Delta, final: bool) -> None:
        parsed = parse_reply(self.text, self.names, final)
        # whitespace at the end of the content waits: it may stand before a call
        shown = parsed.content if final and not parsed.calls else parsed.content.rstrip()
        if shown.startswith(self.content):
            delta.content = shown[len(self.content) :]
        self._sync_calls(parsed.calls, delta)

    def _sync_calls(self, calls: list, delta: Delta) -> None:
        """Add to `delta` what the calls read so far (name, arguments, complete) add to those sent."""
        for k, call in enumerate(calls):
            if k == len(self.calls):
                self.calls.append(CallState(f"call_{uuid.uuid4().hex[:24]}", call.name))
                delta.calls.append(("start", k))
            state = self.calls[k]
            if call.arguments.startswith(state.arguments) and len(call.arguments) > len(state.arguments):
                delta.calls.append(("args", k, call.arguments[len(state.arguments) :]))
                state.arguments = call.arguments
            if call.complete and not state.done:
                state.done = True
                arguments = _object(state.arguments)
                if arguments is not None:
                    delta.done.append((k, state.name, arguments))

    # --- the whole answer ---------------------------------------------------------------
    def openai_message(self) -> dict:
        """The assistant message of OpenAI's chat completion."""
        message = {"role": "assistant", "content": self.content or (None if self.calls else "")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return message

    def complete_calls(self) -> list[tuple]:
        """(index, name, arguments as an object) of every call complete and valid."""
        calls = [(k, c.name, _object(c.arguments)) for k, c in enumerate(self.calls) if c.done]
        return [c for c in calls if c[2] is not None]

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish reason: "tool_calls" when the reply called a tool and ended by itself."""
        return "tool_calls" if self.calls and reason == "stop" else reason


def _object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def openai_call_delta(reply: Reply, event: tuple) -> dict:
    """One streamed tool-call delta: the first with id, type, name and empty arguments,
    then argument fragments (OpenAI's stream)."""
    if event[0] == "start":
        k = event[1]
        call = reply.calls[k]
        return {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
    _, k, fragment = event
    return {"index": k, "function": {"arguments": fragment}}


def ollama_calls(done: list[tuple]) -> list[dict]:
    """Ollama's `message.tool_calls` for complete calls (arguments as objects)."""
    return [{"function": {"index": k, "name": name, "arguments": arguments}} for k, name, arguments in done]


# --- reasoning, per request -------------------------------------------------------------------
def new_reply(names: set[str] | None, template: str | None, prompt: str | None, split: bool) -> Reply:
    """A `Reply` for a request: its tool names, and (`split`) a reasoning splitter that
    starts where the prompt left the reasoning block; for a harmony template, a channel
    reader that starts where the prompt left off (not `split`: analysis stays in the content)."""
    if is_harmony(template):
        return Reply(names, harmony=HarmonyReader(names, prompt or "", raw=not split))
    tags = thinking_tags(template)
    if not (split and tags):
        return Reply(names)
    return Reply(names, ReasoningSplitter(tags, start_state(prompt or "", tags)))
