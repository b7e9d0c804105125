"""`tightkv run [MODEL] [PROMPT]`."""
from __future__ import annotations

import argparse
import sys

from ..errors import TightKVError

from .common import add_model_flags, add_sampling_flags

NAME = "run"
HELP = "generate from a prompt (the embedded model by default)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", metavar="[MODEL] [PROMPT]", help="a registry name or .gguf path, then the prompt")
    p.add_argument("--verbose", action="store_true", help="print token counts, speeds and KV size")
    add_model_flags(p)
    add_sampling_flags(p)


def _split_model_and_prompt(args: list[str]) -> tuple[str | None, str | None]:
    from ..registry import EMBEDDED, looks_like_path

    if args and (args[0] in EMBEDDED or (looks_like_path(args[0]) and args[0].endswith(".gguf"))):
        return args[0], " ".join(args[1:]) or None
    return None, " ".join(args) or None


def run(ns: argparse.Namespace) -> int:
    from ..api import Model

    name, prompt = _split_model_and_prompt(ns.args)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if not prompt:
        raise TightKVError("no prompt given (usage: tightkv run [MODEL] PROMPT)")
    model = Model(name, kv=ns.kv, context_length=ns.ctx, threads=ns.threads)
    ids = model.chat_ids([{"role": "user", "content": prompt}]) if model.chat_template else prompt
    pieces = model.generate(ids, max_tokens=ns.max_tokens, temperature=ns.temperature, top_k=ns.top_k,
                            top_p=ns.top_p, min_p=ns.min_p, repeat_penalty=ns.repeat_penalty, seed=ns.seed,
                            stop=ns.stop, stream=True)
    stats = None
    for piece in pieces:
        if isinstance(piece, str):
            sys.stdout.write(piece)
            sys.stdout.flush()
        else:
            stats = piece
    sys.stdout.write("\n")
    if ns.verbose and stats:
        _print_stats(stats)
    return 0


def _print_stats(s) -> None:
    err = sys.stderr
    print(f"prompt eval count:    {s.prompt_tokens} token(s) ({s.cached_tokens} cached)", file=err)
    print(f"prompt eval rate:     {s.prompt_tps:.2f} tokens/s", file=err)
    print(f"eval count:           {s.generated_tokens} token(s)", file=err)
    print(f"eval rate:            {s.generation_tps:.2f} tokens/s", file=err)
    print(f"kv cache:             {s.kv_bytes / 2**20:.2f} MiB", file=err)
    print(f"finish reason:        {s.finish_reason}", file=err)
