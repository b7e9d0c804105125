"""Flags and helpers shared by the verbs."""

from __future__ import annotations

import argparse

from ..errors import TightKVError


class _RememberFlag(argparse.Action):
    """Store the value and the flag as typed (``-ctk`` or ``--cache-type-k``), for error messages."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        flags = dict(getattr(namespace, "typed_flags", None) or {})
        flags[self.dest] = option_string
        namespace.typed_flags = flags


def one_line_errors(p: argparse.ArgumentParser) -> None:
    """Make a bad flag value a one-line message (no usage block), exit status 2."""

    def error(message: str) -> None:
        p.exit(2, f"error: {message} (see: {p.prog} --help)\n")

    p.error = error  # type: ignore[method-assign]


def add_kv_flags(p: argparse.ArgumentParser, default: str = "kvarn4, or $TIGHTKV_KV_CACHE_TYPE") -> None:
    """--kv (a type, preset or K:V pair) and llama.cpp's -ctk/-ctv."""
    p.add_argument(
        "--kv",
        "--cache-type",
        dest="kv",
        default=None,
        action=_RememberFlag,
        help=f"KV cache type or preset for keys and values, a K:V pair, or auto (run, serve, ask: the "
        f"best-quality type that fits --mem, probed on your text) (default {default})",
    )
    p.add_argument(
        "-ctk",
        "--cache-type-k",
        default=None,
        metavar="TYPE",
        action=_RememberFlag,
        help="KV cache type for keys (llama.cpp's flag; f16 when only -ctv is given)",
    )
    p.add_argument(
        "-ctv",
        "--cache-type-v",
        default=None,
        metavar="TYPE",
        action=_RememberFlag,
        help="KV cache type for values (f16 when only -ctk is given)",
    )


def add_auto_flags(
    p: argparse.ArgumentParser,
    help: str = "memory budget for --kv auto, e.g. 8GB (default: the RAM available less 1 GiB)",
) -> None:
    """--mem: the budget `--kv auto` fits the context into (`serve`: its models too)."""
    p.add_argument("--mem", default=None, metavar="SIZE", help=help)


def auto_memory(ns: argparse.Namespace) -> int | None:
    """--mem in bytes (None: `--kv auto`'s default)."""
    return parse_size(ns.mem, "--mem") if getattr(ns, "mem", None) else None


CTX_HELP = "context length in tokens (default, or 0: the model's trained context)"


def add_model_flags(
    p: argparse.ArgumentParser,
    kv_default: str = "kvarn4, or $TIGHTKV_KV_CACHE_TYPE",
    ctx_help: str = CTX_HELP,
    ctx_type=int,
) -> None:
    """The KV flags, -c/--ctx (read by ctx_type) and --threads."""
    add_kv_flags(p, kv_default)
    p.add_argument("-c", "--ctx", type=ctx_type, default=None, help=ctx_help)
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores)")


def cli_wording(message: str, ns: argparse.Namespace) -> str:
    """An error of the Python API in the CLI's words: its flags, not Model's keywords."""
    import re

    message = re.sub(r"^context_length\b", "-c/--ctx", message)
    if hasattr(ns, "rope_scale"):
        return re.sub(r"pass rope_scaling=(\S+)", r"pass --rope-scale \1", message)
    return re.sub(
        r"pass rope_scaling=(\S+) to stretch it", r"`tightkv run` can stretch it with --rope-scale \1", message
    )


# `tightkv run`'s sampling: greedy, nothing truncated or penalised (`client` sends the same),
# except that a base model (no chat template) gets BASE_REPEAT_PENALTY unless one is given.
SAMPLING_DEFAULTS = {
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repeat_last_n": 64,
}


