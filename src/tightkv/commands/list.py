"""`tightkv list`: the pulled models, as Ollama lists them (NAME ID SIZE MODIFIED)."""

from __future__ import annotations

import argparse
import time

NAME = "list"
ALIASES = ["ls"]
HELP = "list pulled models"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .flags import one_line_errors

    one_line_errors(p)


def human_ago(seconds: float) -> str:
    """Ollama's HumanTime: 'Less than a second ago', '2 minutes ago', 'About an hour ago'."""
    s = int(seconds)
    if s < 1:
        d = "Less than a second"
    elif s == 1:
        d = "1 second"
    elif s < 60:
        d = f"{s} seconds"
    elif s // 60 == 1:
        d = "About a minute"
    elif s // 60 < 60:
        d = f"{s // 60} minutes"
    else:
        h = round(seconds / 3600)
        if h == 1:
            d = "About an hour"
        elif h < 48:
            d = f"{h} hours"
        elif h < 24 * 14:
            d = f"{h // 24} days"
        elif h < 24 * 60:
            d = f"{h // 24 // 7} weeks"
        elif h < 24 * 365 * 2:
            d = f"{h // 24 // 30} months"
        else:
            d = f"{h // 24 // 365} years"
    return d + " ago"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run(ns: argparse.Namespace) -> int:
    from ..hub import human_bytes
    from ..registry import list_installed

    now = time.time()
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    rows += [[m.name, m.id, human_bytes(m.size), human_ago(now - m.modified)] for m in list_installed()]
    print(table(rows))
    return 0
