"""The documents the server has open, behind the `/v1/documents` routes (`documents`).

Each document is a `documents.session.DocumentSession` over the served model, made
and used only inside scheduler `Task`s, so the worker thread is still the only one
that runs the model, and a long load takes turns with the running chat streams
(the session's `listen` events pause the task after each prefill chunk and token).

The texts are kept in the store's library (`documents.library`) and the KV caches in
the document store, the same ones `tightkv ask` uses: a document added here is warm
for `tightkv ask --doc` on the same file (same model and KV type), and the other
way round. At most `OPEN_LIMIT` sessions stay in RAM; an older one is closed and
opens again from the disk store.

Progress and answers reach the HTTP side as event dicts (`follow`, `ask`), posted
onto the event loop from the worker:

    {"type": "status", "status": "queued" | "loading", ...}
    {"type": "progress", "done", "total", "rate", "eta_s", "elapsed_s"}
    {"type": "loaded", "document": {...}}          # tokens, kv, kv_bytes, mode, warm, source
    {"type": "read", "read", "kind", "sections"}   # RLV starts a read
    {"type": "delta", "text"}                      # a piece of the answer
    {"type": "answer", ...}                        # the answer, its mode and quoted spans
    {"type": "error", "error": {...}, "status"}    # OpenAI's error object and HTTP status
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..documents import prompts
from ..documents.library import DocumentLibrary, doc_id
from ..kv.saved import CacheStore
from ..documents.text import DocumentText
from ..errors import ContextOverflowError
from .http import ApiError, as_api_error
from .scheduler import Task

log = logging.getLogger("tightkv.server")

OPEN_LIMIT = 4  # sessions kept in RAM (their KV caches); older ones reopen from the disk store
MODES = ("auto", "full", "rlv")
END = {"loaded", "error", "answer"}  # the events that end a stream (followers are let go)


@dataclass
class OpenDocument:
    """One document's state on this server."""

    id: str
    doc: DocumentText
    mode: str = "auto"
    status: str = "stored"  # stored -> queued -> loading -> loaded | failed
    session: Any = None  # its DocumentSession, once loaded
    info: dict = field(default_factory=dict)  # what `loaded` says
    error: dict | None = None  # what `error` says
    progress: dict | None = None  # the last `progress` event
    followers: list[Callable[[dict], None]] = field(default_factory=list)
    used: float = 0.0

    @property
    def name(self) -> str:
        return ", ".join(self.doc.names)

    def record(self) -> dict:
        """What the routes show of it."""
        out = {
            "id": self.id,
            "object": "document",
            "name": self.name,
            "chars": len(self.doc.text),
            "status": self.status,
            "mode": self.mode,
            **self.info,
        }
        if self.progress and self.status in ("queued", "loading"):
            out["progress"] = self.progress
        if self.error:
            out["error"] = self.error["error"]
        return out


