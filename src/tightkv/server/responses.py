"""OpenAI's Responses API as llama-server and vLLM serve it: POST /v1/responses (one JSON
or typed SSE events), POST /v1/responses/input_tokens, and responses kept in memory (GET
and DELETE /v1/responses/{id}, `previous_response_id`).

It runs on the chat pipeline: the input items become a `ChatRequest` (messages, tools,
structured output, reasoning), the reply is read by `replies.Reply` as chat completions
read it, and its deltas become output items (reasoning, message, function_call), streamed
as events or answered whole from the same `Output`, so a stream adds up to the whole."""

from __future__ import annotations

import copy
import time
import uuid
from collections import OrderedDict

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..engine.requests import Budget, ChatRequest
from ..modelfile import sampling_defaults, with_system
from .http import (
    ApiError,
    JobStream,
    as_api_error,
    collect_all,
    dumps,
    finite,
    parse_body,
    prepare_only,
    request_body,
    start_choices,
)
from .openai import check_ranges
from .outputs import constraint_options
from .replies import Delta, Reply, new_reply
from .scheduler import DONE, ERROR, PIECE
from .schemas import InputTokensRequest, ResponsesRequest

router = APIRouter(prefix="/v1", tags=["OpenAI"])

KEPT = 128  # stored responses held in memory; the oldest is forgotten first


# --- the request ---------------------------------------------------------------------------
def _parts_text(content, where: str, kinds: tuple[str, ...]) -> str:
    """The text of a message's content: a string, or parts of the given text kinds."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}' must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise ApiError(
                400, f"'{where}.{j}': {kind!r} parts are not supported: the model reads text only", param=f"{where}.{j}"
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise ApiError(400, f"'{where}.{j}.text' must be a string", param=f"{where}.{j}.text")
        texts.append(text)
    return "\n".join(texts)


def _assistant(messages: list[dict]) -> dict:
    """The assistant message that output items add to: the last one, or a new one."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    return value


def _message(messages: list[dict], item: dict, where: str) -> None:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise ApiError(400, f"'{where}.role' must be user, system, developer or assistant", param=f"{where}.role")
    text = _parts_text(item.get("content"), f"{where}.content", ("input_text", "output_text", "refusal"))
    if role == "assistant":
        _assistant(messages)["content"] += text
    else:
        messages.append({"role": "system" if role == "developer" else role, "content": text})


def _function_call(messages: list[dict], item: dict, where: str) -> None:
    function = {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}
    call = {"id": _string(item, "call_id", where), "type": "function", "function": function}
    _assistant(messages).setdefault("tool_calls", []).append(call)


def _function_call_output(messages: list[dict], item: dict, where: str) -> None:
    call_id = _string(item, "call_id", where)
    output = _parts_text(item.get("output"), f"{where}.output", ("input_text", "output_text"))
    message = {"role": "tool", "tool_call_id": call_id, "content": output}
    names = [c["function"]["name"] for m in messages for c in m.get("tool_calls", ()) if c["id"] == call_id]
    if names:
        message["name"] = names[-1]  # for templates that name the tool a result comes from
    messages.append(message)


def _reasoning(messages: list[dict], item: dict, where: str) -> None:
    parts = item.get("content") or item.get("summary") or []
    text = _parts_text(parts, f"{where}.content", ("reasoning_text", "summary_text"))
    reply = _assistant(messages)
    reply["reasoning_content"] = reply.get("reasoning_content", "") + text


ITEMS = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
    "reasoning": _reasoning,
}


def input_messages(items: str | list, messages: list[dict] | None = None) -> list[dict]:
    """Chat messages (as chat completions sends them to the template) from Responses input,
    after `messages` (a stored conversation): a string is a user message; an assistant's
    output items (message, reasoning, function_call) join one assistant message, as
    llama-server merges them; a function_call_output is a tool message."""
    messages = copy.deepcopy(messages or [])  # a stored conversation stays as it was
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise ApiError(400, f"'{where}' must be an object", param=where)
        kind = item.get("type", "message")
        if kind not in ITEMS:
            raise ApiError(
                400,
                f"'{where}.type' {kind!r} is not supported: give {', '.join(ITEMS)} items",
                param=f"{where}.type",
            )
        ITEMS[kind](messages, item, where)
    return messages


