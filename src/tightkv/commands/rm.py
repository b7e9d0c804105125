"""`tightkv rm NAME...`: delete pulled models (blobs that no other model uses go too)."""

from __future__ import annotations

import argparse

NAME = "rm"
HELP = "remove pulled models"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .flags import one_line_errors

    p.add_argument(
        "models", nargs="+", metavar="NAME", help="a pulled model (as `tightkv list` names it); several may follow"
    )
    one_line_errors(p)


def run(ns: argparse.Namespace) -> int:
    from ..registry import remove

    for name in remove(ns.models):
        print(f"deleted '{name}'")
    return 0