class Shelf:
    """The open documents: add, open, follow a load, ask (queued as scheduler tasks)."""

    def __init__(self, scheduler, store: CacheStore | None = None, library: DocumentLibrary | None = None):
        self.scheduler = scheduler
        self.store = store or CacheStore()
        self.library = library or DocumentLibrary(self.store.root / "texts")
        self.docs: dict[str, OpenDocument] = {}
        self.lock = threading.Lock()

    # --- event-loop side -----------------------------------------------------------------
    def add(self, doc: DocumentText, mode: str = "auto") -> OpenDocument:
        """Keep a new document's text and load it (raises `Unavailable` when the queue is full)."""
        self.library.keep(doc)
        return self.open(doc_id(doc), mode, doc)

    def get(self, ident: str) -> OpenDocument | None:
        """An open document, or one of the library's (not loaded yet), or None."""
        with self.lock:
            entry = self.docs.get(ident)
        if entry is not None:
            return entry
        doc = self.library.get(ident)
        if doc is None:
            return None
        with self.lock:
            return self.docs.setdefault(ident, OpenDocument(ident, doc))

    def open(self, ident: str, mode: str | None = None, doc: DocumentText | None = None) -> OpenDocument:
        """Load a document unless it is loaded or loading in that mode already."""
        entry = self.get(ident) if doc is None else self._entry(ident, doc)
        if entry is None:
            raise ApiError(
                404, f"no document '{ident}' (see GET /v1/documents)", "not_found_error", code="document_not_found"
            )
        with self.lock:
            same = mode is None or mode == entry.mode
            if same and entry.status in ("queued", "loading"):
                return entry
            if same and entry.status == "loaded" and entry.session is not None:
                entry.info = {**entry.info, "warm": True, "source": "ram"}
                return entry
            entry.mode = mode or entry.mode
            previous = entry.status, entry.error, entry.progress
            entry.status, entry.error, entry.progress = "queued", None, None
        try:
            self.scheduler.submit_task(
                Task(lambda model, pause: self._load(entry, model, pause), lambda err: self._failed(entry, err))
            )
        except Exception:
            with self.lock:
                entry.status, entry.error, entry.progress = previous
            raise
        return entry

    def _entry(self, ident: str, doc: DocumentText) -> OpenDocument:
        with self.lock:
            return self.docs.setdefault(ident, OpenDocument(ident, doc))

    def follow(self, entry: OpenDocument) -> tuple[asyncio.Queue, Callable[[], None]]:
        """A queue of the document's load events from now on (its state first); and the
        function that stops following."""
        queue: asyncio.Queue = asyncio.Queue()
        post = self._poster(queue)
        with self.lock:
            queue.put_nowait(self._state_event(entry))
            if entry.status in ("queued", "loading"):
                entry.followers.append(post)

        def stop() -> None:
            with self.lock:
                if post in entry.followers:
                    entry.followers.remove(post)

        return queue, stop

    def ask(self, entry: OpenDocument, question: str, mode: str | None, max_tokens: int) -> tuple[asyncio.Queue, Task]:
        """Queue a question; its events (progress if it must load first, reads, deltas,
        then the answer or an error) come on the returned queue."""
        queue: asyncio.Queue = asyncio.Queue()
        post = self._poster(queue)
        task = Task(
            lambda model, pause: self._ask(entry, question, mode, max_tokens, model, pause, post),
            lambda err: post(error_event(err)),
        )
        self.scheduler.submit_task(task)
        return queue, task

    def listing(self, model_path: str, kv: str) -> list[dict]:
        """Every document of the library, newest first, with its state here and whether
        the store holds its KV cache for this model and KV type (`cached`: it opens warm)."""
        caches = {
            r.get("doc_sha256"): r
            for r in self.store.entries()
            if r.get("kind") == "document" and r.get("model") == model_path and r.get("kv") == kv
        }
        rows = []
        for meta in self.library.entries():
            with self.lock:
                entry = self.docs.get(meta["id"])
            row = (
                entry.record()
                if entry is not None
                else {
                    "id": meta["id"],
                    "object": "document",
                    "name": meta["name"],
                    "chars": meta["chars"],
                    "status": "stored",
                }
            )
            cache = caches.get(meta["sha256"])
            row.update(added=meta["added"], cached=cache is not None)
            if cache is not None:
                row.setdefault("tokens", cache["tokens"])
                row.setdefault("kv", cache["kv"])
                row.setdefault("kv_bytes", cache["kv_bytes"])
            rows.append(row)
        return rows

    def _poster(self, queue: asyncio.Queue) -> Callable[[dict], None]:
        loop = asyncio.get_running_loop()

        def post(event: dict) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the loop is gone (shutdown)
                pass

        return post

    def _state_event(self, entry: OpenDocument) -> dict:
        if entry.status == "loaded":
            return {"type": "loaded", "document": entry.record()}
        if entry.status == "failed" and entry.error:
            return entry.error
        return {"type": "status", **entry.record()}

    # --- worker side -----------------------------------------------------------------------
    def _tell(self, entry: OpenDocument, event: dict, also: Callable[[dict], None] | None = None) -> None:
        with self.lock:
            followers = list(entry.followers)
            if event["type"] in END:
                entry.followers.clear()
        for post in followers:
            post(event)
        if also is not None:
            also(event)

    def _load(
        self, entry: OpenDocument, model, pause: Callable[[], None], also: Callable[[dict], None] | None = None
    ) -> None:
        """Open the document's session (warm from RAM or the disk store, else prefilled)."""
        if entry.session is not None and entry.session.model is model and entry.status == "loaded":
            entry.info = {**entry.info, "warm": True, "source": "ram"}
            self._tell(entry, {"type": "loaded", "document": entry.record()}, also)
            return
        from ..documents.session import DocumentSession

        with self.lock:
            entry.status, entry.session = "loading", None
        self._tell(entry, {"type": "status", **entry.record()}, also)
        if entry.mode == "full":
            self._check_fits(entry, model)
        clock = {"t0": time.perf_counter(), "done0": None}

        def listen(event: dict) -> None:
            if event["type"] == "prefill":
                entry.progress = _progress(event, clock)
                self._tell(entry, {"type": "progress", **entry.progress}, also)
            pause()

        t0 = time.perf_counter()
        session = DocumentSession(
            model,
            entry.doc,
            kv=str(model.kv),
            mode=entry.mode,
            store=self.store,
            progress=False,
            notice=log.warning,
            listen=listen,
            keep_text=True,
        )
        session.listen = lambda event: None
        info = _loaded_info(session, entry.mode, time.perf_counter() - t0)
        with self.lock:
            entry.session, entry.info, entry.status, entry.used = session, info, "loaded", time.monotonic()
            entry.progress = None
        self._close_oldest()
        self._tell(entry, {"type": "loaded", "document": entry.record()}, also)

    def _check_fits(self, entry: OpenDocument, model) -> None:
        """Full mode on a document the context cannot hold: the clear error, before any prefill."""
        tokens = len(model.tokenize(prompts.document_prefix(entry.doc.text), add_bos=True))
        if tokens + prompts.ANSWER_TOKENS + 64 > model.context_length:
            raise ContextOverflowError(
                f"{entry.name} is {tokens:,} tokens, more than full mode can hold in the context of "
                f"{model.context_length:,} tokens: choose auto or RLV mode (RLV reads it a few sections at a "
                "time), or start the server with a larger --ctx",
                tokens,
                model.context_length,
            )

    def close_all(self) -> None:
        """Drop every session (the model was unloaded: they would keep it in RAM)."""
        with self.lock:
            for e in self.docs.values():
                if e.session is not None:
                    e.session, e.status = None, "stored"

    def _close_oldest(self) -> None:
        """Keep at most OPEN_LIMIT sessions in RAM (the oldest used goes; it reopens from disk)."""
        with self.lock:
            loaded = sorted((e for e in self.docs.values() if e.session is not None), key=lambda e: e.used)
            for e in loaded[: max(0, len(loaded) - OPEN_LIMIT)]:
                e.session, e.status = None, "stored"

    def _failed(self, entry: OpenDocument, err: BaseException) -> None:
        event = error_event(err)
        with self.lock:
            entry.status, entry.error, entry.progress, entry.session = "failed", event, None, None
        self._tell(entry, event)

    def _ask(
        self,
        entry: OpenDocument,
        question: str,
        mode: str | None,
        max_tokens: int,
        model,
        pause: Callable[[], None],
        post: Callable[[dict], None],
    ) -> None:
        """Answer one question (opening the document first if it is not open), streaming
        its reads and text through `post`."""
        if entry.session is None or entry.session.model is not model or entry.status != "loaded":
            try:
                self._load(entry, model, pause, also=post)
            except Exception as err:
                self._failed(entry, err)
                raise
        session = entry.session
        entry.used = time.monotonic()

        def listen(event: dict) -> None:
            if event["type"] == "text":
                post({"type": "delta", "text": event["text"]})
            elif event["type"] == "read":
                post(event)
            pause()

        session.listen = listen
        try:
            answer = session.ask(question, mode=mode, max_tokens=max_tokens)
        finally:
            session.listen = lambda event: None
        spans = [_trimmed(entry.doc.text, a, b) for a, b in answer.quotes]
        post(
            {
                "type": "answer",
                "document": entry.id,
                "question": question,
                "answer": answer.text,
                "mode": answer.mode,
                "citation": answer.citation,
                "verified": answer.verified,
                "quotes": [{"start": a, "end": b, "text": entry.doc.text[a:b]} for a, b in spans],
                "ttft_s": round(answer.ttft, 3),
                "seconds": round(answer.seconds, 3),
                "prompt_tokens": answer.prompt_tokens,
            }
        )


