"""Tool calls: which format a chat template asks the model to call tools in, the grammar
that forces a call (tool_choice "required" or a named function), and the parser that
turns a reply back into (content, calls).

Formats, by what the template says:
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5, Qwen3, Hermes).
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``.
- ``llama3``: a bare JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3).
The parser reads any of them, and the JSON object small models often write instead (bare
or in a ```json fence), when its name is one of the request's tools.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import TightKVError


@dataclass
class ToolCall:
    name: str
    arguments: dict


def tool_format(template: str | None) -> str | None:
    """The call format a chat template defines; None when it does not take tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    return "llama3"


def _call_schema(tool: dict, args_key: str) -> dict:
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {"type": "object"}
    return {"type": "object", "additionalProperties": False, "required": ["name", args_key],
            "properties": {"name": {"const": fn["name"]}, args_key: params}}


def call_grammar(fmt: str, tools: list[dict], name: str | None = None, parallel: bool = True) -> str:
    """A Lark grammar (llguidance) for one call (or, with `parallel`, one or more) of the
    named tool, or of any of `tools`, in format `fmt`; arguments valid for the tool's schema."""
    chosen = [t for t in tools if t.get("function", t).get("name") == name] if name else tools
    if not chosen:
        raise TightKVError(f"tool_choice names {name!r}, which is not among the tools")
    key = "parameters" if fmt == "llama3" else "arguments"
    schemas = [_call_schema(t, key) for t in chosen]
    call = "call: %json " + json.dumps(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})
    more = ' ("\\n" one)*' if parallel else ""
    if fmt == "hermes":
        return f'start: one{more}\none: "<tool_call>\\n" call "\\n</tool_call>"\n{call}'
    if fmt == "mistral":
        rest = ' (", " call)*' if parallel else ""
        return f'start: "[TOOL_CALLS][" call{rest} "]"\n{call}'
    return f"start: one{more}\none: call\n{call}"


_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse_tool_calls(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """(the content outside calls, the calls) of a reply; [] when it calls nothing."""
    if "<tool_call>" in text:
        calls = [c for body in _TAG.findall(text) for c in _calls(body, names)]
        return _TAG.sub("", text).strip(), calls
    if "[TOOL_CALLS]" in text:
        head, _, body = text.partition("[TOOL_CALLS]")
        return head.strip(), _calls(body, names)
    for m in _FENCE.finditer(text):
        calls = _calls(m.group(1), names)
        if calls:
            return (text[: m.start()] + text[m.end():]).strip(), calls
    stripped = text.strip()
    if stripped[:1] in "{[":
        calls = _calls(stripped, names)
        if calls:
            return "", calls
    return text, []


def _calls(body: str, names: set[str]) -> list[ToolCall]:
    """The calls in a JSON text: one object, a list of them, or objects one per line."""
    try:
        docs = [json.loads(body)]
    except ValueError:
        docs = []
        for line in body.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for doc in docs:
        for item in doc if isinstance(doc, list) else [doc]:
            if not isinstance(item, dict):
                continue
            item = item.get("function", item)
            args = item.get("arguments", item.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    continue
            if item.get("name") in names and isinstance(args, dict):
                out.append(ToolCall(item["name"], args))
    return out


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
