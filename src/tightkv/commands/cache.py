"""`tightkv cache`: the stored KV prefixes (documents, RLV reads, server prompts).

tightkv cache [ls|list]            # list: kind, KV type, tokens, KV and file bytes
tightkv cache rm NAME... | --all   # delete files (NAME as the list shows it)
tightkv cache prune --max 2GB      # least recently used out, per kind or all
"""

from __future__ import annotations

import argparse
import json

from ..errors import TightKVError
from .flags import parse_size

NAME = "cache"
HELP = "list, remove or prune the stored KV prefixes (documents, RLV reads, server prompts)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        default="ls",
        choices=["ls", "list", "rm", "prune"],
        help="ls or list (the default): list; rm: delete the named files; prune: delete the least recently used "
        "down to --max",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="rm: files as `tightkv cache` lists them")
    p.add_argument("--all", action="store_true", help="rm: every stored prefix")
    p.add_argument("--max", default=None, metavar="SIZE", help="prune: keep at most this much, e.g. 2GB")
    p.add_argument(
        "--kind",
        default=None,
        choices=["document", "rlv read", "prompt"],
        help="prune: only this kind (default: each kind to --max)",
    )
    p.add_argument("--json", action="store_true", help="ls: print the entries as JSON")


def run(ns: argparse.Namespace) -> int:
    from ..documents.library import clear_saved
    from ..kv.saved import CacheStore, format_entries

    store = CacheStore()
    if ns.action in ("ls", "list"):  # `list` as the top level takes it (`tightkv list`, alias `ls`)
        rows = store.entries()
        if ns.json:
            print(json.dumps(rows, indent=1))
            return 0
        print(format_entries(rows))
        if rows:
            total = sum(r["file_bytes"] for r in rows)
            print(f"{len(rows)} files, {total / 2**20:,.1f} MiB in {store.root}")
        return 0
    if ns.action == "rm":
        if ns.all == bool(ns.names):
            raise TightKVError("give the files to remove (as `tightkv cache` lists them), or --all")
        if ns.all:
            print(f"deleted {clear_saved(store)} files from {store.root}")
        else:
            for name in store.remove(ns.names):
                print(f"deleted {name}")
        return 0
    if ns.max is None:
        raise TightKVError("prune needs --max SIZE, e.g. tightkv cache prune --max 2GB")
    limit = parse_size(ns.max, "--max")
    kinds = [ns.kind] if ns.kind else sorted({r.get("kind", "document") for r in store.entries()} - {None})
    deleted = sum(store.prune(limit, kind) for kind in kinds)
    print(f"deleted {deleted} files from {store.root}")
    return 0
