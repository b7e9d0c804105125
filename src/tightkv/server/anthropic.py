"""Anthropic's Messages API, as Anthropic documents it and llama-server serves it:
POST /v1/messages (one message, or its SSE events) and /v1/messages/count_tokens.

A request becomes the same protocol-neutral `ChatRequest` a chat completion makes (the
system text, the turns, an assistant's tool_use blocks as its tool calls, a user's
tool_result blocks as tool messages), so it runs on the same engine, prefix store and
batch; the reply is read by the same `Reply` (reasoning split off, tool calls parsed) and
written as Anthropic's content blocks: thinking, text, tool_use. Errors come in Anthropic's
shape (`http.ApiError` picks it by path).

Where Anthropic's API and a local model part: `max_tokens` is a cap, and the reply also
ends where the context does (stop_reason `model_context_window_exceeded`); `thinking`
enabled or disabled asks a model that thinks to think or not (absent: its default), and a
model that does not think answers without thinking blocks, as llama-server does; thinking
blocks carry an empty signature; `budget_tokens` is checked, the reply's length is capped
by `max_tokens` alone."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..engine.requests import Budget, ChatRequest
from ..modelfile import sampling_defaults, with_system
from .http import (
    ApiError,
    JobStream,
    as_api_error,
    collect,
    dumps,
    events,
    parse_body,
    prepare_only,
    request_body,
    start_job,
)
from .outputs import constraint_options
from .replies import Reply, new_reply
from .scheduler import DONE, ERROR, PIECE
from .schemas import CountTokensRequest, MessagesRequest

router = APIRouter(prefix="/v1", tags=["Anthropic"])

MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens
TEXT_ONLY = ("image", "document")
# the blocks a message may hold -> the role whose messages hold them (None: either)
BLOCK_ROLES = {"text": None, "thinking": "assistant", "redacted_thinking": "assistant"}
BLOCK_ROLES |= {"tool_use": "assistant", "tool_result": "user"}
SIGNATURE = ""  # a thinking block's signature: a local model has none to give


# --- the request ---------------------------------------------------------------------------
def _system(system) -> list[dict]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "\n".join(b.text for b in system)
    return [{"role": "system", "content": text}] if text else []


def _result_text(block, where: str) -> str:
    """A tool_result's content as text (a string, or text blocks)."""
    content = block.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for k, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(
                400,
                f"'{where}.content.{k}': a tool_result's content must be text blocks: the model reads text only",
                param=f"{where}.content.{k}",
            )
        parts.append(part["text"])
    return "\n".join(parts)


def _required(value, where: str) -> None:
    if value is None:
        raise ApiError(400, f"'{where}' is required", param=where)


def _check_block(b, where: str, role: str) -> None:
    """A 400 for a block the model cannot read, or one in the other role's message."""
    if b.type in TEXT_ONLY:
        raise ApiError(400, f"'{where}': {b.type} blocks are not supported: the model reads text only", param=where)
    if b.type not in BLOCK_ROLES:
        raise ApiError(400, f"'{where}': {b.type!r} blocks are not supported", param=where)
    if BLOCK_ROLES[b.type] not in (None, role):
        raise ApiError(400, f"'{where}': {b.type} blocks belong in {BLOCK_ROLES[b.type]} messages", param=where)


