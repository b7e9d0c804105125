"""Tool calls read out of a reply, whole or while it is still streaming.

`parse_reply(text, names, final)` is a pure function of the text so far: the content that
is certain, and the calls found, each with the raw JSON text of its arguments as far as it
has come. Parsing the growing text again after each piece and sending what grew is how a
server streams calls (llama.cpp's server diffs its partial parses the same way): a call
appears as soon as its name is known, and its arguments grow fragment by fragment.

Where calls are looked for, by what the model writes:
- ``<tool_call>`` ... ``</tool_call>`` (Hermes: Qwen2.5, Qwen3), one or more JSON calls inside;
- ``[TOOL_CALLS]`` then a JSON list of calls (Mistral);
- a JSON call (or a list of them) opening the reply, bare or in a ```json fence, and a
  fenced call anywhere (what small models write; Llama 3's JSON calls are the bare kind).

A call is ``{"name": ..., "arguments": {...}}`` (or ``"parameters"``, Llama 3's key), or
the same wrapped as ``{"function": {...}}``, or with arguments as a JSON string; only the
first form streams its arguments, the others appear whole once their object is complete.
Only names among the request's tools are calls. A block that holds no call stays in the
content as written; text that may still turn into a call (a tag or fence cut short, a JSON
object opening the reply) is held until it is decided, or until the reply ends (`final`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WS = " \t\r\n"
TAG, TAG_END, MISTRAL, FENCE = "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "```"
OPENERS = (TAG, MISTRAL, FENCE)


@dataclass
class ParsedCall:
    name: str
    arguments: str  # the raw JSON text of the arguments so far
    complete: bool = False


@dataclass
class ParsedReply:
    content: str
    calls: list[ParsedCall]


class _NeedMore(Exception):
    """The text ends before the structure being read is decided."""


class _NotCall(Exception):
    """The structure is not a call of the streaming form."""


def parse_reply(text: str, names: set[str], final: bool = False) -> ParsedReply:
    """The content and the calls of a reply (`final`: the reply has ended, nothing is held)."""
    content: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while pos < len(text):
        at_start = not "".join(content).strip()
        start, opener = _next_opener(text, pos, at_start)
        if opener is None:
            tail = text[pos:]
            content.append(tail if final else tail[: len(tail) - _partial_opener(tail)])
            break
        content.append(text[pos:start])
        found: list[ParsedCall] = []
        try:
            end = _READERS[opener](text, start, names, found)
        except _NeedMore:
            calls += found
            if final and not found:
                content.append(text[start:])  # never decided: as written
            break
        if found:
            calls += found
        else:
            content.append(text[start:end])  # held no call: content, as written
        pos = end
    return ParsedReply("".join(content), calls)


def _next_opener(text: str, pos: int, at_start: bool) -> tuple[int, str | None]:
    """The first place a call may begin at or after `pos`, and how it begins."""
    if at_start:
        j = _skip_ws(text, pos)
        if j < len(text) and text[j] in "{[":
            return j, "bare"
    hits = [(text.find(o, pos), o) for o in OPENERS]
    hits = [(i, o) for i, o in hits if i >= 0]
    return min(hits) if hits else (len(text), None)


def _partial_opener(tail: str) -> int:
    """How much of the end of `tail` may be the beginning of an opener."""
    return max((n for o in OPENERS for n in range(1, len(o)) if tail.endswith(o[:n])), default=0)


# --- the blocks calls come in ----------------------------------------------------------------
def _read_tag(text: str, i: int, names: set[str], found: list) -> int:
    return _sequence(text, i + len(TAG), names, found, close=TAG_END)


def _read_mistral(text: str, i: int, names: set[str], found: list) -> int:
    return _sequence(text, i + len(MISTRAL), names, found)


def _read_bare(text: str, i: int, names: set[str], found: list) -> int:
    return _sequence(text, i, names, found)


def _read_fence(text: str, i: int, names: set[str], found: list) -> int:
    j = i + len(FENCE)
    j += len(re.match(r"[A-Za-z]*", text[j:]).group())
    k = _skip_ws(text, j)
    if k >= len(text):
        raise _NeedMore
    if text[k] not in "{[":
        return j  # a fence of something else: content
    end = _sequence(text, k, names, found)
    if not found:
        return end
    k = _skip_ws(text, end)
    if text.startswith(FENCE, k):
        return k + len(FENCE)
    if k >= len(text) or FENCE.startswith(text[k:]):
        raise _NeedMore
    return end


_READERS = {TAG: _read_tag, MISTRAL: _read_mistral, FENCE: _read_fence, "bare": _read_bare}


def _sequence(text: str, j: int, names: set[str], found: list, close: str | None = None) -> int:
    """Calls one after another (objects or lists of them, apart by whitespace or commas),
    up to `close` (whatever else is inside is skipped) or, without one, to the first text
    that is not JSON."""
    while True:
        j = _skip_ws(text, j)
        if close and text.startswith(close, j):
            return j + len(close)
        if j >= len(text) or (close and close.startswith(text[j:])):
            raise _NeedMore
        c = text[j]
        if c == "{":
            j = _object(text, j, names, found)
        elif c == "[":
            j = _list(text, j, names, found)
        elif c == ",":
            j += 1
        elif close:
            end = text.find(close, j)
            if end < 0:
                raise _NeedMore
            j = end
        else:
            return j


def _list(text: str, i: int, names: set[str], found: list) -> int:
    j = i + 1
    while True:
        j = _skip_ws(text, j)
        if j >= len(text):
            raise _NeedMore
        c = text[j]
        if c == "]":
            return j + 1
        if c == ",":
            j += 1
        elif c == "{":
            j = _object(text, j, names, found)
        else:
            j = _value_end(text, j)


def _object(text: str, i: int, names: set[str], found: list) -> int:
    """One JSON object at `i`; a call is added to `found` (while its arguments stream, as
    far as they have come). Returns the object's end."""
    try:
        name, args_at = _call_head(text, i, names)
    except _NotCall:
        return _whole_object(text, i, names, found)
    call = ParsedCall(name, "")
    found.append(call)
    try:
        end = _value_end(text, args_at)
    except _NeedMore:
        call.arguments = text[args_at:]
        raise
    call.arguments, call.complete = text[args_at:end], True
    return _value_end(text, end, depth=1)  # the rest of the call's object


