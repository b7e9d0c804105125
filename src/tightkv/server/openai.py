"""OpenAI routes as llama.cpp's server and vLLM implement them:
/v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .http import (
    ApiError,
    JobGroup,
    JobStream,
    as_api_error,
    collect_all,
    dumps,
    finite,
    parse_body,
    request_body,
    start_choices,
    stop_list,
)
from ..engine.requests import Budget, ChatRequest, TextRequest
from ..engine.sampling import SamplingParams
from .outputs import chat_logprobs, completion_logprobs, constraint_options
from .replies import new_reply, openai_call_delta
from ..modelfile import sampling_defaults, with_system
from .scheduler import DONE, ERROR, LOGPROB, PIECE
from .schemas import OPENAI_MAX_STOPS, OPENAI_RANGES, ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1", tags=["OpenAI"])


def check_ranges(values: dict, ranges: dict | None = None) -> None:
    """OpenAI's documented ranges (`schemas.OPENAI_RANGES`, with `ranges` over them) on a
    request's values, name -> number (None: not given), and "stop" -> its string or strings
    (at most `OPENAI_MAX_STOPS`); one outside is a 400 as OpenAI words it: "Invalid
    'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead."
    Every OpenAI-shaped route calls it (chat, completions, responses)."""
    bounds = {**OPENAI_RANGES, **(ranges or {})}
    for name, value in values.items():
        if name == "stop":
            _check_stops(value)
        elif value is not None:
            _check_range(name, value, *bounds[name])


def _check_range(name: str, value: float, least: float | None, most: float | None) -> None:
    kind = "decimal" if isinstance(value, float) else "integer"
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if least is not None and value < least:
        raise ApiError(
            400,
            f"Invalid '{name}': {kind} below minimum value. Expected a value >= {least}, but got {shown} instead.",
            param=name,
            code=f"{kind}_below_min_value",
        )
    if most is not None and value > most:
        raise ApiError(
            400,
            f"Invalid '{name}': {kind} above maximum value. Expected a value <= {most}, but got {shown} instead.",
            param=name,
            code=f"{kind}_above_max_value",
        )


def _check_stops(stop) -> None:
    if isinstance(stop, list) and len(stop) > OPENAI_MAX_STOPS:
        raise ApiError(
            400,
            f"Invalid 'stop': array too long. Expected an array with maximum length {OPENAI_MAX_STOPS}, "
            f"but got an array with length {len(stop)} instead.",
            param="stop",
            code="array_above_max_length",
        )


def _options(req, served=None) -> tuple[int | None, dict]:
    """max_tokens and `Model.generate` options from an OpenAI request, in OpenAI's ranges (a
    completion's max_tokens may be 0, with echo), the model's Modelfile PARAMETERs where the
    request gives none; unsupported fields are a 400."""
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
        finite(getattr(req, name), name)
    ranged = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "n", "max_tokens")
    check_ranges(
        {name: getattr(req, name) for name in (*ranged, "max_completion_tokens", "stop")},
        {"max_tokens": (0, None)} if isinstance(req, CompletionRequest) else None,
    )
    seed = req.seed
    options = {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": req.top_k or 0,
        "min_p": req.min_p or 0.0,
        "repeat_penalty": 1.0 if req.repeat_penalty is None else req.repeat_penalty,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "presence_penalty": req.presence_penalty or 0.0,
        "repeat_last_n": SamplingParams.repeat_last_n if req.repeat_last_n is None else req.repeat_last_n,
        "logit_bias": _logit_bias(req.logit_bias),
        "seed": None if seed is None or seed < 0 else seed % 2**64,
        "stop": stop_list(req.stop),
        **constraint_options(req.response_format, req.json_schema, req.grammar),
        **_speculation(req),
    }
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = served.parameters if served is not None else {}
    options.update({k: v for k, v in sampling_defaults(params).items() if getattr(req, k, None) is None})
    if max_tokens is None and params.get("num_predict", -1) >= 0:
        max_tokens = params["num_predict"]
    return max_tokens, options


def _speculation(req) -> dict:
    """Speculative decoding's options from llama-server's request fields (`speculative.type`,
    `speculative.n_max`, `speculative.n_min`), where given: checked on the worker
    (`engine.requests.check_speculation`) against the server's own. `speculative.p_min` is
    refused, not ignored: a draft model's cut-off is fixed (`engine.speculative.DRAFT_P_MIN`)."""
    if (req.model_extra or {}).get("speculative.p_min") is not None:
        raise ApiError(
            400, "'speculative.p_min' is not supported: a draft model stops below 0.75", param="speculative.p_min"
        )
    given = {
        "spec_type": req.speculative_type,
        "draft_max": req.speculative_n_max,
        "draft_min": req.speculative_n_min,
    }
    return {k: v for k, v in given.items() if v is not None}