def add_sampling_flags(p: argparse.ArgumentParser, base_penalty: bool = False) -> None:
    """-n, --temperature, --top-k, --top-p, --min-p, the penalties, --seed, --stop (greedy by
    default). `base_penalty`: --repeat-penalty defaults to None, read as BASE_REPEAT_PENALTY
    for a model without a chat template and 1 otherwise (`repeat_penalty_for`)."""
    from ..engine.chat import BASE_REPEAT_PENALTY

    d = SAMPLING_DEFAULTS
    p.add_argument("-n", "--max-tokens", type=int, default=None, help="tokens to generate (default: until the end)")
    p.add_argument(
        "--temperature",
        "--temp",
        type=float,
        default=d["temperature"],
        help="sampling temperature; 0 (the default) always picks the likeliest token",
    )
    p.add_argument("--top-k", type=int, default=d["top_k"], help="sample from the K likeliest tokens (default 0: all)")
    p.add_argument(
        "--top-p",
        type=float,
        default=d["top_p"],
        help="sample from the likeliest tokens that make up P of the probability (default 1: all)",
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=d["min_p"],
        help="drop tokens below P x the likeliest one's probability (default 0: none)",
    )
    p.add_argument(
        "--repeat-penalty",
        type=float,
        default=None if base_penalty else d["repeat_penalty"],
        help="divide (multiply, where negative) the logits of the last --repeat-last-n tokens by this "
        + (
            f"(default {BASE_REPEAT_PENALTY} for a base model, one without a chat template, as llama-cli's "
            "old default; 1, no penalty, for a chat model)"
            if base_penalty
            else "(default 1: no penalty)"
        ),
    )
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=d["presence_penalty"],
        help="subtract this from the logits of the last --repeat-last-n tokens (default 0)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=d["frequency_penalty"],
        help="subtract this times each of those tokens' count (default 0)",
    )
    p.add_argument(
        "--repeat-last-n",
        type=int,
        default=d["repeat_last_n"],
        help="the penalties' window, in tokens of prompt and reply (default 64; 0 disables; -1: the whole context)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: a new one each run)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """Speculative decoding's flags, as llama.cpp names them: --spec-type, -md/--model-draft,
    --draft-max, --draft-min (`engine.speculative`; the output is the same with or without)."""
    p.add_argument(
        "--spec-type",
        choices=["none", "ngram-simple", "draft"],
        default=None,
        help="speculative decoding: ngram-simple drafts from the prompt and reply (prompt lookup), "
        "draft from --model-draft; several tokens per step where drafts are accepted, the same output "
        "(default: draft with -md, else ngram-simple; none turns it off)",
    )
    p.add_argument(
        "-md",
        "--model-draft",
        default=None,
        metavar="MODEL",
        help="a draft model of the same vocabulary (a .gguf path or registry name) for speculative decoding",
    )
    p.add_argument("--draft-max", type=int, default=None, help="draft tokens at most per step (default 16)")
    p.add_argument("--draft-min", type=int, default=0, help="draft tokens at least, else no draft (default 0)")


def spec_kwargs(ns: argparse.Namespace) -> dict:
    """`Model.speculate` keyword arguments from the flags of `add_spec_flags`."""
    return {
        "spec_type": ns.spec_type,
        "model_draft": ns.model_draft,
        "draft_max": ns.draft_max,
        "draft_min": ns.draft_min,
    }


def repeat_penalty_for(given: float | None, chat_template: str | None) -> float:
    """--repeat-penalty as given, else BASE_REPEAT_PENALTY for a base model, 1 for a chat model."""
    from ..engine.chat import BASE_REPEAT_PENALTY

    if given is not None:
        return given
    return SAMPLING_DEFAULTS["repeat_penalty"] if chat_template else BASE_REPEAT_PENALTY


THINK_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_think(text: str) -> bool | str:
    """A --think value, as Ollama's CLI takes it: true or false, or a level (low, medium,
    high; gpt-oss's reasoning effort, which `engine.harmony.effort_level` also reads
    from minimal, none, xhigh and max)."""
    from ..engine.harmony import effort_level

    word = text.strip().lower()
    if word in THINK_WORDS:
        return THINK_WORDS[word]
    try:
        effort_level(word, None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--think takes true, false, low, medium or high, got '{text}' "
            "(a prompt right after --think is read as its value: write --think=true, or the prompt first)"
        ) from None
    return word


def add_think_flags(p: argparse.ArgumentParser) -> None:
    """Ollama's --think[=true|false|low|medium|high] and --hidethinking."""
    p.add_argument(
        "--think",
        nargs="?",
        const=True,
        default=None,
        type=parse_think,
        metavar="LEVEL",
        help="reasoning models: think (true, the default), or not (false), or how hard: low, medium, high "
        "(gpt-oss's reasoning effort; it always reasons, false is low)",
    )
    p.add_argument(
        "--hidethinking",
        "--hide-thinking",
        action="store_true",
        help="do not print the reasoning (a <think> block, gpt-oss's analysis channel), only the answer",
    )


