"""`tightkv cache`: the stored KV prefixes (documents, RLV reads, server prompts).

tightkv cache [ls|list]                     # list: kind, KV type, tokens, KV and file bytes
tightkv cache rm NAME... | --all            # delete files (NAME as the list shows it)
tightkv cache prune --older-than 7d         # delete what was not used for a week
tightkv cache prune --max-size 2GB          # least recently used out until 2 GB are left

The store keeps itself under a bound ($TIGHTKV_CACHE_MAX, default 4 GB; `store.cache_max_bytes`).
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
        help="ls or list (the default): list; rm: delete the named files; prune: delete those not used for "
        "--older-than, then the least recently used down to --max-size",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="rm: files as `tightkv cache` lists them")
    p.add_argument("--all", action="store_true", help="rm: every stored prefix")
    p.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="prune: delete the files not used for this long, e.g. 7d, 12h, 30m, 2w",
    )
    p.add_argument(
        "--max-size",
        "--max",
        dest="max_size",
        default=None,
        metavar="SIZE",
        help="prune: then delete the least recently used until at most this much is left, e.g. 2GB, 500MiB",
    )
    p.add_argument(
        "--kind",
        default=None,
        choices=["document", "rlv read", "prompt"],
        help="prune: only files of this kind (default: every kind)",
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
            bound = f"at most {store.max_bytes / 1e9:g} GB" if store.max_bytes else "no bound"
            print(f"{len(rows)} files, {total / 2**20:,.1f} MiB in {store.root} ({bound}: TIGHTKV_CACHE_MAX)")
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
    return prune(store, ns)


def prune(store, ns: argparse.Namespace) -> int:
    """`cache prune`: by age, then by size; says what went and what is left."""
    from ..store import parse_duration

    if ns.older_than is None and ns.max_size is None:
        raise TightKVError("prune needs --older-than AGE or --max-size SIZE, e.g. tightkv cache prune --older-than 7d")
    limit = parse_size(ns.max_size, "--max-size") if ns.max_size is not None else None
    try:
        age = parse_duration(ns.older_than) if ns.older_than is not None else None
    except ValueError:
        raise TightKVError(f"--older-than takes an age like 7d, 12h, 30m or 2w, got '{ns.older_than}'") from None
    before = store.files(None)
    deleted = store.prune_older(age, ns.kind) if age is not None else 0
    if limit is not None:
        deleted += store.prune(limit, ns.kind)
    after = store.files(None)
    freed = sum(size for _, size, _ in before) - sum(size for _, size, _ in after)
    print(
        f"deleted {deleted} file{'s' * (deleted != 1)} ({freed / 2**20:,.1f} MiB) from {store.root}; "
        f"{len(after)} left ({sum(size for _, size, _ in after) / 2**20:,.1f} MiB)"
    )
    return 0
