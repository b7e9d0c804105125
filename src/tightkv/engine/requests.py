"""Requests, protocol-neutral: what a face asks of the model, and the prepared job the
batch runs (`engine.batch`).

The OpenAI and Ollama routes each translate their JSON into a `ChatRequest` (a
conversation) or a `TextRequest` (a plain prompt, text or ids); `prepare(model, request)`
turns it into a `Prepared` job on the worker thread, which owns the model: the prompt
rendered through the chat template (tools, reasoning, a forced tool call's grammar), its
token ids, the stop strings, the reply budget and the constraint compiled, every check a
bad request fails. A route reads what it needs to answer (the prompt text, whether the
reasoning is split off, the tool names, the echoed prompt) from the `Prepared` job once
the worker has accepted it: nothing else passes between the threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ContextOverflowError, RequestError, TightKVError
from . import harmony
from .reasoning import thinking_plan, thinks
from .tools import call_grammar, template_messages, tool_format


@dataclass
class Budget:
    """How long a reply may be. `max_tokens` None: to the end of the context. `num_ctx`
    (Ollama's `options.num_ctx`): the reply also stops where a context of that size ends,
    when it is below the model's; `fit` (Ollama) ends the reply at the context's end, where
    OpenAI's routes refuse a prompt whose `max_tokens` does not fit (`check_context`)."""

    max_tokens: int | None = None
    num_ctx: int | None = None
    fit: bool = False

    def tokens(self, model, ids: list[int]) -> int | None:
        if not self.fit:
            return self.max_tokens
        n = self.num_ctx
        ctx = min(n, model.context_length) if n and n > 0 else model.context_length
        room = ctx - len(ids)
        if room <= 0:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens does not fit the context of {ctx} tokens", len(ids), ctx
            )
        return room if self.max_tokens is None else min(self.max_tokens, room)


@dataclass
class ChatRequest:
    """A conversation to answer.

    `options`: `Model.generate`'s options (sampling, stop, json_schema or grammar,
    logprobs). `tools`: OpenAI function specs; `forced_call`: None lets the model choose,
    "" forces some call, a name forces that function (`parallel_calls`: one or more).
    `think`: the request's wish to reason (None: the model's default); `effort`: how hard
    (OpenAI's reasoning_effort, Ollama's think level: the template's `reasoning_effort`,
    which harmony's template reads; None: its default). `template_vars`:
    more chat-template variables; `prompt_options`: `PromptBuilder.chat_text`'s
    continue_final and add_generation_prompt. `split_reasoning`: read the reasoning off
    the reply. `context`: token ids before the prompt (Ollama's `context`).
    `no_tools` / `no_thinking`: the protocol's error when the template takes no tools, or
    when `think` is asked of a model that does not think (None: not an error)."""

    messages: list[dict]
    budget: Budget = field(default_factory=Budget)
    options: dict = field(default_factory=dict)
    tools: list[dict] | None = None
    forced_call: str | None = None
    parallel_calls: bool = True
    think: bool | None = None
    effort: str | None = None
    template_vars: dict = field(default_factory=dict)
    prompt_options: dict = field(default_factory=dict)
    split_reasoning: bool = True
    context: list[int] = field(default_factory=list)
    no_tools: str = "this model's chat template does not take tools"
    no_thinking: str | None = None


@dataclass
class TextRequest:
    """A plain prompt to continue: text (tokenized with a BOS unless `context` comes before
    it) or token ids. `where` names the prompt in errors; `echo_top`: the prompt's own
    logprobs are wanted, with this many alternatives (an echo). `think`, `no_thinking`,
    `split_reasoning`: as a `ChatRequest` has them (Ollama's raw prompts)."""

    prompt: str | list[int]
    budget: Budget = field(default_factory=Budget)
    options: dict = field(default_factory=dict)
    context: list[int] = field(default_factory=list)
    where: str = "prompt"
    echo_top: int | None = None
    think: bool | None = None
    no_thinking: str | None = None
    split_reasoning: bool = False


@dataclass
class Prepared:
    """A request made ready on the worker: prompt ids and `Model.sequence` arguments, and
    what the face needs to read the reply (`text`: the prompt's text where a template made
    it; `template`, `split`: the reasoning split; `tool_names`; `prompt_logprobs`: an echo)."""

    ids: list[int]
    max_tokens: int | None
    options: dict = field(default_factory=dict)
    text: str | None = None
    template: str | None = None
    split: bool = False
    tool_names: set[str] = field(default_factory=set)
    tokenizer: Any = None
    prompt_logprobs: list | None = None


def seeded(request: ChatRequest | TextRequest, i: int) -> ChatRequest | TextRequest:
    """Choice i of a request: a seeded one draws with seed + i (the first with the seed
    itself); only the first echoes the prompt."""
    if not i:
        return request
    changes: dict = {}
    seed = request.options.get("seed")
    if seed is not None:
        changes["options"] = dict(request.options, seed=(seed + i) % 2**64)
    if getattr(request, "echo_top", None) is not None:
        changes["echo_top"] = None
    return replace(request, **changes) if changes else request


def prepare(model, request: ChatRequest | TextRequest) -> Prepared:
    """The job for a request (on the worker thread); a bad request raises here."""
    if isinstance(request, ChatRequest):
        return _prepare_chat(model, request)
    return _prepare_text(model, request)


def check_constraint(model, options: dict) -> None:
    """Compile a request's JSON schema or grammar (a bad one is the request's error)."""
    if "json_schema" in options or "grammar" in options:
        model.constraint(options.get("json_schema"), options.get("grammar"))


SPEC_KEYS = ("spec_type", "draft_max", "draft_min")  # what a request may set of speculation