def _turn(m, i: int, names: dict[str, str]) -> list[dict]:
    """One Anthropic message as chat-template messages: its tool results as tool messages
    (first: they answer the calls before), then its text, calls and reasoning as one message.
    `names` maps the tool_use ids seen so far to their tools."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    text, reasoning, calls, results = [], [], [], []
    for j, b in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        _check_block(b, where, m.role)
        if b.type == "text":
            _required(b.text, f"{where}.text")
            text.append(b.text)
        elif b.type == "thinking":
            reasoning.append(b.thinking or "")
        elif b.type == "tool_use":
            for name in ("id", "name"):
                _required(getattr(b, name), f"{where}.{name}")
            names[b.id] = b.name
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}})
        elif b.type == "tool_result":
            _required(b.tool_use_id, f"{where}.tool_use_id")
            result = {"role": "tool", "tool_call_id": b.tool_use_id, "content": _result_text(b, where)}
            results.append(result | ({"name": names[b.tool_use_id]} if b.tool_use_id in names else {}))
    if results and not (text or calls or reasoning):
        return results
    message = {"role": m.role, "content": "\n".join(text)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return [*results, message]


def _messages(req) -> list[dict]:
    """The conversation as chat templates read it (the system text first)."""
    names: dict[str, str] = {}
    return _system(req.system) + [msg for i, m in enumerate(req.messages) for msg in _turn(m, i, names)]


def _tools(req) -> list[dict] | None:
    """The request's custom tools as function specs, checked; None when there are none or
    tool_choice is none."""
    choice = req.tool_choice.type if req.tool_choice else None
    if not req.tools:
        if choice in ("any", "tool"):
            raise ApiError(400, f"'tool_choice' {choice} needs 'tools'", param="tool_choice")
        return None
    seen = set()
    for i, t in enumerate(req.tools):
        if t.type not in (None, "custom"):
            raise ApiError(
                400,
                f"'tools.{i}': server tools ({t.type}) are not supported: give custom tools (name, input_schema)",
                param=f"tools.{i}",
            )
        if not isinstance(t.input_schema, dict) or t.input_schema.get("type") != "object":
            where = f"tools.{i}.input_schema"
            raise ApiError(400, f"'{where}' must be a JSON schema of type object", param=where)
        if t.name in seen:
            raise ApiError(400, f"'tools.{i}.name': tool names must be unique ({t.name!r} twice)", param=f"tools.{i}")
        seen.add(t.name)
    if choice == "none":
        return None
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in req.tools
    ]


def _forced_call(choice, names: set[str]) -> str | None:
    """None: the model chooses (auto); "": it must call a tool (any); else the tool it must call."""
    if choice is None or choice.type == "auto":
        return None
    if choice.type == "any":
        return ""
    if choice.name not in names:
        raise ApiError(400, f"'tool_choice.name' must name one of 'tools', not {choice.name!r}", param="tool_choice")
    return choice.name


def _think(req, max_tokens: int | None) -> bool | None:
    """Anthropic's thinking as the engine's wish to think (None: the model's default)."""
    t = req.thinking
    if t is None or t.type == "adaptive":
        return None
    if t.type == "disabled":
        return False
    budget = t.budget_tokens
    if budget is None or budget < MIN_THINKING_BUDGET:
        raise ApiError(
            400, f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}", param="thinking.budget_tokens"
        )
    if max_tokens is not None and budget >= max_tokens:
        raise ApiError(400, "'thinking.budget_tokens' must be less than 'max_tokens'", param="thinking.budget_tokens")
    return True


def _format(req) -> dict:
    """output_config.format ({type: json_schema, schema}) as the engine's constraint."""
    fmt = req.output_config.format if req.output_config else None
    if fmt is None:
        return {}
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        where = "output_config.format"
        raise ApiError(400, f"'{where}' must be {{type: json_schema, schema: {{...}}}}", param=where)
    return constraint_options(json_schema=fmt["schema"])


def _options(req, served) -> dict:
    """Sampling and stop options of a messages request: the request's, else the model's
    Modelfile PARAMETERs, else Anthropic's defaults (temperature 1)."""
    stops = req.stop_sequences or []
    for k, s in enumerate(stops):
        if not s.strip():
            raise ApiError(400, f"'stop_sequences.{k}' must contain non-whitespace", param=f"stop_sequences.{k}")
    given = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "stop": req.stop_sequences}
    options = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "stop": []} | sampling_defaults(served.parameters)
    return options | {k: v for k, v in given.items() if v is not None}


def chat_request(req, served, options: dict, max_tokens: int | None = None) -> ChatRequest:
    """The engine's request for an Anthropic request to the model `served`: a messages body
    (its `max_tokens` a cap, the reply also ending where the context does), or a count_tokens
    body (no budget). The model's Modelfile SYSTEM stands where the request has none."""
    tools = _tools(req)
    names = {t["function"]["name"] for t in tools or ()}
    choice = req.tool_choice
    return ChatRequest(
        with_system(_messages(req), served.system),
        Budget(max_tokens, fit=max_tokens is not None),
        {**options, **_format(req)},
        tools=tools,
        forced_call=_forced_call(choice, names) if tools else None,
        parallel_calls=not (choice and choice.disable_parallel_tool_use),
        think=_think(req, max_tokens),
        effort=req.output_config.effort if req.output_config else None,
        no_tools="this model's chat template does not take tools",
    )


# --- the answer ----------------------------------------------------------------------------
def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _content(reply: Reply) -> list[dict]:
    """The message's content blocks: thinking, text, then the tool calls."""
    blocks = [{"type": "thinking", "thinking": reply.reasoning, "signature": SIGNATURE}] if reply.reasoning else []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    args = {k: a for k, _, a in reply.complete_calls()}
    for k, c in enumerate(reply.calls):
        blocks.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": args.get(k, {})})
    return blocks