def _timings(stats: list, n: int) -> dict:
    """llama-server's `timings` of a request's choices, `n` per prompt (each prompt once):
    prompt and predicted tokens, milliseconds and speeds, and where speculation drafted,
    `draft_n` and `draft_n_accepted`."""
    prompts = stats[::n]
    prompt_n = sum(s.prompt_tokens - s.cached_tokens for s in prompts)
    prompt_ms = 1000 * sum(s.prompt_seconds for s in prompts)
    predicted_n = sum(s.generated_tokens for s in stats)
    predicted_ms = 1000 * max((s.generation_seconds for s in stats), default=0.0)
    out = {
        "cache_n": sum(s.cached_tokens for s in prompts),
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(1000 * prompt_n / prompt_ms, 2) if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(1000 * predicted_n / predicted_ms, 2) if predicted_ms else 0.0,
    }
    drafted = sum(s.draft_n for s in stats)
    if drafted:
        out.update(draft_n=drafted, draft_n_accepted=sum(s.draft_n_accepted for s in stats))
    return out


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias ({"token id": bias from -100 to 100}) with int keys."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise ApiError(400, f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias")
        if not -100 <= value <= 100:
            raise ApiError(400, f"'logit_bias' values must be between -100 and 100, got {value}", param="logit_bias")
        out[int(key)] = value
    return out