def _loaded_info(session, asked: str, seconds: float) -> dict:
    """What a `loaded` event says of a session: its size, mode, KV cache, and where it came from."""
    return {
        "tokens": session.doc_tokens,
        "mode": session.mode,
        "kv": str(session.kv),
        "kv_bytes": session.kv_bytes,
        "working_memory": session.wm,
        "context": session.model.context_length,
        "source": session.cache_source or ("reads" if session.mode == "rlv" else ""),
        "warm": session.cache_source == "disk",
        "seconds": round(seconds, 3),
        "mode_line": session.mode_line(asked),
    }


def _progress(event: dict, clock: dict) -> dict:
    """A prefill event with its rate and time left (over the tokens prefilled so far)."""
    done, total = event["done"], event["total"]
    now = time.perf_counter()
    if clock["done0"] is None or done < clock["done0"]:  # a new prefill (another RLV read)
        clock["t0"], clock["done0"] = now, done
    elapsed = now - clock["t0"]
    ran = done - clock["done0"]
    rate = ran / elapsed if elapsed > 0 and ran > 0 else None
    eta = (total - done) / rate if rate else None
    return {
        "done": done,
        "total": total,
        "rate": round(rate, 1) if rate else None,
        "eta_s": round(eta, 1) if eta is not None else None,
        "elapsed_s": round(elapsed, 2),
    }


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A span without the white space around it (a sentence's span runs to the next one)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def error_event(err: BaseException) -> dict:
    """An `error` event: OpenAI's error object and the HTTP status it would have had."""
    api = err if isinstance(err, ApiError) else as_api_error(err)
    return {"type": "error", "status": api.status, "error": api.body("/v1/documents")["error"]}
