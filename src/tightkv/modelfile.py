"""Ollama's Modelfile: a named model's defaults over a GGUF.

    FROM ./qwen2.5-coder-0.5b-instruct-q4_k_m.gguf     # a .gguf path, or a model name
    PARAMETER num_ctx 2048
    PARAMETER kv_cache_type q8_0                        # ours: any --kv type (or auto)
    PARAMETER temperature 0.2
    PARAMETER stop "<|im_end|>"                         # repeatable
    SYSTEM \"\"\"You answer in one sentence.\"\"\"

Instructions are case-insensitive; `#` starts a comment line; a value may be quoted, or
span lines inside triple quotes. `tightkv create NAME -f Modelfile` and `POST /api/create`
read it into a `Modelfile`; the store keeps its parameters and system prompt in the
named model's manifest (`store.write_created`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import TightKVError

# Ollama's PARAMETER names we honour, with their types; `stop` may repeat (a list)
PARAMETERS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repeat_penalty": float,
    "repeat_last_n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "seed": int,
    "num_predict": int,
    "num_ctx": int,
    "stop": str,
    "kv_cache_type": str,
}
LOAD_PARAMETERS = ("num_ctx", "kv_cache_type")  # how the model loads; the rest are request defaults
INSTRUCTIONS = ("from", "parameter", "system", "template", "license", "adapter", "message", "requires")


@dataclass
class Modelfile:
    """A parsed Modelfile: its FROM, typed PARAMETERs, SYSTEM and TEMPLATE."""

    base: str
    parameters: dict = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    license: str | None = None

    def text(self) -> str:
        """The Modelfile again, as `tightkv show --modelfile` prints it."""
        lines = [f"FROM {self.base}"]
        for name, value in self.parameters.items():
            for one in value if isinstance(value, list) else [value]:
                lines.append(f"PARAMETER {name} {_quoted(one) if isinstance(one, str) else one}")
        if self.template:
            lines.append(f'TEMPLATE """{self.template}"""')
        if self.system:
            lines.append(f'SYSTEM """{self.system}"""')
        if self.license:
            lines.append(f'LICENSE """{self.license}"""')
        return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return text if text and not re.search(r'\s|"', text) else '"' + text.replace('"', '\\"') + '"'


def parse(text: str) -> Modelfile:
    """A Modelfile's text -> `Modelfile`; a bad line is a `TightKVError` naming it."""
    base, params, texts = None, {}, {}
    for number, command, args in _commands(text):
        where = f"Modelfile line {number}"
        if command == "from":
            base = args
        elif command == "parameter":
            name, _, value = args.partition(" ")
            add_parameter(params, name.strip().lower(), _unquote(value.strip()), where)
        elif command in ("system", "template", "license"):
            texts[command] = args
        elif command == "requires":
            continue  # a minimum Ollama version: nothing to check here
        else:
            raise TightKVError(f"{where}: {command.upper()} is not supported by tightkv (FROM, PARAMETER, SYSTEM)")
    if not base:
        raise TightKVError("the Modelfile has no FROM line (FROM a .gguf path or a model name)")
    return Modelfile(base, params, texts.get("system"), texts.get("template"), texts.get("license"))


def add_parameter(params: dict, name: str, value, where: str = "parameter") -> None:
    """Check one PARAMETER (a string from a Modelfile, or a JSON value from /api/create)
    and put it into `params`; `stop` accumulates."""
    kind = PARAMETERS.get(name)
    if kind is None:
        raise TightKVError(f"{where}: unknown parameter '{name}' (known: {', '.join(PARAMETERS)})")
    values = value if isinstance(value, list) and name == "stop" else [value]
    for one in values:
        typed = _typed(name, kind, one, where)
        if name == "stop":
            params.setdefault("stop", []).append(typed)
        else:
            params[name] = typed


def _typed(name: str, kind: type, value, where: str):
    if isinstance(value, bool) or (kind is str and not isinstance(value, str)):
        raise TightKVError(f"{where}: '{name}' takes a {kind.__name__}, got {value!r}")
    try:
        typed = kind(value) if not (kind is int and isinstance(value, float) and not value.is_integer()) else None
    except (TypeError, ValueError):
        typed = None
    if typed is None:
        raise TightKVError(f"{where}: '{name}' takes {'an integer' if kind is int else 'a number'}, got {value!r}")
    if name == "num_ctx" and typed < 1:
        raise TightKVError(f"{where}: num_ctx must be positive, got {typed}")
    if name == "kv_cache_type":
        from .kv.spec import check_kv

        return check_kv(typed, f"{where}: kv_cache_type")
    return typed


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"')
    return value


def _commands(text: str):
    """(line number, instruction, argument) of each instruction, triple-quoted values joined."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        command, _, args = line.partition(" ")
        command = command.lower()
        if command not in INSTRUCTIONS:
            raise TightKVError(f"Modelfile line {number}: unknown instruction '{command.upper()}'")
        args = args.strip()
        if args.startswith('"""'):
            body = args[3:]
            while '"""' not in body and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            if '"""' not in body:
                raise TightKVError(f'Modelfile line {number}: unterminated """')
            args = body[: body.index('"""')]
        elif command != "parameter":
            args = _unquote(args)
        yield number, command, args


def sampling_defaults(parameters: dict) -> dict:
    """The PARAMETERs that are sampling options (`Model.generate`'s names, as Ollama's
    `options`): a request's own values go over them."""
    return {k: v for k, v in parameters.items() if k not in LOAD_PARAMETERS and k != "num_predict"}


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    """A chat's messages with the model's SYSTEM first, unless the chat has its own."""
    if not system or any(m.get("role") in ("system", "developer") for m in messages):
        return messages
    return [{"role": "system", "content": system}, *messages]
