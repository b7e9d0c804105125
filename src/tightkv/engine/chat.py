"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered with jinja2,
as transformers' ``apply_chat_template`` renders them (same environment options,
``raise_exception``, ``strftime_now``, ``tojson`` with its options, loop controls,
the ``{% generation %}`` tag, ``tools``/``documents`` defined as none)."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from ..errors import TightKVError


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError, nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant
        text for training masks with it): renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise TightKVError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except TemplateError as err:
        raise TightKVError(f"chat template does not parse: {err}") from None


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: plain json.dumps (jinja's own escapes HTML characters)."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_chat(
    template: str,
    messages: list[dict],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    **extra,
) -> str:
    """The prompt text for messages [{role, content}, ...] under a jinja chat template.

    extra: further template variables, e.g. ``tools=[...]``, ``enable_thinking=False``
    (Qwen3), ``date_string=...`` (Llama 3.x); ``tools`` and ``documents`` are none
    unless given, as in transformers. A message that calls tools may leave its content
    out, as OpenAI's API allows (gpt-oss's and Gemma 4's templates expect that)."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or ("content" not in m and not m.get("tool_calls")):
            raise TightKVError("each message needs a 'role' and a 'content' (or 'tool_calls')")
    extra = {"tools": None, "documents": None, **extra}
    try:
        return _compile(template).render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
    except TightKVError:
        raise
    except Exception as err:
        raise TightKVError(f"chat template failed: {err}") from None


def render_continuation(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "", **extra) -> str:
    """The prompt that continues the last message, an assistant's, instead of opening a new
    turn (llama.cpp's server does it so): the conversation before it with the generation
    prompt, then its content as written, with no end of turn. A conversation of that one
    message (which many templates cannot render without it) is cut after its content, as
    vLLM's continue_final_message does. A harmony template (gpt-oss) gets the message's
    reasoning and the final channel's open header after the generation prompt
    (`harmony.continued_message`)."""
    from .harmony import continued_message, is_harmony

    if is_harmony(template):
        if len(messages) > 1:
            head = render_chat(template, messages[:-1], bos_token, eos_token, add_generation_prompt=True, **extra)
        else:  # the template renders no conversation without a message: cut where the assistant's opens
            full = render_chat(template, messages, bos_token, eos_token, add_generation_prompt=False, **extra)
            opens = "<|start|>assistant"
            head = full[: full.index(opens) + len(opens)]
        return head + continued_message(messages[-1])
    content = messages[-1]["content"]
    if len(messages) > 1:
        return render_chat(template, messages[:-1], bos_token, eos_token, add_generation_prompt=True, **extra) + content
    full = render_chat(template, messages, bos_token, eos_token, add_generation_prompt=False, **extra)
    end = full.rfind(content) if content else -1
    if end < 0:
        raise TightKVError("cannot continue the assistant's message: the chat template does not write it as given")
    return full[: end + len(content)]


def continues(messages: list[dict], continue_final: bool | None = None) -> bool:
    """Whether a prompt continues the last message: by default when it is an assistant's
    text (one that calls tools is answered, as its calls are rendered whole); asked for on
    any other, it is an error."""
    last = messages[-1] if messages else {}
    if continue_final and last.get("role") != "assistant":
        raise TightKVError("continuing the final message needs an assistant message last")
    if continue_final is None:
        return last.get("role") == "assistant" and not last.get("tool_calls")
    return continue_final


PLAIN_CHAT_STOPS = ["\nUser:"]  # where a model without a template would write the next user turn
# A base model (no chat template) left greedy loops on one sentence: where a user talks to one
# (`tightkv run`, the REPL, `Model.ask`) it gets llama-cli's old default repeat penalty, 1.1
# over the last 64 tokens (llama.cpp#6127 made it 1.0 in 2024; Ollama's 1.1 went in 2026), and a
# chat model stays unpenalised, its greedy reply llama.cpp's token for token.
BASE_REPEAT_PENALTY = 1.1


def plain_prompt(messages: list[dict], continue_final: bool = False, add_generation_prompt: bool = True) -> str:
    """A model without a template (a base model) sees the conversation as plain text; a
    continued last message ends the text as written."""
    text = "\n".join(f"{m['role'].capitalize()}: {m.get('content') or ''}" for m in messages)
    if continue_final:
        return text if messages[-1]["content"] else text.rstrip()
    return text + "\nAssistant:" if add_generation_prompt else text
