"""The saved-cache format: a prefilled KV cache (a document's, an RLV read's, a server
prompt's) as one safetensors file, beside the cache protocol whose `state()` and
`load_state()` it stores.

Files live under ``home()/documents/`` (``$TIGHTKV_HOME``, default
``~/.cache/tightkv``), one per (model, token prefix, KV spec)::

    documents/<key>.safetensors

The key is a sha256 over everything that decides the cache's contents:

- the model: its blob sha256 when it lives in the content-addressed store, else
  path, size and mtime; its RoPE scaling factor;
- the prompt's token ids (so the document's text, the tokenizer and the prompt
  template all count);
- the KV spec, as parsed;
- a fingerprint of the code that writes K/V (``tightkv/kv/*.py``,
  ``tightkv/models/*.py`` and the kernel sources, whose tq4 encoder writes the
  stored codes), so a cache written by another version of the codecs, of a
  model or of the kernels is never read back as if it were ours.

Tensors are each layer's ``state()`` (named ``<layer>.<field>``), which holds
what the cache holds (``nbytes``) plus per-layer counters; and a JSON header. The header
repeats the key's parts and carries a sha256 of every tensor's bytes: a file
that is truncated, altered, renamed or written for another model, document or
spec is detected, reported in one line, deleted and rebuilt. It is never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

FORMAT = "tightkv-document-cache/2"  # 2: query statistics in compressed layers' state


def documents_dir() -> Path:
    from ..store import home

    return home() / "documents"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the source of the modules that produce and store K/V."""
    root = Path(__file__).resolve().parents[1]
    from ..kernels.build import source_digest

    h = hashlib.sha256(source_digest().encode())
    for sub in ("kv", "models"):
        for p in sorted((root / sub).glob("*.py")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def model_identity(model) -> str:
    """The model file: its sha256 when the store names it so, else path, size, mtime."""
    p = Path(model.path).resolve()
    m = re.match(r"sha256-([0-9a-f]{64})$", p.name)
    if m:
        ident = f"sha256:{m.group(1)}"
    else:
        st = p.stat()
        ident = f"file:{p}|{st.st_size}|{st.st_mtime_ns}"
    return f"{ident}|rope={getattr(model, 'rope_factor', None)}"


def ids_digest(ids: list[int]) -> str:
    return hashlib.sha256(torch.tensor(ids, dtype=torch.int32).numpy().tobytes()).hexdigest()


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _spec_text(kv) -> str:
    from .spec import parse_kv

    s = parse_kv(kv)
    return json.dumps([s.k, s.v, s.sink, s.recent, list(map(list, s.overrides)), s.seed])


def cache_key(model, kv, ids: list[int], cuts: tuple = ()) -> dict:
    """The fields that must all match for a file to be used. `cuts`: the prefill chunk
    ends off the grid that the cache was filled with (`engine.generate.chunk_ends`)."""
    key = {
        "format": FORMAT,
        "model": model_identity(model),
        "ids_sha256": ids_digest(ids),
        "tokens": str(len(ids)),
        "kv": _spec_text(kv),
        "code": code_fingerprint(),
    }
    if cuts:
        key["cuts"] = ",".join(map(str, cuts))
    return key


def _key_hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


class CacheRejected(Exception):
    """A file that must not be used, with the reason."""


class CacheStore:
    """Save and load filled KV caches under `root` (default home()/documents), at most
    `max_bytes` of files in all (None: `store.cache_max_bytes()`, $TIGHTKV_CACHE_MAX or
    4 GB; 0: no bound): a save deletes the least recently used files beyond it."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None):
        from ..store import cache_max_bytes

        self.root = Path(root) if root is not None else documents_dir()
        self.max_bytes = cache_max_bytes() if max_bytes is None else (max_bytes or None)

    def path_for(self, model, doc, kv, ids: list[int], cuts: tuple = ()) -> Path:
        return self.root / f"{_key_hash(cache_key(model, kv, ids, cuts))}.safetensors"

    # --- save -------------------------------------------------------------------------
    def save(
        self,
        model,
        doc,
        kv,
        ids: list[int],
        cache: list,
        kind: str = "document",
        extras: dict[str, torch.Tensor] | None = None,
        cuts: tuple = (),
    ) -> Path:
        """Write the cache's per-layer states (atomically: a temp file, then rename).
        `kind` says what the prefix is (a whole document, an RLV read, a server prompt),
        for listings and pruning; `extras` are more tensors kept beside it (the logits
        after a server prompt), under checksum like the rest; `cuts`, as `cache_key` says."""
        from safetensors.torch import save_file

        from .spec import parse_kv

        tensors: dict[str, torch.Tensor] = {f"x.{k}": v.contiguous() for k, v in (extras or {}).items()}
        classes = []
        for i, c in enumerate(cache):
            for name, t in c.state().items():
                tensors[f"{i}.{name}"] = t.contiguous()
            classes.append(type(c).__name__)
        meta = dict(cache_key(model, kv, ids, cuts))
        meta.update(
            {
                "checksum": tensors_digest(tensors),
                "layers": str(len(cache)),
                "classes": json.dumps(classes),
                "kv_bytes": str(sum(c.nbytes for c in cache)),
                "kv_spec": str(parse_kv(kv)),
                "model_path": str(model.path),
                "documents": json.dumps(list(getattr(doc, "names", []))),
                "doc_sha256": getattr(doc, "sha256", ""),
                "kind": kind,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
        choice = getattr(model, "kv_choice", None)
        if choice is not None and choice.kv == str(parse_kv(kv)):  # `--kv auto` chose this type: why
            meta["kv_auto"] = json.dumps(choice.as_dict())
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(model, doc, kv, ids, cuts)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(tmp), metadata=meta)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        if self.max_bytes is not None:
            self.prune(self.max_bytes, keep=path)
        return path

    # --- load -------------------------------------------------------------------------
    def load(self, model, doc, kv, ids: list[int], notice: Callable[[str], None] | None = None) -> list | None:
        """A filled cache from disk, or None (absent, or rejected: then reported in one
        line through `notice` and deleted, so the caller prefills and saves afresh)."""
        return self.load_entry(model, kv, ids, notice)[0]

    def load_entry(
        self, model, kv, ids: list[int], notice: Callable[[str], None] | None = None, cuts: tuple = ()
    ) -> tuple[list | None, dict[str, torch.Tensor]]:
        """(the cache, its extras) from disk, or (None, {}) as `load` says. A file read is
        touched, so pruning takes the least recently used first."""
        path = self.path_for(model, None, kv, ids, cuts)
        if not path.exists():
            return None, {}
        try:
            out = self._read(path, model, kv, ids, cuts)
        except CacheRejected as err:
            if notice:
                notice(f"document cache {path.name}: {err}; rebuilding it")
            try:
                path.unlink()
            except OSError:
                pass
            return None, {}
        try:
            os.utime(path)
        except OSError:
            pass
        return out

    def _read(self, path: Path, model, kv, ids: list[int], cuts: tuple = ()) -> tuple[list, dict[str, torch.Tensor]]:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:  # a truncated or garbled file fails to parse
            raise CacheRejected(f"unreadable ({type(err).__name__})") from None
        want = cache_key(model, kv, ids, cuts)
        for field, value in want.items():
            if meta.get(field) != value:
                raise CacheRejected(f"written for another {field if field != 'ids_sha256' else 'document'}")
        if tensors_digest(tensors) != meta.get("checksum"):
            raise CacheRejected("checksum mismatch (corrupt)")
        cache = model.new_cache(kv)
        classes = json.loads(meta.get("classes", "[]"))
        if len(cache) != int(meta.get("layers", -1)) or classes != [type(c).__name__ for c in cache]:
            raise CacheRejected("layer layout differs from the model's")
        try:
            for i, c in enumerate(cache):
                prefix = f"{i}."
                c.load_state({k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)})
        except (KeyError, ValueError, RuntimeError) as err:
            raise CacheRejected(f"layer state does not load ({err})") from None
        if any(c.offset != len(ids) for c in cache):
            raise CacheRejected("token count differs")
        return cache, {k[2:]: t for k, t in tensors.items() if k.startswith("x.")}

    # --- info -------------------------------------------------------------------------
    def entries(self) -> list[dict]:
        """Every cache file with its header fields and sizes."""
        from safetensors import safe_open

        out = []
        for p in sorted(self.root.glob("*.safetensors")) if self.root.exists() else []:
            row = {"path": str(p), "file_bytes": p.stat().st_size}
            try:
                with safe_open(str(p), framework="pt") as f:
                    meta = f.metadata() or {}
                    tensor_bytes = 0
                    for k in f.keys():
                        sl = f.get_slice(k)
                        shape, dtype = sl.get_shape(), sl.get_dtype()
                        n = 1
                        for d in shape:
                            n *= d
                        tensor_bytes += n * _DTYPE_BYTES.get(dtype, 0)
                row.update(
                    {
                        "kind": meta.get("kind", "document"),
                        "kv": meta.get("kv_spec"),
                        "tokens": int(meta.get("tokens", 0)),
                        "kv_bytes": int(meta.get("kv_bytes", 0)),
                        "tensor_bytes": tensor_bytes,
                        "documents": json.loads(meta.get("documents", "[]")),
                        "model": meta.get("model_path"),
                        "created": meta.get("created"),
                        "kv_auto": json.loads(meta.get("kv_auto", "null")),
                        "doc_sha256": meta.get("doc_sha256", ""),
                    }
                )
                row["overhead_bytes"] = row["file_bytes"] - row["kv_bytes"]
            except Exception as err:
                row["error"] = f"unreadable ({type(err).__name__})"
            out.append(row)
        return out

    def prune(self, max_bytes: int, kind: str | None = None, keep: Path | None = None) -> int:
        """Delete files of `kind` (None: every kind), least recently used first, until they
        take at most `max_bytes` (`keep`, the file just written, stays). Returns files deleted."""
        rows = sorted(self.files(kind), key=lambda r: r[2])
        total = sum(size for _, size, _ in rows)
        deleted = 0
        for path, size, _ in rows:
            if total <= max_bytes:
                break
            if path != keep and _unlink(path):
                total -= size
                deleted += 1
        return deleted

    def prune_older(self, seconds: float, kind: str | None = None) -> int:
        """Delete files of `kind` (None: every kind) last used more than `seconds` ago (a
        load touches its file). Returns files deleted."""
        cutoff = time.time() - seconds
        return sum(_unlink(path) for path, _, used in self.files(kind) if used < cutoff)

    def files(self, kind: str | None) -> list[tuple[Path, int, float]]:
        """(path, bytes, last use) of the files of `kind`; every kind from the directory alone."""
        if kind is not None:
            paths = [Path(r["path"]) for r in self.entries() if r.get("kind") == kind]
        else:
            paths = list(self.root.glob("*.safetensors")) if self.root.exists() else []
        out = []
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((path, st.st_size, st.st_mtime))
        return out

    def remove(self, names: list[str]) -> list[str]:
        """Delete the named files (a file name, or its key without the suffix)."""
        gone = []
        for name in names:
            path = self.root / (name if name.endswith(".safetensors") else f"{name}.safetensors")
            if path.parent != self.root or not path.exists():
                from ..errors import TightKVError

                raise TightKVError(f"no cached prefix '{name}' in {self.root} (see: tightkv cache)")
            path.unlink()
            gone.append(path.name)
        return gone

    def clear(self) -> int:
        """Delete every saved cache; returns how many."""
        n = 0
        for p in self.root.glob("*.safetensors") if self.root.exists() else []:
            p.unlink()
            n += 1
        return n


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


def format_entries(rows: list[dict]) -> str:
    if not rows:
        return f"no cached documents in {documents_dir()}"
    lines = [
        f"{'file':<44} {'kind':<9} {'kv':<14} {'tokens':>7} {'KV bytes':>12} {'file bytes':>12} {'overhead':>9}  documents"
    ]
    for r in rows:
        name = Path(r["path"]).name
        if "error" in r:
            lines.append(f"{name:<44} {r['error']}")
            continue
        lines.append(
            f"{name:<44} {r['kind']:<9} {str(r['kv']):<14} {r['tokens']:>7} {r['kv_bytes']:>12,} {r['file_bytes']:>12,} "
            f"{r['overhead_bytes']:>9,}  {', '.join(r['documents'])}"
        )
    return "\n".join(lines)