def model_label(name: str | None) -> str:
    """The model as a user names it: the registry name (the embedded one by
    default), or a .gguf path's file name."""
    from pathlib import Path

    from ..registry import DEFAULT_MODEL, find_created, looks_like_path, lookup

    if name and looks_like_path(name):
        return Path(name).name
    made = find_created(name) if name else None  # a name `tightkv create` made
    return made.name if made is not None else lookup(name or DEFAULT_MODEL).name


def kv_spec(ns: argparse.Namespace) -> str | None:
    """The KV spec from --kv or --cache-type-k/-v, validated; None leaves the choice to
    `kv.spec.resolve_kv` ($TIGHTKV_KV_CACHE_TYPE, else the default)."""
    from ..kv.spec import check_kv

    k, v = getattr(ns, "cache_type_k", None), getattr(ns, "cache_type_v", None)
    if k or v:
        if ns.kv:
            raise TightKVError("use either --kv or --cache-type-k/--cache-type-v, not both")
        flag_k, flag_v = _typed(ns, "cache_type_k", "-ctk"), _typed(ns, "cache_type_v", "-ctv")
        k, v = (k or "f16").strip().lower(), (v or "f16").strip().lower()
        if k == v:
            return check_kv(k, flag_k)
        check_kv(f"{k}:f16", flag_k)
        check_kv(f"f16:{v}", flag_v)
        return f"{k}:{v}"
    return check_kv(ns.kv, _typed(ns, "kv", "--kv")) if ns.kv else None


def _typed(ns: argparse.Namespace, dest: str, fallback: str) -> str:
    return (getattr(ns, "typed_flags", None) or {}).get(dest) or fallback


def kv_types(ns: argparse.Namespace) -> list[str]:
    """The KV types a measuring verb runs: --compare, else --kv / -ctk/-ctv, else f16."""
    from ..kv.spec import is_auto

    one = kv_spec(ns)
    if is_auto(one):
        raise TightKVError("--kv auto is for run, serve and ask; compare the types it chooses from with --compare")
    if ns.compare and one:
        raise TightKVError("use either --compare or --kv/--cache-type-k/--cache-type-v, not both")
    return kv_list(ns.compare or one)


def add_endpoint_flags(p: argparse.ArgumentParser) -> None:
    """--endpoint, --api-key and --model: measure a model behind an OpenAI-compatible server."""
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="measure the model behind an OpenAI-compatible server (vLLM, llama-server, Ollama's /v1, "
        "tightkv serve) instead of the local engine; --compare takes such URLs too (URL#model), "
        "the first entry being the baseline",
    )
    p.add_argument(
        "--api-key", default=None, help="bearer key for endpoints (default $TIGHTKV_API_KEY or $OPENAI_API_KEY)"
    )
    p.add_argument(
        "--model",
        dest="served_model",
        default=None,
        help="the endpoints' model id (default: the first of each one's /v1/models)",
    )


def measured_entries(ns: argparse.Namespace) -> list[str]:
    """What a measuring verb runs: --endpoint first, then --compare's KV types and URLs
    (or --kv's type); f16 alone when nothing is named."""
    named = bool(ns.compare or kv_spec(ns))
    rest = kv_types(ns) if named or not ns.endpoint else []
    return ([ns.endpoint] if ns.endpoint else []) + rest


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TightKVError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise TightKVError(f"{flag} needs positive integers, got '{text}'")
    return values


def kv_list(text: str | None) -> list[str]:
    """Comma-separated KV specs (f16 when empty); an option such as ``sink=0``
    belongs to the spec before it: ``f16,tq4,tq4,sink=0,window=0`` is three specs."""
    specs: list[str] = []
    for item in (k.strip() for k in (text or "f16").split(",")):
        if "=" in item and specs:
            specs[-1] += "," + item
        elif item:
            specs.append(item)
    return specs


def parse_size(text: str, flag: str) -> int:
    """Bytes from a size such as 16GB, 8GiB, 512M or 0 (decimal units; "i" for binary)."""
    from ..store import parse_size as size_bytes

    try:
        return size_bytes(text)
    except ValueError:
        raise TightKVError(f"{flag} takes a size like 16GB or 8GiB, got '{text}'") from None