def _tools(req) -> list[dict] | None:
    """The request's function tools, checked; None when there are none or tool_choice is "none".
    A call forced (tool_choice required, or a function named) with no tools is a 400, as OpenAI has it."""
    if not req.tools and req.tool_choice not in (None, "none", "auto"):
        raise ApiError(
            400,
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    if not req.tools or req.tool_choice == "none":
        return None
    for i, t in enumerate(req.tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(
                400, f"'tools.{i}' must be {{type: function, function: {{name, parameters}}}}", param=f"tools.{i}"
            )
        if not isinstance(fn.get("parameters", {}), dict):
            raise ApiError(
                400,
                f"'tools.{i}.function.parameters' must be a JSON schema object",
                param=f"tools.{i}.function.parameters",
            )
    return req.tools


def _forced_call(choice) -> str | None:
    """None: the model chooses (auto); "": it must call some tool (required); else the name it must call."""
    if choice in (None, "auto"):
        return None
    if choice == "required":
        return ""
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice["function"].get("name"):
        return choice["function"]["name"]
    raise ApiError(
        400, "'tool_choice' must be none, auto, required or {type: function, function: {name}}", param="tool_choice"
    )


RESERVED_TEMPLATE_VARS = {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}


def _template_vars(req) -> dict:
    """chat_template_kwargs, checked; `reasoning_effort: "none"` asks a thinking model not to think."""
    extra = dict(req.chat_template_kwargs or {})
    taken = sorted(RESERVED_TEMPLATE_VARS & set(extra))
    if taken:
        raise ApiError(400, f"'chat_template_kwargs' may not set {', '.join(taken)}", param="chat_template_kwargs")
    if req.reasoning_effort == "none":
        extra.setdefault("enable_thinking", False)
    return extra


def _prompt_options(req) -> dict:
    """How the prompt ends: vLLM's continue_final_message and add_generation_prompt."""
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(
            400,
            "'continue_final_message' and 'add_generation_prompt' cannot both be true",
            param="continue_final_message",
        )
    if req.continue_final_message and req.messages[-1].role != "assistant":
        raise ApiError(400, "'continue_final_message' needs an assistant message last", param="continue_final_message")
    return {
        "continue_final": req.continue_final_message,
        "add_generation_prompt": req.add_generation_prompt is not False,
    }


def _choices(req, picked) -> int:
    """`n`, at most the server's slots (the choices decode side by side)."""
    n, slots = req.n or 1, picked.scheduler.parallel
    if n > slots:
        raise ApiError(400, f"'n' must be at most {slots}, this server's --parallel", param="n")
    return n


def _usage(stats: list, n: int) -> dict:
    """Usage of a request's choices, `n` per prompt (prompt-major): each prompt once, every
    completion."""
    prompts = stats[::n]
    prompt, done = sum(s.prompt_tokens for s in prompts), sum(s.generated_tokens for s in stats)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": done,
        "total_tokens": prompt + done,
        "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in prompts)},
    }


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


@router.post(
    "/chat/completions",
    summary="Chat completion, streamed as SSE or one JSON",
    openapi_extra=request_body(ChatCompletionRequest),
)
async def chat_completions(request: Request):
    req = await parse_body(request, ChatCompletionRequest)
    picked = request.app.state.tk.pick(req.model)
    if not req.messages:
        raise ApiError(400, "'messages' must not be empty", param="messages")
    for i, m in enumerate(req.messages):
        if m.content is None and m.role != "assistant":
            raise ApiError(400, f"'messages.{i}.content' is required", param=f"messages.{i}.content")
        for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
            where = f"messages.{i}.content.{j}"
            if part.type != "text":
                raise ApiError(
                    400, f"'{where}': {part.type!r} parts are not supported: the model reads text only", param=where
                )
            if part.text is None:
                raise ApiError(400, f"'{where}.text' is required", param=f"{where}.text")
    check_ranges({"top_logprobs": req.top_logprobs})
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    for name in ("functions", "function_call"):  # OpenAI's deprecated form of tools: refused, not ignored
        if getattr(req, name, None) not in (None, [], "none", "auto"):
            raise ApiError(400, f"'{name}' is deprecated and not supported: send 'tools' and 'tool_choice'", param=name)
    max_tokens, options = _options(req, picked.served)
    if req.logprobs:
        options["logprobs"] = req.top_logprobs or 0
    messages = [
        {
            **m.model_dump(exclude_none=True),
            "role": "system" if m.role == "developer" else m.role,
            "content": _text(m.content),
        }
        for m in req.messages
    ]
    messages = with_system(messages, picked.served.system)
    tools = _tools(req)
    template_vars = _template_vars(req)
    think = template_vars.get("enable_thinking")
    job_request = ChatRequest(
        messages,
        Budget(max_tokens),
        options,
        tools=tools,
        forced_call=_forced_call(req.tool_choice) if tools else None,
        parallel_calls=req.parallel_tool_calls is not False,
        think=None if think is None else bool(think),
        effort=req.reasoning_effort,
        template_vars=template_vars,
        prompt_options=_prompt_options(req),
        split_reasoning=req.reasoning_format != "none",
    )
    n = _choices(req, picked)
    group = await start_choices(request, job_request, n)
    prep = group.jobs[0].prepared
    tokenizer = prep.tokenizer
    cid, created, model_id = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), picked.served.id

    def reply():
        return new_reply(prep.tool_names, prep.template, prep.text, prep.split)

    if not req.stream:
        choices, all_stats = [], []
        for i, (text, stats, lps) in enumerate(await collect_all(request, group)):
            answer = reply().whole(text)
            choices.append(
                {
                    "index": i,
                    "message": answer.openai_message(),
                    "logprobs": chat_logprobs(tokenizer, lps) if req.logprobs else None,
                    "finish_reason": answer.finish_reason(stats.finish_reason),
                }
            )
            all_stats.append(stats)
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model_id,
                "choices": choices,
                "usage": _usage(all_stats, n),
                "timings": _timings(all_stats, n),
            }
        )
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_id}

    def chunk(i: int, delta: dict, finish: str | None = None, lps: list | None = None, **extra) -> str:
        logprobs = chat_logprobs(tokenizer, lps) if lps else None
        body = {**head, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return f"data: {dumps({**body, **extra})}\n\n"

    def deltas(answer, d) -> list[dict]:
        """The chunks' deltas of what a piece added: reasoning, content, then call deltas."""
        out = [{"reasoning_content": d.reasoning}] if d.reasoning else []
        out += [{"content": d.content}] if d.content else []
        return out + [{"tool_calls": [openai_call_delta(answer, e)]} for e in d.calls]

    async def sse():
        for i in range(n):
            yield chunk(i, {"role": "assistant", "content": ""})
        # per choice: its reply, and the logprobs of tokens whose text is not out yet
        answers, held, finals = [reply() for _ in range(n)], [[] for _ in range(n)], []
        async for i, kind, value in group.events():
            if kind == LOGPROB:
                held[i].append(value)
            elif kind in (PIECE, DONE):
                for delta in deltas(answers[i], answers[i].feed(value) if kind == PIECE else answers[i].finish()):
                    yield chunk(i, delta, lps=held[i])
                    held[i] = []
            if kind == DONE:
                if held[i]:
                    yield chunk(i, {"content": ""}, lps=held[i])
                finals.append(value)
                last = {"timings": _timings(finals, n)} if len(finals) == n else {}  # llama-server's, on the last
                yield chunk(i, {}, answers[i].finish_reason(value.finish_reason), **last)
                if include_usage and len(finals) == n:
                    yield f"data: {dumps({**head, 'choices': [], 'usage': _usage(finals, n)})}\n\n"
            elif kind == ERROR:
                yield f"data: {dumps(as_api_error(value).body(request.url.path))}\n\n"
        yield "data: [DONE]\n\n"

    return JobStream(group, sse(), "text/event-stream")


@router.post(
    "/completions",
    summary="Text completion (no chat template), streamed as SSE or one JSON",
    openapi_extra=request_body(CompletionRequest),
)
async def completions(request: Request):
    req = await parse_body(request, CompletionRequest)
    picked = request.app.state.tk.pick(req.model)
    for name, unsupported in (("suffix", req.suffix), ("best_of", req.best_of not in (None, 1))):
        if unsupported:
            raise ApiError(400, f"'{name}' is not supported", param=name)
    prompts = _prompt_list(req.prompt)
    if req.max_tokens == 0 and not req.echo:
        raise ApiError(400, "'max_tokens' must be at least 1 (0 only with 'echo')", param="max_tokens")
    max_tokens, options = _options(req, picked.served)
    check_ranges({"logprobs": req.logprobs})
    want_lp = req.logprobs is not None
    if want_lp:
        options["logprobs"] = req.logprobs
    n = _choices(req, picked)
    most = picked.scheduler.parallel + picked.scheduler.max_queue
    if len(prompts) * n > most:
        raise ApiError(
            400,
            f"{len(prompts)} prompts x {n} choices: this server takes at most {most} in one request "
            "(--parallel plus --max-queue)",
            param="prompt",
        )
    group = JobGroup([])
    try:
        for p, prompt in enumerate(prompts):  # choice k = p * n + j is choice j of prompt p, as OpenAI numbers them
            where = f"prompt.{p}" if len(prompts) > 1 else "prompt"
            echo_top = (req.logprobs or 0) if req.echo and want_lp else None
            job_request = TextRequest(prompt, Budget(max_tokens), options, where=where, echo_top=echo_top)
            group.jobs += (await start_choices(request, job_request, n)).jobs
    except BaseException:
        group.cancel()
        raise
    echoed = [group.jobs[p * n].prepared for p in range(len(prompts))]  # per prompt: its ids and echo logprobs
    tokenizer = echoed[0].tokenizer
    cid, created, model_id = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), picked.served.id
    head = {"id": cid, "object": "text_completion", "created": created, "model": model_id}
    echo_text = [""] * len(prompts)
    if req.echo:
        echo_text = [x if isinstance(x, str) else tokenizer.decode(e.ids) for x, e in zip(prompts, echoed)]

    def logprobs(k: int, lps: list, offset: int, with_prompt: bool = False) -> dict | None:
        if not want_lp:
            return None
        e = echoed[k // n]
        pairs = list(zip(e.prompt_logprobs, e.ids)) if with_prompt else []
        return completion_logprobs(tokenizer, pairs + [(t, t.token) for t in lps], offset)

    if not req.stream:
        results = await collect_all(request, group)
        choices = [
            {
                "index": k,
                "text": echo_text[k // n] + text,
                "logprobs": logprobs(k, lps, 0, req.echo),
                "finish_reason": stats.finish_reason,
            }
            for k, (text, stats, lps) in enumerate(results)
        ]
        stats = [r[1] for r in results]
        return JSONResponse({**head, "choices": choices, "usage": _usage(stats, n), "timings": _timings(stats, n)})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(k: int, text: str, finish: str | None = None, lp: dict | None = None, **extra) -> str:
        body = {**head, "choices": [{"index": k, "text": text, "logprobs": lp, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return f"data: {dumps({**body, **extra})}\n\n"

    async def sse():
        jobs = len(group.jobs)
        offset, held, finals = [len(echo_text[k // n]) for k in range(jobs)], [[] for _ in range(jobs)], [None] * jobs
        for k in range(jobs if req.echo else 0):
            yield chunk(k, echo_text[k // n], lp=logprobs(k, [], 0, True))
        async for k, kind, value in group.events():
            if kind == LOGPROB:
                held[k].append(value)
            elif kind == PIECE:
                yield chunk(k, value, lp=logprobs(k, held[k], offset[k]))
                offset[k] += len(value)
                held[k] = []
            elif kind == DONE:
                if held[k]:
                    yield chunk(k, "", lp=logprobs(k, held[k], offset[k]))
                finals[k] = value
                done = all(f is not None for f in finals)
                yield chunk(k, "", value.finish_reason, **({"timings": _timings(finals, n)} if done else {}))
                if include_usage and done:
                    yield f"data: {dumps({**head, 'choices': [], 'usage': _usage(finals, n)})}\n\n"
            elif kind == ERROR:
                yield f"data: {dumps(as_api_error(value).body(request.url.path))}\n\n"
        yield "data: [DONE]\n\n"

    return JobStream(group, sse(), "text/event-stream")


def _prompt_list(prompt) -> list:
    """The prompts of a completion request: text or token ids, one or a list of them."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise ApiError(400, "'prompt' must not be empty", param="prompt")
    return list(prompt)


def _model_card(served) -> dict:
    return {"id": served.id, "object": "model", "created": served.created, "owned_by": "tightkv"}


@router.get("/models", summary="The models this server serves (every model of the store, or the one pinned)")
async def models(request: Request):
    return {"object": "list", "data": [_model_card(served) for served in request.app.state.tk.store_models()]}


@router.get("/models/{model_id:path}", summary="One model by id")
async def model(model_id: str, request: Request):
    return _model_card(request.app.state.tk.pick(model_id).served)
