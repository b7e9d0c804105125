"""Tool calls: which format a chat template asks the model to call tools in, the grammar
that forces a call (tool_choice "required" or a named function), and the parser that
turns a reply back into (content, calls).

Formats, by what the template says (`engine.tool_parse` reads them all back):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5, Qwen3, Hermes).
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``.
- ``llama3``: a bare JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3).
- ``harmony``: a commentary message to ``functions.NAME`` (gpt-oss; `engine.harmony` reads
  and constrains it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import TightKVError
from .grammar import json_rule
from .harmony import is_harmony
from .tool_parse import parse_reply


@dataclass
class ToolCall:
    name: str
    arguments: dict


def tool_format(template: str | None) -> str | None:
    """The call format a chat template defines; None when it does not take tools."""
    if not template or "tools" not in template:
        return None
    if is_harmony(template):
        return "harmony"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    return "llama3"


def _call_schema(tool: dict, args_key: str) -> dict:
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", args_key],
        "properties": {"name": {"const": fn["name"]}, args_key: params},
    }


def call_grammar(fmt: str, tools: list[dict], name: str | None = None, parallel: bool = True) -> str:
    """A Lark grammar (llguidance) for one call (or, with `parallel`, one or more) of the
    named tool, or of any of `tools`, in format `fmt`; arguments valid for the tool's schema,
    closed as response-format schemas are (no keys it does not name, unless it allows them;
    `grammar.closed_objects`), whitespace bounded as in `grammar.json_rule`."""
    chosen = [t for t in tools if t.get("function", t).get("name") == name] if name else tools
    if not chosen:
        raise TightKVError(f"tool_choice names {name!r}, which is not among the tools")
    key = "parameters" if fmt == "llama3" else "arguments"
    schemas = [_call_schema(t, key) for t in chosen]
    call = "call: " + json_rule(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})
    more = ' ("\\n" one)*' if parallel else ""
    if fmt == "hermes":
        return f'start: one{more}\none: "<tool_call>\\n" call "\\n</tool_call>"\n{call}'
    if fmt == "mistral":
        rest = ' (", " call)*' if parallel else ""
        return f'start: "[TOOL_CALLS][" call{rest} "]"\n{call}'
    return f"start: one{more}\none: call\n{call}"


def parse_tool_calls(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """(the content outside calls, the calls) of a whole reply; [] when it calls nothing
    (`engine.tool_parse` reads it, as it reads a streaming one)."""
    parsed = parse_reply(text, names, final=True)
    calls = []
    for call in parsed.calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            continue
        if isinstance(arguments, dict):
            calls.append(ToolCall(call.name, arguments))
    return (parsed.content.strip(), calls) if calls else (text, [])


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: an assistant's tool_calls with their
    arguments as objects (OpenAI sends JSON strings), content never None."""
    out = []
    for m in messages:
        m = dict(m, content=m.get("content") or "")
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function", c))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"] or "{}")
                    except ValueError:
                        raise TightKVError(f"tool call arguments are not JSON: {fn['arguments'][:80]!r}") from None
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out
