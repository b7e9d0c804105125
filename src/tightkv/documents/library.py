"""The texts of stored documents, kept beside their KV caches, so that a document can
be listed and opened again by its id without its file (the web page's list):

    documents/texts/<id>.txt     the text, as the session read it
    documents/texts/<id>.json    {"id", "name", "names", "starts", "sha256", "chars", "added"}

The id is the first 16 hex digits of the text's sha256 (`DocumentText.sha256`), which
the cache files' headers carry too (`doc_sha256`), so a text finds its caches.
`tightkv ask` and the server keep what they read here; the KV caches stay in
`kv.saved.CacheStore`, which decides warm or cold.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from .text import DocumentText

_ID = re.compile(r"^[0-9a-f]{16}$")


def doc_id(doc: DocumentText) -> str:
    """A document's id: the start of its text's sha256."""
    return doc.sha256[:16]


class DocumentLibrary:
    """Document texts under `root` (default home()/documents/texts)."""

    def __init__(self, root: str | os.PathLike | None = None):
        if root is None:
            from ..store import home

            root = home() / "documents" / "texts"  # beside kv.saved.CacheStore's caches
        self.root = Path(root)

    def keep(self, doc: DocumentText) -> str:
        """Save a document's text (once: the same text keeps its first record). Returns its id."""
        ident = doc_id(doc)
        meta_path = self.root / f"{ident}.json"
        if meta_path.exists():
            return ident
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {
            "id": ident,
            "name": ", ".join(doc.names),
            "names": list(doc.names),
            "starts": list(doc.starts),
            "sha256": doc.sha256,
            "chars": len(doc.text),
            "added": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        _write(self.root / f"{ident}.txt", doc.text)
        _write(meta_path, json.dumps(meta))
        return ident

    def get(self, ident: str) -> DocumentText | None:
        """The document with this id, or None."""
        meta = self.meta(ident)
        if meta is None:
            return None
        try:
            text = (self.root / f"{ident}.txt").read_text(encoding="utf-8")
        except OSError:
            return None
        return DocumentText(text, tuple(meta["names"]), tuple(meta["starts"]))

    def meta(self, ident: str) -> dict | None:
        """A document's record (without its text), or None."""
        if not _ID.match(ident or ""):
            return None
        try:
            return json.loads((self.root / f"{ident}.json").read_text())
        except (OSError, ValueError):
            return None

    def entries(self) -> list[dict]:
        """Every document's record, the most recently added first."""
        rows = [self.meta(p.stem) for p in self.root.glob("*.json")] if self.root.exists() else []
        return sorted((r for r in rows if r), key=lambda r: r["added"], reverse=True)

    def clear(self) -> int:
        """Delete every kept text; returns how many documents went."""
        n = 0
        for p in self.root.glob("*.json") if self.root.exists() else []:
            (self.root / f"{p.stem}.txt").unlink(missing_ok=True)
            p.unlink()
            n += 1
        return n


def clear_saved(store) -> int:
    """Delete every saved cache in `store` (a `kv.saved.CacheStore`) and the document texts
    kept beside them; returns how many cache files went."""
    n = store.clear()
    DocumentLibrary(store.root / "texts").clear()
    return n


def _write(path: Path, text: str) -> None:
    """Write atomically (a temp file, then rename), so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
