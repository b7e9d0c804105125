"""Pulling GGUFs from the Hugging Face hub through `huggingface_hub`.

`pull(entry)` asks the hub for the file's metadata (HEAD on
``{HF_ENDPOINT}/{repo}/resolve/main/{file}``: X-Repo-Commit, X-Linked-Etag = the
LFS sha256, X-Linked-Size, and the CDN location), then downloads into
``blobs/sha256-<hex>-partial`` with `huggingface_hub.file_download.http_get`,
which resumes from the partial file's size with an HTTP Range request. The
finished file is hashed; a mismatch deletes it and is reported. Progress is
drawn on stderr the way Ollama draws it::

    pulling manifest
    pulling 3f2c1a9b8d7e:  35% ▕████████                ▏ 586 MB/1.7 GB  4.6 MB/s  3m56s
    verifying sha256 digest
    writing manifest
    success
"""

from __future__ import annotations

import errno
import inspect
import os
import re
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import TightKVError
from .store import Entry, Installed, blob_path, blobs_dir, file_lock, file_sha256, installed, write_manifest

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 18  # read the HTTP body in 256 KiB pieces, so progress moves smoothly
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _quiet_hub_client() -> None:
    """No telemetry, so huggingface_hub neither adds to its user agent nor fetches
    and caches its agent registry under HF_HOME: tightkv stores nothing outside
    TIGHTKV_HOME. (HF_HUB_DISABLE_TELEMETRY=0 in the environment keeps it on.)"""
    from huggingface_hub import constants

    if "HF_HUB_DISABLE_TELEMETRY" not in os.environ:
        constants.HF_HUB_DISABLE_TELEMETRY = True


def endpoint() -> str:
    """The hub to pull from: $HF_ENDPOINT, as huggingface_hub reads it."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass
class RemoteFile:
    """What the hub says about a file before it is downloaded."""

    url: str  # where to GET the bytes (the CDN location when the hub redirects)
    size: int | None
    sha256: str | None  # the LFS sha256 (X-Linked-Etag), when the file is in LFS
    etag: str
    commit: str | None


def remote_file(entry: Entry, revision: str = "main") -> RemoteFile:
    """HEAD the file on the hub; hub errors become one-line `TightKVError`s."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    _quiet_hub_client()
    url = hf_hub_url(entry.repo, entry.file, revision=revision, endpoint=endpoint())
    with _hub_errors(entry, url):
        meta = _head(get_hf_file_metadata, url)
    if meta.commit_hash is None or meta.etag is None:
        raise TightKVError(f"{url} did not answer like a Hugging Face hub (no X-Repo-Commit/ETag); check HF_ENDPOINT")
    etag = meta.etag.strip('"').lower()
    sha = etag if _SHA256.match(etag) else None
    location = url if getattr(meta, "xet_file_data", None) is not None else (meta.location or url)
    return RemoteFile(location, meta.size, sha, etag, meta.commit_hash)


def _head(get_hf_file_metadata, url: str):
    """One HEAD; a refused connection fails at once, while a timeout, 429 or 5xx
    is retried with huggingface_hub's backoff."""
    from huggingface_hub.errors import HfHubHTTPError

    if "retry_on_errors" not in inspect.signature(get_hf_file_metadata).parameters:  # older huggingface_hub
        return get_hf_file_metadata(url, endpoint=endpoint())
    try:
        return get_hf_file_metadata(url, endpoint=endpoint(), retry_on_errors=False)
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status != 429 and not (status and status >= 500):
            raise
    except Exception as err:
        if "timeout" not in type(err).__name__.lower():
            raise
    return get_hf_file_metadata(url, endpoint=endpoint(), retry_on_errors=True)


def pull(entry: Entry, quiet: bool = False, report=None) -> Installed:
    """Download `entry` into the store (resuming, verifying) and write its manifest.
    `report(status)` (Ollama's /api/pull records: {"status"}, and while the file comes
    {"status", "digest", "total", "completed"}) is called besides the progress bar."""
    say = _say(quiet, report)
    say("pulling manifest")
    remote = remote_file(entry)
    expected = entry.sha256 or remote.sha256
    if entry.sha256 and remote.sha256 and remote.sha256 != entry.sha256:
        raise TightKVError(
            f"{entry.repo}/{entry.file} on the hub has sha256 {remote.sha256}, but {entry.name} "
            f"is pinned to {entry.sha256}; the repo changed, refusing to pull it"
        )
    label = f"pulling {(expected or remote.etag)[:12]}"
    key = expected or f"etag-{re.sub(r'[^0-9a-zA-Z]', '', remote.etag)[:64]}"
    partial = blobs_dir() / f"sha256-{key}-partial"
    with file_lock(blobs_dir() / f".sha256-{key}.lock"):
        done = installed(entry)
        if done is not None and done.digest == expected:
            _finished_bar(label, done.size, quiet)
            say("success")
            return done
        if expected and _complete_blob(blob_path(expected), remote.size):
            _finished_bar(label, remote.size, quiet)
            digest, size = expected, remote.size
        else:
            digest_id = f"sha256:{expected}" if expected else remote.etag
            _download(
                remote,
                partial,
                label,
                quiet,
                None
                if report is None
                else lambda done: report(
                    {"status": label, "digest": digest_id, "total": remote.size, "completed": done}
                ),
            )
            say("verifying sha256 digest")
            digest = file_sha256(partial)
            if expected and digest != expected:
                partial.unlink(missing_ok=True)
                raise TightKVError(
                    f"sha256 mismatch for {entry.name} ({entry.repo}/{entry.file}): expected "
                    f"{expected}, got {digest}; the download was deleted, run the pull again"
                )
            size = partial.stat().st_size
            os.replace(partial, blob_path(digest))
        say("writing manifest")
        result = write_manifest(entry, digest, size, revision=remote.commit)
    say("success")
    return result