def check_speculation(model, options: dict) -> dict:
    """`options` with a request's speculation (`spec_type`, `draft_max`, `draft_min`, where it
    sets any) completed from the model's own (`Model.speculate`: the server's flags) and
    checked: a request tunes or turns off speculation, and never names a draft model file
    ("draft" only where the server drafts with one). A bad value is the request's error."""
    asked = {k: options[k] for k in SPEC_KEYS if options.get(k) is not None}
    if not asked:
        return options
    own = model.spec_options()
    kind = asked.get("spec_type", own.spec_type)
    if kind == "draft" and not own.model_draft:
        raise RequestError("speculative.type 'draft' needs the server's draft model (-md)", param="speculative.type")
    spec = {
        "spec_type": kind,
        "model_draft": own.model_draft if kind == "draft" else None,
        "draft_max": asked.get("draft_max", own.draft_max),
        "draft_min": asked.get("draft_min", own.draft_min),
    }
    try:
        model.spec_options(**spec)
    except TightKVError as err:
        raise RequestError(str(err), param="speculative") from None
    return {**options, **spec}


def check_token_ids(model, ids: list[int], name: str) -> None:
    """A `RequestError` naming `name` unless every id is in the model's vocabulary."""
    vocab = model.tokenizer.vocab_size if ids else 0
    if any(not 0 <= t < vocab for t in ids):
        raise RequestError(f"'{name}' token ids must be in [0, {vocab})", param=name)


def _reasoning(model, r: ChatRequest | TextRequest, options: dict) -> tuple[dict, bool]:
    """(template variables, whether the reply's reasoning is split off) for the request's
    wish to think; `no_thinking` is the error when it asks a model that does not think. A
    harmony model always reasons (its analysis channel): think and effort set how hard."""
    template = model.chat_template
    if r.think and r.no_thinking and not thinks(template):
        raise RequestError(r.no_thinking, param="think")
    effort = getattr(r, "effort", None)
    if harmony.is_harmony(template):
        try:
            level = harmony.effort_level(effort, r.think)
        except ValueError:
            raise RequestError(
                f"'reasoning_effort' must be low, medium or high (or none, minimal, xhigh), not {effort!r}",
                param="reasoning_effort",
            ) from None
        explicit = "reasoning_effort" in getattr(r, "template_vars", {})  # chat_template_kwargs win
        return ({"reasoning_effort": level} if level and not explicit else {}), r.split_reasoning
    plan_vars, split = thinking_plan(template, r.think, "json_schema" in options or "grammar" in options)
    if effort and effort != "none" and "reasoning_effort" not in getattr(r, "template_vars", {}):
        # as llama.cpp's server passes it, to any template
        plan_vars["reasoning_effort"] = effort
    return plan_vars, split and r.split_reasoning


def _harmony_constraint(r: ChatRequest, opts: dict) -> None:
    """A harmony request's grammar: a forced call, or the JSON schema / grammar asked for,
    over the final message only (analysis stays free: the model reasons, then answers)."""
    if r.tools and r.forced_call is not None:
        opts.pop("json_schema", None)
        opts["grammar"] = harmony.call_grammar(r.tools, r.forced_call or None)
    elif "json_schema" in opts or "grammar" in opts:
        opts["grammar"] = harmony.final_grammar(opts.pop("json_schema", None), opts.pop("grammar", None))


def _prepare_chat(model, r: ChatRequest) -> Prepared:
    template = model.chat_template
    opts = dict(r.options, stop=model.chat_stops(r.options.get("stop")))
    fmt = tool_format(template) if r.tools else None
    if r.tools and fmt is None:
        raise RequestError(r.no_tools, param="tools")
    messages = template_messages(r.messages)
    if harmony.is_harmony(template):
        _harmony_constraint(r, opts)
        messages = harmony.harmony_messages(messages)
    elif r.tools and r.forced_call is not None:
        opts.pop("json_schema", None)
        opts["grammar"] = call_grammar(fmt, r.tools, r.forced_call or None, r.parallel_calls)
    check_constraint(model, opts)
    opts = check_speculation(model, opts)
    plan_vars, split = _reasoning(model, r, opts)
    check_token_ids(model, r.context, "context")
    text = model.chat_text(messages, r.tools, template_vars={**r.template_vars, **plan_vars}, **r.prompt_options)
    ids = model.chat_tokens(text)
    if r.context and ids and ids[0] == model.tokenizer.bos_id:
        ids = ids[1:]
    ids = r.context + ids
    names = {t.get("function", t).get("name") for t in r.tools or ()}
    return Prepared(
        ids,
        r.budget.tokens(model, ids),
        opts,
        text=text,
        template=template,
        split=split,
        tool_names=names,
        tokenizer=model.tokenizer,
    )


def _prepare_text(model, r: TextRequest) -> Prepared:
    check_constraint(model, r.options)
    options = check_speculation(model, r.options)
    _, split = _reasoning(model, r, options)
    check_token_ids(model, r.context, "context")
    if isinstance(r.prompt, str):
        ids = model.tokenize(r.prompt, add_bos=not r.context)
    else:
        check_token_ids(model, r.prompt, r.where)
        ids = list(r.prompt)
    ids = r.context + ids
    if not ids:
        raise RequestError(
            f"'{r.where}' is empty and the model adds no BOS token: nothing to predict from", param=r.where
        )
    echo = model.prompt_logprobs(ids, r.echo_top) if r.echo_top is not None else None
    text = r.prompt if isinstance(r.prompt, str) else None
    return Prepared(
        ids,
        r.budget.tokens(model, ids),
        dict(options),
        text=text,
        template=model.chat_template,
        split=split,
        tokenizer=model.tokenizer,
        prompt_logprobs=echo,
    )