def _call_head(text: str, i: int, names: set[str]) -> tuple[str, int]:
    """`{"name": NAME, "arguments": ` with NAME among `names` and an object to follow: the
    name and where the arguments begin."""
    j = _literal(text, i, "{")
    j = _literal(text, j, '"name"')
    j = _literal(text, j, ":")
    name, j = _string(text, j)
    j = _literal(text, j, ",")
    key, j = _string(text, j)
    if key not in ("arguments", "parameters"):
        raise _NotCall
    j = _skip_ws(text, _literal(text, j, ":"))
    if j >= len(text):
        raise _NeedMore
    if text[j] != "{" or name not in names:
        raise _NotCall
    return name, j


def _whole_object(text: str, i: int, names: set[str], found: list) -> int:
    """An object read whole: a call in any of the other forms, or no call."""
    end = _value_end(text, i)
    try:
        item = json.loads(text[i:end])
    except ValueError:
        return end
    item = item.get("function", item) if isinstance(item.get("function"), dict) else item
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return end
    if item.get("name") in names and isinstance(args, dict):
        found.append(ParsedCall(item["name"], json.dumps(args, ensure_ascii=False), True))
    return end


# --- JSON, read as far as it has come ---------------------------------------------------------
def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _literal(text: str, i: int, lit: str) -> int:
    i = _skip_ws(text, i)
    got = text[i : i + len(lit)]
    if got == lit:
        return i + len(lit)
    if i + len(got) == len(text) and lit.startswith(got):
        raise _NeedMore
    raise _NotCall


def _string(text: str, i: int) -> tuple[str, int]:
    i = _skip_ws(text, i)
    if i >= len(text):
        raise _NeedMore
    if text[i] != '"':
        raise _NotCall
    end = _string_end(text, i)
    try:
        return json.loads(text[i:end]), end
    except ValueError:
        raise _NotCall from None


def _string_end(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    raise _NeedMore


def _value_end(text: str, i: int, depth: int = 0) -> int:
    """The end of the JSON value at `i` (or, with `depth` 1, of the object `i` is inside)."""
    if depth == 0 and text[i] == '"':
        return _string_end(text, i)
    if depth == 0 and text[i] not in "{[":
        m = re.match(r"[^\s,\]\}]*", text[i:])
        if i + m.end() >= len(text):
            raise _NeedMore
        return i + m.end()
    j = i
    while j < len(text):
        c = text[j]
        if c == '"':
            j = _string_end(text, j)
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _NeedMore