def _complete_blob(path: Path, size: int | None) -> bool:
    try:
        return path.is_file() and (size is None or path.stat().st_size == size)
    except OSError:
        return False


def _download(remote: RemoteFile, partial: Path, label: str, quiet: bool, progress=None) -> None:
    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and have > remote.size:  # not a prefix of this file: start over
        partial.unlink()
        have = 0
    if remote.size is not None:
        check_disk_space(remote.size - have, partial.parent)
    headers = build_hf_headers()
    if _origin(remote.url) != _origin(endpoint()):
        headers.pop("authorization", None)  # never send a token to the CDN
    bar = ProgressBar(label, total=remote.size, initial=have, quiet=quiet)
    kwargs = {"resume_size": have, "headers": headers, "expected_size": remote.size}
    if "tqdm_class" in inspect.signature(http_get).parameters:
        kwargs["tqdm_class"] = bar.attach
    else:
        kwargs["_tqdm_bar"] = bar.attach(total=remote.size, initial=have)
    old_chunk = constants.DOWNLOAD_CHUNK_SIZE
    constants.DOWNLOAD_CHUNK_SIZE = CHUNK
    try:
        with open(partial, "r+b" if have else "wb") as f:
            f.seek(have)
            with _hub_errors(None, remote.url):
                http_get(remote.url, _Flushing(f, progress), **kwargs)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise TightKVError(
                f"no space left on device in {partial.parent} after {human_bytes(_size(partial))}; "
                "free some space and pull again to resume"
            ) from None
        if err.errno is None and "Consistency check failed" in str(err):
            partial.unlink(missing_ok=True)
            raise TightKVError(
                f"download of {remote.url} ended at the wrong size; the partial file was deleted, pull again"
            ) from None
        raise TightKVError(f"{partial}: {err.strerror or err}") from None
    finally:
        constants.DOWNLOAD_CHUNK_SIZE = old_chunk
        bar.close()


class _Flushing:
    """The partial file, flushed after every write so a killed pull leaves every
    received byte on disk for the next one to resume from."""

    def __init__(self, f: IO[bytes], progress=None):
        self.f, self.progress = f, progress  # progress(bytes in the file so far)

    def write(self, data: bytes) -> int:
        n = self.f.write(data)
        self.f.flush()
        if self.progress is not None:
            self.progress(self.f.tell())
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_disk_space(needed: int, where: Path) -> None:
    """A one-line error when `where` has less than `needed` bytes free."""
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if needed > free:
        raise TightKVError(
            f"not enough disk space in {where}: the download needs {human_bytes(needed)}, {human_bytes(free)} free"
        )


class _hub_errors:
    """Turn huggingface_hub and network errors into one-line `TightKVError`s."""

    def __init__(self, entry: Entry | None, url: str):
        self.entry, self.url = entry, url

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, (TightKVError, KeyboardInterrupt)):
            return False
        from huggingface_hub import errors as hf

        what = f"{self.entry.repo}/{self.entry.file}" if self.entry else self.url
        name = f"{self.entry.name}: " if self.entry else ""
        if isinstance(err, hf.GatedRepoError):
            msg = f"{name}{self.entry.repo if self.entry else what} is gated; accept its license on the hub and set HF_TOKEN"
        elif isinstance(err, hf.RepositoryNotFoundError):
            msg = f"{name}repository {self.entry.repo if self.entry else what} not found on {endpoint()} ({self.url})"
        elif isinstance(err, hf.RevisionNotFoundError):
            msg = f"{name}revision not found ({self.url})"
        elif isinstance(
            err, tuple(getattr(hf, n) for n in ("RemoteEntryNotFoundError", "EntryNotFoundError") if hasattr(hf, n))
        ):
            msg = f"{name}file {what} not found on {endpoint()} (404 for {self.url}); the registry entry is wrong"
        elif isinstance(err, hf.OfflineModeIsEnabled):
            msg = f"{name}cannot pull: HF_HUB_OFFLINE is set"
        elif isinstance(err, hf.HfHubHTTPError):
            status = getattr(getattr(err, "response", None), "status_code", "?")
            msg = f"{name}the hub answered HTTP {status} for {self.url}"
        elif _is_network_error(err):
            msg = (
                f"{name}cannot reach {_origin(self.url)} ({type(err).__name__}: {_first_line(err)}); "
                "check the network or HF_ENDPOINT, then pull again to resume"
            )
        else:
            return False
        raise TightKVError(msg) from None


