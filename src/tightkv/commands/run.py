"""`tightkv run [MODEL] [PROMPT]`: one answer, or an interactive chat.

The first argument is the model when it is a registry name (``qwen3:4b``,
``phi3.5``) or a ``.gguf`` path; otherwise every argument is the prompt, for the
embedded model. With a prompt (or piped stdin) it answers once, streaming to
stdout; with neither, on a terminal, it opens a chat whose KV cache persists
across turns (see `tightkv.repl`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import TightKVError

from .flags import (
    add_auto_flags,
    add_model_flags,
    add_sampling_flags,
    add_spec_flags,
    add_think_flags,
    auto_memory,
    kv_spec,
    one_line_errors,
    repeat_penalty_for,
    spec_kwargs,
)

NAME = "run"
HELP = "chat with a model, or answer one prompt (the embedded model by default)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "args",
        nargs="*",
        metavar="[MODEL] [PROMPT]",
        help="a registry name (e.g. gemma3:270m, qwen3:4b) or .gguf path, then the prompt",
    )
    p.add_argument("--verbose", action="store_true", help="print token counts, speeds and KV size")
    add_model_flags(p)
    add_auto_flags(p)
    p.add_argument(
        "--rope-scale",
        type=float,
        default=None,
        metavar="FACTOR",
        help="linear RoPE scaling: allows --ctx up to FACTOR x the trained context",
    )
    p.add_argument("--system", default=None, help="system message (chat models)")
    add_think_flags(p)
    add_sampling_flags(p, base_penalty=True)
    add_spec_flags(p)
    one_line_errors(p)


def split_model_and_prompt(args: list[str]) -> tuple[str | None, str | None]:
    """(model or None, prompt or None) from the positional arguments."""
    from ..registry import is_model_name, looks_like_path

    if args and (is_model_name(args[0]) or (looks_like_path(args[0]) and args[0].endswith(".gguf"))):
        return args[0], " ".join(args[1:]) or None
    return None, " ".join(args) or None


def sampling_options(ns: argparse.Namespace) -> dict:
    """generate() keyword arguments from the sampling flags, validated."""
    from ..engine.sampling import SamplingParams
    from ..repl import SAMPLING_OPTIONS

    if ns.max_tokens is not None and ns.max_tokens < 1:
        raise TightKVError(f"-n/--max-tokens must be at least 1, got {ns.max_tokens}")
    sampling = {name: getattr(ns, name) for name in SAMPLING_OPTIONS}
    given = sampling["repeat_penalty"]  # None: the model's default, chosen once it is open (`repeat_penalty_for`)
    SamplingParams(**{**sampling, "repeat_penalty": 1.0 if given is None else given}).validate()
    return {"max_tokens": ns.max_tokens, **sampling, "stop": list(ns.stop or [])}


def open_model(name: str | None, ns: argparse.Namespace, text: str | None = None):
    """The Model for the run flags (pulls a registry model on first use); with --kv
    auto, its cache type chosen for --mem and probed on `text` (the prompt)."""
    import time

    from ..api import Model

    if ns.ctx is not None and ns.ctx < 0:
        raise TightKVError(f"-c/--ctx must be positive (or 0 for the model's context), got {ns.ctx}")
    if ns.threads is not None and ns.threads < 1:
        raise TightKVError(f"--threads must be at least 1, got {ns.threads}")
    rope = getattr(ns, "rope_scale", None)
    t0 = time.perf_counter()
    kv = kv_spec(ns)
    model = Model(name, kv=kv, context_length=ns.ctx or None, threads=ns.threads, rope_scaling=rope)
    if model.kv_pending:  # --kv auto: probed on the prompt
        model.choose_kv(text, memory=auto_memory(ns))
    model.load_seconds = time.perf_counter() - t0
    return model


def run(ns: argparse.Namespace) -> int:
    from ..engine.reasoning import reply_reader, think_vars, thinks
    from ..repl import ThinkingWriter, print_stats, run_repl

    name, prompt = split_model_and_prompt(ns.args)
    options = sampling_options(ns)
    interactive = prompt is None and sys.stdin.isatty()
    if prompt is None and not interactive:
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise TightKVError("no prompt given (usage: tightkv run [MODEL] PROMPT, or run it on a terminal to chat)")
    kv_spec(ns)  # a bad cache type fails before the model loads
    model = open_model(name, ns, prompt)
    model.speculate(**spec_kwargs(ns))
    options["repeat_penalty"] = repeat_penalty_for(options["repeat_penalty"], model.chat_template)
    if ns.think is not None and not thinks(model.chat_template):
        print("warning: this model does not think: --think does nothing", file=sys.stderr, flush=True)
    if interactive:
        from ..registry import DEFAULT_MODEL, looks_like_path, lookup

        shown = Path(name).name if name and looks_like_path(name) else lookup(name or DEFAULT_MODEL).name
        return run_repl(
            model,
            options,
            verbose=ns.verbose,
            system=ns.system,
            name=shown,
            think=ns.think,
            hide_thinking=ns.hidethinking,
        )
    text = ""
    if model.chat_template:
        messages = ([{"role": "system", "content": ns.system}] if ns.system else []) + [
            {"role": "user", "content": prompt}
        ]
        text = model.chat_text(messages, template_vars=think_vars(model.chat_template, ns.think))
        ids = model.chat_tokens(text)
    else:
        ids = prompt  # a base model: plain text completion
    reader = reply_reader(model.chat_template, text)  # reasoning apart from the answer, as Ollama shows it

    def put(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    write = ThinkingWriter(put, hide=ns.hidethinking or ns.think is False, color=sys.stdout.isatty())
    pieces = model.generate(ids, stream=True, **options)
    stats = None
    for step in pieces:
        write(*reader.feed(step.text))
        stats = step.stats
    write(*reader.finish())
    write.finish()
    sys.stdout.write("\n")
    sys.stdout.flush()
    if ns.verbose and stats:
        print_stats(stats, load_seconds=getattr(model, "load_seconds", None))
        print_drafts(stats)
    return 0


def print_drafts(stats, file=None) -> None:
    """Speculative decoding's counts under --verbose, where it drafted (llama-server's names)."""
    if stats.draft_n:
        rate = stats.draft_n_accepted / stats.draft_n
        print(
            f"draft tokens:         {stats.draft_n} ({stats.draft_n_accepted} accepted, {rate:.1%})",
            file=file or sys.stderr,
        )
