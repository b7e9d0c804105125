"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered with jinja2,
as transformers and llama.cpp's jinja mode do."""
from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from ..errors import TightKVError


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TightKVError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except TemplateError as err:
        raise TightKVError(f"chat template does not parse: {err}") from None


def _tojson(value, indent=None, **_):
    import json

    return json.dumps(value, indent=indent, ensure_ascii=False)


def render_chat(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, **extra) -> str:
    """The prompt text for messages [{role, content}, ...] under a jinja chat template."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise TightKVError("each message needs a 'role' and a 'content'")
    try:
        return _compile(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                         add_generation_prompt=add_generation_prompt, **extra)
    except TightKVError:
        raise
    except Exception as err:
        raise TightKVError(f"chat template failed: {err}") from None


def plain_prompt(messages: list[dict]) -> str:
    """A model without a template (a base model) sees the conversation as plain text."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"