def _tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses' flat function tools in chat completions' shape ({type, function: {...}})."""
    out = []
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ApiError(
                400,
                f"'{where}' must be {{type: function, name, parameters}}: only function tools are served",
                param=where,
            )
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ApiError(400, f"'{where}.parameters' must be a JSON schema object", param=f"{where}.parameters")
        spec = {k: v for k, v in tool.items() if k in ("name", "description", "strict")}
        out.append({"type": "function", "function": {**spec, "parameters": parameters}})
    return out or None


def _forced_call(choice, names: set[str]) -> str | None:
    """None: the model chooses (auto); "": some call (required); else the function's name."""
    if choice in (None, "auto"):
        return None
    if choice == "required":
        return ""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in names:
            raise ApiError(
                400, f"'tool_choice' names {choice['name']!r}, which is not among the tools", param="tool_choice"
            )
        return choice["name"]
    raise ApiError(400, "'tool_choice' must be none, auto, required or {type: function, name}", param="tool_choice")


def _format(text: dict | None) -> dict:
    """`Model.sequence` constraint options from `text.format` (json_schema's schema is flat here)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return {}
    if not isinstance(fmt, dict):
        raise ApiError(400, "'text.format' must be an object", param="text.format")
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "'text.format.schema' must be a JSON schema object", param="text.format.schema")
        return constraint_options({"type": "json_schema", "json_schema": {"schema": fmt["schema"]}})
    try:
        return constraint_options(fmt)
    except ApiError as err:
        raise ApiError(400, err.message.replace("response_format", "text.format"), param="text.format") from None


def _effort(reasoning: dict | None) -> str | None:
    effort = (reasoning or {}).get("effort")
    if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise ApiError(
            400, "'reasoning.effort' must be none, minimal, low, medium, high or xhigh", param="reasoning.effort"
        )
    return effort


def chat_request(req, conversation: list[dict], system: str | None = None, budget=None, options=None) -> ChatRequest:
    """The `ChatRequest` of a Responses request: its `conversation` (`input_messages`: a
    stored one continued, then the input) after the instructions as a system message, or
    else the model's own SYSTEM (a Modelfile's)."""
    for name, use in (("conversation", "previous_response_id"), ("prompt", "input and instructions")):
        if getattr(req, name) is not None:
            raise ApiError(400, f"'{name}' is not supported: send {use}", param=name)
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = with_system(instructions + conversation, system)
    if not messages:
        raise ApiError(400, "'input' must not be empty", param="input")
    tools = _tools(req.tools) if req.tool_choice != "none" else None
    names = {t["function"]["name"] for t in tools or ()}
    forced = _forced_call(req.tool_choice, names) if req.tool_choice != "none" else None
    if forced is not None and not tools:
        raise ApiError(400, f"'tool_choice' {req.tool_choice!r} needs 'tools'", param="tool_choice")
    effort = _effort(req.reasoning)
    return ChatRequest(
        messages,
        budget or Budget(),
        {**(options or {}), **_format(req.text)},
        tools=tools,
        forced_call=forced,
        parallel_calls=req.parallel_tool_calls is not False,
        think=False if effort == "none" else None,
        effort=effort,
        template_vars={"enable_thinking": False} if effort == "none" else {},
    )


def _sampling(req: ResponsesRequest, served) -> tuple[int | None, dict]:
    """max_output_tokens and the sampling options, in OpenAI's ranges; the model's Modelfile
    PARAMETERs where the request gives none, as chat completions takes them."""
    for name in ("temperature", "top_p"):
        finite(getattr(req, name), name)
    check_ranges({name: getattr(req, name) for name in ("temperature", "top_p", "max_output_tokens")})
    options = {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
    }
    options.update({k: v for k, v in sampling_defaults(served.parameters).items() if getattr(req, k, None) is None})
    max_tokens = req.max_output_tokens
    if max_tokens is None and served.parameters.get("num_predict", -1) >= 0:
        max_tokens = served.parameters["num_predict"]
    return max_tokens, options


# --- the answer --------------------------------------------------------------------------------
def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
    """The response's output items, built from a `Reply`'s deltas: `add(delta)` and
    `close(status)` return the stream events they make (without sequence numbers)."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.items: list[dict] = []
        self.open: dict | None = None  # the item being written
        self.call_items: dict[int, dict] = {}  # the reply's call index -> its item

    def add(self, delta: Delta) -> list[dict]:
        events = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for event in delta.calls:
            if event[0] == "start":
                events += self._start_call(event[1])
            elif event[1] in self.call_items:
                item = self.call_items[event[1]]
                item["arguments"] += event[2]
                events.append(self._at(item, "response.function_call_arguments.delta", delta=event[2]))
        return events

    def close(self, status: str) -> list[dict]:
        """End the open item (and every item then): `status` is completed or incomplete."""
        events = [] if self.items else self._text("message", "")
        events += self._end(status)
        return events

    def _at(self, item: dict, kind: str, **fields) -> dict:
        where = {"item_id": item["id"], "output_index": self.items.index(item)}
        if item["type"] != "function_call":
            where["content_index"] = 0
        return {"type": kind, **where, **fields}

    def _begin(self, item: dict) -> list[dict]:
        events = self._end("completed")
        self.items.append(item)
        self.open = item
        added = copy.deepcopy(item)  # as it is now: the item grows after
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": added})
        return events

    def _text(self, kind: str, text: str) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != kind:
            if kind == "message":
                item = {"id": _id("msg"), "type": "message", "role": "assistant"}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": _id("rs"), "type": "reasoning", "summary": []}
                part = {"type": "reasoning_text", "text": ""}
            events += self._begin({**item, "status": "in_progress", "content": []})
            self.open["content"].append(part)
            events.append(self._at(self.open, "response.content_part.added", part=dict(part)))
        if text:
            self.open["content"][0]["text"] += text
            name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
            extra = {"logprobs": []} if kind == "message" else {}
            events.append(self._at(self.open, name, delta=text, **extra))
        return events

    def _start_call(self, k: int) -> list[dict]:
        call = self.reply.calls[k]
        item = {
            "id": "fc_" + call.id.removeprefix("call_"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        self.call_items[k] = item
        return self._begin(item)

    def _end(self, status: str) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        if item["type"] == "function_call":
            events = [self._at(item, "response.function_call_arguments.done", arguments=item["arguments"])]
        else:
            part = item["content"][0]
            done = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra = {"logprobs": []} if item["type"] == "message" else {}
            events = [
                self._at(item, done, text=part["text"], **extra),
                self._at(item, "response.content_part.done", part=dict(part)),
            ]
        events.append({"type": "response.output_item.done", "output_index": self.items.index(item), "item": item})
        return events


def _usage(stats, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": stats.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def _reasoning_tokens(reply: Reply, tokenizer) -> int:
    """Tokens of the reply's reasoning (told apart from the answer's by tokenizing it again)."""
    return len(tokenizer.encode(reply.reasoning, add_bos=False)) if reply.reasoning else 0


class Answer:
    """One response as it is made: its fields, its `Output`, and its end (status, usage)."""

    def __init__(self, req: ResponsesRequest, model_id: str, reply: Reply, options: dict):
        self.req, self.model_id, self.options = req, model_id, options
        self.id, self.created = _id("resp"), int(time.time())
        self.output = Output(reply)
        self.status, self.usage, self.completed_at = "in_progress", None, None

    def end(self, stats, tokenizer) -> list[dict]:
        """The events that end the output, once the job is DONE."""
        self.status = "incomplete" if stats.finish_reason == "length" else "completed"
        events = self.output.close(self.status)
        self.usage = _usage(stats, _reasoning_tokens(self.output.reply, tokenizer))
        self.completed_at = int(time.time()) if self.status == "completed" else None
        return events

    def body(self) -> dict:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": self.completed_at,
            "status": self.status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model_id,
            "output": self.output.items if self.status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": _effort(req.reasoning), "summary": None},
            "store": req.store,
            "temperature": self.options["temperature"],
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "top_p": self.options["top_p"],
            "truncation": "disabled",
            "usage": self.usage,
            "metadata": req.metadata or {},
            "user": None,
        }


# --- stored responses ------------------------------------------------------------------------------
class Store:
    """The latest `KEPT` stored responses, each with its conversation (the messages its
    input made, then its output as an assistant's), for GET and `previous_response_id`."""

    def __init__(self, kept: int = KEPT):
        self.kept = kept
        self.entries: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, body: dict, messages: list[dict]) -> None:
        conversation = input_messages(body["output"], messages)
        self.entries[body["id"]] = (body, conversation)
        while len(self.entries) > self.kept:
            self.entries.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]]:
        """A stored response and its conversation; a 404 when it is not (or no longer) kept."""
        if rid not in self.entries:
            raise ApiError(
                404,
                f"response {rid!r} not found (this server keeps the latest {self.kept} in memory)",
                "not_found_error",
                code="response_not_found",
            )
        self.entries.move_to_end(rid)
        return self.entries[rid]


