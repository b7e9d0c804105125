"""The `tightkv` command: thin verbs over `tightkv.Model` (see tightkv.commands).

User errors print one line to stderr and exit 1; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .commands import VERBS
from .commands.flags import cli_wording
from .errors import TightKVError


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="tightkv", description="Local LLMs with a compressed KV cache.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for verb in VERBS:
        module = importlib.import_module(f"tightkv.commands.{verb}")
        verb_parser = sub.add_parser(module.NAME, help=module.HELP, aliases=getattr(module, "ALIASES", []))
        module.add_arguments(verb_parser)
        # after the verb too (`tightkv run --debug ...`); SUPPRESS keeps a --debug given before it
        verb_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        modules[module.NAME] = module
        for alias in getattr(module, "ALIASES", []):
            modules[alias] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return 0
    try:
        return modules[ns.command].run(ns)
    except TightKVError as err:
        if ns.debug:
            raise
        print(f"error: {cli_wording(str(err), ns)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