def _stop(reply: Reply, stats, max_tokens: int, stops: list[str]) -> dict:
    """stop_reason and stop_sequence of a finished reply."""
    if stats.finish_reason == "length":
        reason = "max_tokens" if stats.generated_tokens >= max_tokens else "model_context_window_exceeded"
    elif reply.calls:
        reason = "tool_use"
    elif stats.stop_word is not None and stats.stop_word in stops:
        return {"stop_reason": "stop_sequence", "stop_sequence": stats.stop_word}
    else:
        reason = "end_turn"
    return {"stop_reason": reason, "stop_sequence": None}


def _usage(stats) -> dict:
    """Anthropic's usage: input_tokens are those not read from the prefix store."""
    return {
        "input_tokens": stats.prompt_tokens - stats.cached_tokens,
        "output_tokens": stats.generated_tokens,
        "cache_read_input_tokens": stats.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _event(name: str, body: dict) -> str:
    return f"event: {name}\ndata: {dumps({'type': name, **body})}\n\n"


class BlockStream:
    """The streamed content blocks: one open at a time, opened by its first delta and
    closed when another begins (thinking, text, then each tool call), as Anthropic streams."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.index = -1
        self.open = None  # "thinking", "text" or ("call", k)

    def feed(self, delta) -> list[str]:
        """The events of what a piece of the reply added (a `replies.Delta`)."""
        out = []
        if delta.reasoning:
            out += self._add("thinking", {"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.content:
            out += self._add("text", {"type": "text_delta", "text": delta.content})
        for event in delta.calls:
            if event[0] == "start":
                out += self._start(("call", event[1]))
            else:
                out += self._add(("call", event[1]), {"type": "input_json_delta", "partial_json": event[2]})
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": SIGNATURE}))
        out.append(_event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def _start(self, key) -> list[str]:
        if self.open == key:
            return []
        out = self.close()
        self.index, self.open = self.index + 1, key
        if key == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": SIGNATURE}
        elif key == "text":
            block = {"type": "text", "text": ""}
        else:
            call = self.reply.calls[key[1]]
            block = {"type": "tool_use", "id": _tool_id(call.id), "name": call.name, "input": {}}
        return out + [_event("content_block_start", {"index": self.index, "content_block": block})]

    def _add(self, key, delta: dict) -> list[str]:
        return self._start(key) + [self._delta(delta)]

    def _delta(self, delta: dict) -> str:
        return _event("content_block_delta", {"index": self.index, "delta": delta})


# --- the routes ----------------------------------------------------------------------------
@router.post(
    "/messages",
    summary="Anthropic's Messages API: a message, or its events streamed as SSE",
    openapi_extra=request_body(MessagesRequest),
)
async def messages(request: Request):
    req = await parse_body(request, MessagesRequest)
    picked = request.app.state.tk.pick(req.model)
    job = await start_job(request, chat_request(req, picked.served, _options(req, picked.served), req.max_tokens))
    prep = job.prepared
    reply = new_reply(prep.tool_names, prep.template, prep.text, prep.split)
    head = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": picked.served.id}
    stops = req.stop_sequences or []
    if not req.stream:
        text, stats, _ = await collect(request, job)
        reply.whole(text)
        body = {
            **head,
            "content": _content(reply),
            **_stop(reply, stats, req.max_tokens, stops),
            "usage": _usage(stats),
        }
        return JSONResponse(body)

    async def sse():
        usage = {"input_tokens": len(prep.ids), "output_tokens": 0}
        usage |= {"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
        start = {**head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        yield _event("message_start", {"message": start})
        yield _event("ping", {})
        blocks = BlockStream(reply)
        async for kind, value in events(job):
            if kind == PIECE:
                for event in blocks.feed(reply.feed(value)):
                    yield event
            elif kind == DONE:
                for event in blocks.feed(reply.finish()) + blocks.close():
                    yield event
                yield _event(
                    "message_delta", {"delta": _stop(reply, value, req.max_tokens, stops), "usage": _usage(value)}
                )
                yield _event("message_stop", {})
            elif kind == ERROR:
                yield _event("error", {"error": as_api_error(value).body(request.url.path)["error"]})

    return JobStream(job, sse(), "text/event-stream")


@router.post(
    "/messages/count_tokens",
    summary="The prompt's token count, through the chat template with the tools",
    openapi_extra=request_body(CountTokensRequest),
)
async def count_tokens(request: Request):
    req = await parse_body(request, CountTokensRequest)
    picked = request.app.state.tk.pick(req.model)
    prep = await prepare_only(picked.scheduler, chat_request(req, picked.served, {}))
    return {"input_tokens": len(prep.ids)}