def _is_network_error(err: BaseException) -> bool:
    try:
        import httpx2 as httpx
    except ImportError:  # older huggingface_hub
        try:
            import httpx
        except ImportError:
            httpx = None
    kinds: tuple = (ConnectionError, TimeoutError)
    if httpx is not None:
        kinds += (httpx.TransportError,)
    try:
        import requests

        kinds += (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
    except ImportError:
        pass
    return isinstance(err, kinds)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _say(quiet: bool, report=None):
    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)
        if report is not None:
            report({"status": message})

    return say


# --- progress ------------------------------------------------------------------
def human_bytes(n: float) -> str:
    """Ollama's HumanBytes: decimal units, '586 MB', '1.7 GB', '12 B'."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            value = n / size
            if value >= 10 or value == int(value):
                return f"{int(value)} {unit}"
            return f"{value:.1f} {unit}"
    return f"{int(n)} B"


def human_binary_bytes(n: float) -> str:
    """Binary units, as `plan` prints them: '241.0 MiB', '1.71 GiB', '12 B'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit in ("TiB", "GiB") else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_duration(seconds: float) -> str:
    """Go's Duration rounded to seconds: '3m56s', '1h2m3s', '45s'."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


class ProgressBar:
    """A byte-count progress bar on stderr, drawn like Ollama's:
    ``pulling 3f2c1a9b8d7e:  35% ▕███     ▏ 586 MB/1.7 GB  4.6 MB/s  3m56s``.

    On a terminal it redraws one line; otherwise it prints a line every 10% (or
    5 s) and at the end. `attach` has tqdm's constructor signature, so it can be
    handed to huggingface_hub as its ``tqdm_class``.
    """

    WIDTH = 25

    def __init__(
        self, label: str, total: int | None = None, initial: int = 0, quiet: bool = False, stream: IO[str] | None = None
    ):
        self.label, self.total, self.n = label, total, initial
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.samples: deque = deque([(self.start, initial)])
        self.last_draw = 0.0
        self.last_decile = -1
        self.drawn = False
        self.closed = False
        self.instant = False  # a file already in the store: no speed to show

    def attach(self, total: int | None = None, initial: int = 0, **_) -> "ProgressBar":
        if total is not None:
            self.total = total
        self.n = initial
        self.samples = deque([(time.monotonic(), initial)])
        self.draw(force=True)
        return self

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        pass  # huggingface_hub closes it per attempt; `close` ends the line once

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        self.samples.append((now, self.n))
        while len(self.samples) > 2 and now - self.samples[0][0] > 10:
            self.samples.popleft()
        self.draw()

    def update_transfer(self, n: int) -> None:  # huggingface_hub calls this when present
        pass

    def rate(self) -> float:
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def line(self) -> str:
        total = self.total
        if not total:
            return f"{self.label}: {human_bytes(self.n)}  {human_bytes(self.rate())}/s"
        frac = min(1.0, self.n / total)
        fill = int(frac * self.WIDTH)
        bar = "▕" + "█" * fill + " " * (self.WIDTH - fill) + "▏"
        if self.instant:
            return f"{self.label}: {int(frac * 100):3d}% {bar} {human_bytes(total)}"
        rate = self.rate()
        done = self.n >= total
        if done:
            elapsed = time.monotonic() - self.start
            rate = rate or (self.n / elapsed if elapsed > 0 else 0.0)
        eta = human_duration((total - self.n) / rate) if rate > 0 else "?"
        return (
            f"{self.label}: {int(frac * 100):3d}% {bar} {human_bytes(self.n)}/{human_bytes(total)}  "
            f"{human_bytes(rate)}/s  {eta}"
        )

    def draw(self, force: bool = False) -> None:
        if self.quiet or self.closed:
            return
        now = time.monotonic()
        if self.tty:
            if force or now - self.last_draw >= 0.1:
                self.stream.write("\r" + self.line() + "\x1b[K")
                self.stream.flush()
                self.last_draw, self.drawn = now, True
            return
        decile = int(10 * self.n / self.total) if self.total else 0
        if force or decile > self.last_decile or now - self.last_draw >= 5:
            if self.total and self.n >= self.total and not force:
                return  # the final line comes from close()
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self.last_draw, self.last_decile, self.drawn = now, decile, True

    def close(self) -> None:
        if self.quiet or self.closed:
            return
        if self.tty:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
        self.closed = True


def _finished_bar(label: str, size: int | None, quiet: bool) -> None:
    """The bar of a file that is already in the store: 100% at once."""
    bar = ProgressBar(label, total=size or 0, initial=size or 0, quiet=quiet)
    bar.instant = True
    bar.close()