def _store(request: Request) -> Store:
    state = request.app.state
    if not hasattr(state, "responses"):
        state.responses = Store()
    return state.responses


def _history(request: Request, req) -> list[dict]:
    """The conversation a request continues (its previous response's), or none."""
    if not req.previous_response_id:
        return []
    store = _store(request)
    if req.previous_response_id not in store.entries:
        raise ApiError(
            400,
            f"previous response {req.previous_response_id!r} not found "
            f"(this server keeps the latest {store.kept} in memory)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return store.get(req.previous_response_id)[1]


# --- the routes ---------------------------------------------------------------------------------
def _sse(event: dict, seq: int) -> str:
    return f"event: {event['type']}\ndata: {dumps({**event, 'sequence_number': seq})}\n\n"


@router.post(
    "/responses",
    summary="A response (OpenAI's Responses API), streamed as typed SSE events or one JSON",
    openapi_extra=request_body(ResponsesRequest),
)
async def create_response(request: Request):
    req = await parse_body(request, ResponsesRequest)
    served = request.app.state.tk.pick(req.model).served
    conversation = input_messages(req.input, _history(request, req))
    max_tokens, options = _sampling(req, served)
    chat = chat_request(req, conversation, served.system, Budget(max_tokens), options)
    group = await start_choices(request, chat, 1)
    prep = group.jobs[0].prepared
    answer = Answer(req, served.id, new_reply(prep.tool_names, prep.template, prep.text, prep.split), options)
    reply, output = answer.output.reply, answer.output

    def keep() -> None:
        if req.store:
            _store(request).put(answer.body(), conversation)

    if not req.stream:
        ((text, stats, _),) = await collect_all(request, group)
        output.add(reply.feed(text))
        output.add(reply.finish())
        answer.end(stats, prep.tokenizer)
        keep()
        return JSONResponse(answer.body())

    async def sse():
        seq = 0
        for kind in ("response.created", "response.in_progress"):
            yield _sse({"type": kind, "response": answer.body()}, seq)
            seq += 1
        async for _, kind, value in group.events():
            if kind == PIECE:
                events = output.add(reply.feed(value))
            elif kind == DONE:
                events = output.add(reply.finish()) + answer.end(value, prep.tokenizer)
                keep()
                last = "response.completed" if answer.status == "completed" else "response.incomplete"
                events.append({"type": last, "response": answer.body()})
            elif kind == ERROR:
                err = as_api_error(value)
                events = [{"type": "error", "code": err.code or err.type, "message": err.message, "param": err.param}]
            else:
                events = []
            for event in events:
                yield _sse(event, seq)
                seq += 1

    return JobStream(group, sse(), "text/event-stream")


@router.post(
    "/responses/input_tokens",
    summary="How many tokens a response's input makes, as the model would read it",
    openapi_extra=request_body(InputTokensRequest),
)
async def input_tokens(request: Request):
    req = await parse_body(request, InputTokensRequest)
    target = request.app.state.tk.pick(req.model)
    conversation = input_messages(req.input if req.input is not None else [], _history(request, req))
    prepared = await prepare_only(target.scheduler, chat_request(req, conversation, target.served.system))
    return {"object": "response.input_tokens", "input_tokens": len(prepared.ids)}


@router.get("/responses/{response_id}", summary="A stored response")
async def get_response(response_id: str, request: Request):
    return _store(request).get(response_id)[0]


@router.delete("/responses/{response_id}", summary="Forget a stored response")
async def delete_response(response_id: str, request: Request):
    store = _store(request)
    store.get(response_id)
    del store.entries[response_id]
    return {"id": response_id, "object": "response.deleted", "deleted": True}
