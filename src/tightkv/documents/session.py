"""`DocumentSession` is what `Model.load_document` returns: the document, its
gist index, the cache (loaded from disk when the store has it), and `ask`, in
full, RAG or RLV mode (`reading` has what the modes share).
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from ..errors import TightKVError
from ..kv.spec import resolve_kv
from . import prompts
from .evidence import QUOTES, SentenceIndex, quotes_block
from ..progress import Progress
from .reading import Answer, PrefixCache
from .text import DocumentText, Section, first_sentence, read_documents, split_sections, support

MODES = ("full", "rag", "rlv", "auto")


class DocumentSession:
    """Questions about one document (or several joined), in full, rag, rlv or auto mode.

    Made by `Model.load_document`. In full mode the document is prefilled into the
    KV cache once (or loaded from the on-disk document cache), and every question
    after it costs only its own tokens.

    `listen(event)`, if given, is told what happens as it happens (the web page's
    stream): `{"type": "prefill", "done", "total"}` while a document or an RLV read
    is prefilled, `{"type": "read", "read", "kind", "sections"}` when RLV starts a
    read, `{"type": "text", "text"}` for each generated piece of an answer.
    `keep_text` keeps the document's text in the store's library (`library`), so
    that it can be listed and opened again by its id.
    """

    def __init__(
        self,
        model,
        sources,
        *,
        kv: str | None = None,
        mode: str = "auto",
        store=True,
        progress: bool = True,
        log: Callable[[str], None] | None = None,
        section_tokens: int | None = None,
        rag_chunk_tokens: int = 200,
        rag_top_k: int = 3,
        quotes: int = QUOTES,
        rlv_options: dict | None = None,
        notice: Callable[[str], None] | None = None,
        listen: Callable[[dict], None] | None = None,
        keep_text: bool = False,
    ):
        from .memory import working_memory
        from ..kv.saved import CacheStore

        if mode not in MODES:
            raise TightKVError(f"unknown mode '{mode}' (valid: {', '.join(MODES)})")
        self.model = model
        if isinstance(sources, DocumentText):
            self.doc = sources
        else:
            self.doc = read_documents(
                [sources] if isinstance(sources, str) or not hasattr(sources, "__iter__") else list(sources)
            )
        self.kv = resolve_kv(kv)  # the default (or $TIGHTKV_KV_CACHE_TYPE), whatever the model's cache
        self.progress = progress
        self.log = log or (lambda s: None)
        self.notice = notice or (lambda s: print(s, file=sys.stderr))
        self.store = CacheStore() if store is True else (store or None)
        self.listen = listen or (lambda event: None)
        if keep_text and self.store is not None:
            from .library import DocumentLibrary

            DocumentLibrary(self.store.root / "texts").keep(self.doc)
        self.timings: dict[str, float] = {}
        self.wm, self.wm_source = working_memory(model)
        self.section_tokens = section_tokens or max(96, min(384, self.wm // 4))
        self.rag_chunk_tokens, self.rag_top_k = rag_chunk_tokens, rag_top_k
        self.quotes = quotes
        self.rlv_options = rlv_options or {}
        self._evidence: SentenceIndex | None = None
        t = time.perf_counter()
        self.prefix = model.tokenize(prompts.document_prefix(self.doc.text), add_bos=True)
        self.doc_tokens = len(self.prefix)
        self.timings["tokenize_s"] = time.perf_counter() - t
        self._sections: list[Section] | None = None
        self._rag = None
        self._rlv = None
        self._prefixes = None
        self.pc: PrefixCache | None = None
        self.cache_source = ""  # "disk", "prefill" or ""
        self.mode = self.resolve_mode(mode)
        self.log(
            f"document: {self.doc_tokens} tokens ({', '.join(self.doc.names)}); working memory "
            f"{self.wm} tokens ({self.wm_source}); mode {mode} -> {self.mode}"
        )
        if self.mode == "full":
            self.load()

    # --- modes ----------------------------------------------------------------------
    def resolve_mode(self, mode: str) -> str:
        """auto: full when the document fits inside the model's measured working
        memory (and the context), else rlv."""
        if mode != "auto":
            return mode
        fits = self.doc_tokens + prompts.ANSWER_TOKENS + 64 <= min(self.wm, self.model.context_length)
        return "full" if fits else "rlv"

    def mode_line(self, asked: str) -> str:
        """One line for stderr: the mode that answers, and why when `auto` chose it."""
        size = f"the document is {self.doc_tokens:,} tokens"
        if asked != "auto":
            return f"mode: {self.mode} ({size})"
        if self.mode == "full":
            return f"mode: full (auto: {size}, within the model's working memory of {self.wm:,})"
        return f"mode: rlv (auto: {size}, past the model's working memory of {self.wm:,}; --mode full reads it whole)"

    @property
    def sections(self) -> list[Section]:
        """The gist index (RLV's sections; also used to cite full-mode answers)."""
        if self._sections is None:
            count = lambda s: len(self.model.tokenize(s, add_bos=False))  # noqa: E731
            secs = []
            # several documents: split each on its own, so a section never spans two, and name it in the title
            for k, start in enumerate(self.doc.starts):
                end = self.doc.starts[k + 1] if k + 1 < len(self.doc.starts) else len(self.doc.text)
                for s in split_sections(self.doc.text[start:end], self.section_tokens, count):
                    s.index, s.start, s.end = len(secs), s.start + start, s.end + start
                    if len(self.doc.starts) > 1:
                        head = f"Document {k + 1}: {self.doc.names[k]}"
                        title = s.title[len(head) :].strip() if s.title.startswith(head) else s.title
                        s.title = f"{self.doc.names[k]}: {title}" if title else self.doc.names[k]
                    secs.append(s)
            self._sections = secs
        return self._sections

    @property
    def evidence(self) -> SentenceIndex:
        """The document's sentences, indexed for quoting (full mode and RLV reads)."""
        if self._evidence is None:
            self._evidence = SentenceIndex(self.doc.text)
        return self._evidence

    # --- full mode: the document in the cache ------------------------------------------
    def load(self) -> PrefixCache:
        """The document's prefix cache: from the disk store when it holds a valid copy,
        else prefilled (with a progress bar) and saved."""
        if self.pc is not None and self.pc.filled:
            return self.pc
        t = time.perf_counter()
        cache = None
        if self.store is not None:
            cache = self.store.load(self.model, self.doc, self.kv, self.prefix, notice=self.notice)
        if cache is not None:
            self.pc = PrefixCache(self.model, self.prefix, self.kv, cache)
            self.cache_source = "disk"
            self.timings["load_s"] = time.perf_counter() - t
            self.log(
                f"cache: loaded {self.store.path_for(self.model, self.doc, self.kv, self.prefix).name} "
                f"({self.pc.nbytes / 1e6:.1f} MB KV) in {self.timings['load_s']:.2f}s"
            )
        else:
            self.pc = PrefixCache(self.model, self.prefix, self.kv)
            self.listen({"type": "prefill", "done": 0, "total": len(self.prefix)})
            with Progress("prefill document", len(self.prefix), enabled=self.progress) as bar:  # summary if it ran
                self.pc.fill(lambda done, total: self._prefilled(bar, done, total))
            self.cache_source = "prefill"
            self.timings["prefill_s"] = self.pc.prefill_seconds
            self.log(
                f"cache: prefilled {len(self.prefix)} tokens in {self.pc.prefill_seconds:.1f}s "
                f"({self.pc.nbytes / 1e6:.1f} MB KV, kv {self.kv})"
            )
            if self.store is not None:
                ts = time.perf_counter()
                path = self.store.save(self.model, self.doc, self.kv, self.prefix, self.pc.cache)
                self.timings["save_s"] = time.perf_counter() - ts
                self.log(f"cache: saved {path} ({path.stat().st_size / 1e6:.1f} MB) in {self.timings['save_s']:.2f}s")
        self.timings["document_s"] = time.perf_counter() - t
        ts = time.perf_counter()
        self.pc.snapshot()
        self.timings["snapshot_s"] = time.perf_counter() - ts
        self.log(
            f"snapshot: {self.pc.snapshot_bytes / 1e6:.1f} MB of non-trimmable layer state "
            f"in {self.timings['snapshot_s'] * 1e3:.1f} ms"
        )
        return self.pc

    def _prefilled(self, bar: Progress, done: int, total: int) -> None:
        bar.advance_to(done)
        self.listen({"type": "prefill", "done": done, "total": total})

    def _text(self, piece: str) -> None:
        self.listen({"type": "text", "text": piece})

    def ask_full(self, question: str, max_tokens: int = prompts.ANSWER_TOKENS) -> Answer:
        t0 = time.perf_counter()
        fresh = self.pc is None or not self.pc.filled
        pc = self.load()
        asked = prompts.question_suffix(question)
        quotes = self.quotes_for(question, len(self.model.tokenize(asked, add_bos=False)) + max_tokens)
        suffix = self.model.tokenize(quotes_block(quotes) + asked, add_bos=False)
        reply = pc.generate(suffix, max_tokens=max_tokens, on_text=self._text)
        text = first_sentence(reply.text)
        sec = self.cite(text)
        ttft = (time.perf_counter() - t0 - reply.seconds + reply.ttft) if fresh else reply.ttft
        self.log(
            f"full: {len(suffix)} question tokens ({len(quotes)} quoted sentences) after {len(self.prefix)} "
            f"cached; restore {pc.restore_seconds * 1e3:.1f} ms; smallest answer-token margin {reply.min_margin}"
        )
        return Answer(
            text,
            "full",
            sec.label + " " + sec.title if sec else "",
            sec.index if sec else None,
            ttft=ttft,
            seconds=time.perf_counter() - t0,
            prompt_tokens=len(self.prefix) + len(suffix),
            min_margin=reply.min_margin,
            stages=[{"stage": "quotes", "sentences": [[q.start, q.end] for q in quotes]}],
            quotes=sorted((q.start, q.end) for q in quotes),
        )

    def quotes_for(self, question: str, reserve: int) -> list[Section]:
        """Full mode's quoted evidence for a question: the best-matching sentences
        (`self.quotes` at most) that fit the context beside the document and `reserve`."""
        if self.quotes <= 0:
            return []
        room = self.model.context_length - len(self.prefix) - reserve - 8
        quotes = self.evidence.quote(question, self.quotes, room, self.model)
        for q in sorted(quotes, key=lambda q: q.start):
            self.log(f"quote [{q.start}:{q.end}] {q.text[:100]}")
        return quotes

    def cite(self, answer: str) -> Section | None:
        """The section that best supports an answer (its words, then its rarest words)."""
        if not answer:
            return None
        best = max(self.sections, key=lambda s: (support(answer, s.text), -s.index), default=None)
        return best if best is not None and support(answer, best.text) > 0 else None

    # --- questions ----------------------------------------------------------------
    def ask(self, question: str, mode: str | None = None, **kwargs) -> Answer:
        """Answer one question about the document; mode overrides the session's."""
        if not question or not question.strip():
            raise TightKVError("empty question")
        mode = self.resolve_mode(mode) if mode else self.mode
        if mode == "full":
            return self.ask_full(question, **kwargs)
        if mode == "rag":
            if self._rag is None:
                from .rag import RagIndex

                self._rag = RagIndex(
                    self.model,
                    self.doc,
                    kv=self.kv,
                    chunk_tokens=self.rag_chunk_tokens,
                    top_k=self.rag_top_k,
                    log=self.log,
                )
            return self._rag.ask(question, **kwargs)
        if mode == "rlv":
            if self._rlv is None:
                from .rlv import RLV

                self._rlv = RLV(
                    self.model,
                    self.sections,
                    kv=self.kv,
                    working_memory=self.wm,
                    log=self.log,
                    evidence=self.evidence if self.quotes > 0 else None,
                    quotes=self.quotes,
                    prefixes=self.prefixes,
                    progress=self.progress,
                    listen=lambda event: self.listen(event),
                    **self.rlv_options,
                )
            return self._rlv.ask(question, **kwargs)
        raise TightKVError(f"unknown mode '{mode}'")

    @property
    def prefixes(self):
        """The store of RLV reads already prefilled: RAM, over the disk store."""
        if self._prefixes is None:
            from ..engine.prefixes import PrefixStore

            self._prefixes = PrefixStore(
                self.model, self.kv, disk=self.store, doc=self.doc, kind="rlv read", notice=self.notice
            )
        return self._prefixes

    @property
    def kv_bytes(self) -> int:
        return self.pc.nbytes if self.pc is not None else 0
