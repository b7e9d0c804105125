"""`tightkv pull NAME...`: download models into the store, with progress, resume and sha256 check."""

from __future__ import annotations

import argparse
import sys

NAME = "pull"
HELP = "download a model from the Hugging Face hub (resumable, sha256-verified)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .flags import one_line_errors

    p.add_argument("models", nargs="+", metavar="NAME", help="registry names, e.g. qwen3:4b, llama3.2:1b, phi3.5")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    one_line_errors(p)


def run(ns: argparse.Namespace) -> int:
    from ..registry import pull_model

    for name in ns.models:
        try:
            pull_model(name, quiet=ns.quiet, check_remote=True)
        except KeyboardInterrupt:
            print(f"\npull of {name} interrupted; run `tightkv pull {name}` again to resume", file=sys.stderr)
            return 130
    return 0
