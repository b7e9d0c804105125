"""A prefix prefilled once into a KV cache, then many suffixes asked after it.

`PrefixCache` holds a per-layer cache filled with a token prefix (a document).
Each question is appended after the prefix and rolled back afterwards, so the
next question costs no document prefill. Rolling back is exact:

- a global dense layer is trimmed (it keeps every token);
- any other layer (a sliding-window ring that dropped old tokens, a compressed
  layer whose exact recent window moved into the body) is restored from a
  snapshot taken once after the prefix: its `state()`, plus the little Python
  state `state()` leaves out. `snapshot_bytes` and the restore time say what
  this costs.

`DocumentSession` is what `Model.load_document` returns: the document, its
gist index, the cache (loaded from disk when the store has it), and `ask`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import ContextOverflowError, TightKVError
from . import prompts
from .evidence import QUOTES, SentenceIndex, quotes_block
from .text import DocumentText, Section, first_sentence, read_documents, split_sections, support

MODES = ("full", "rag", "rlv", "auto")
DOC_KV_DEFAULT = "progressive"  # whole documents go into the compressed cache by default


@dataclass
class Answer:
    """An answer with where it came from and what it cost.

    Attributes:
        text: the answer (one line).
        mode: full, rag or rlv.
        citation: the section label and title it came from (e.g. "§3 Operations").
        verified: RLV: whether the model judged the read passage to state it.
        ttft: seconds to the first answer token, from `ask` (plus the document's
            prefill or disk load when this question triggered it).
        seconds: total seconds for the question.
        min_margin: the smallest logit gap between a chosen answer token and the
            runner-up (`AnswerStart`): how close the greedy answer came to another.
        stages: per-stage records (RLV), for --verbose and JSON.
    """

    text: str
    mode: str
    citation: str = ""
    section: int | None = None
    verified: bool | None = None
    ttft: float = 0.0
    seconds: float = 0.0
    prompt_tokens: int = 0
    min_margin: float | None = None
    stages: list[dict] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text

    def as_dict(self) -> dict:
        return {"answer": self.text, "mode": self.mode, "citation": self.citation, "section": self.section,
                "verified": self.verified, "ttft_s": round(self.ttft, 4), "seconds": round(self.seconds, 4),
                "prompt_tokens": self.prompt_tokens, "min_margin": self.min_margin, "stages": self.stages}


class PrefixCache:
    """A KV cache holding `prefix` (token ids), reusable for any number of suffixes."""

    def __init__(self, model, prefix: list[int], kv: str | None = None, cache: list | None = None):
        self.model = model
        self.prefix = list(prefix)
        self.kv = kv or model.kv
        self.cache = cache if cache is not None else model.new_cache(self.kv)
        self._snap: list | None = None
        self.snapshot_bytes = 0
        self.restore_seconds = 0.0  # the last restore
        self.prefill_seconds = 0.0

    @property
    def filled(self) -> bool:
        return self.cache[0].offset == len(self.prefix)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache)

    def fill(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Prefill the prefix (what the cache does not hold yet)."""
        from ..engine.generate import prefill

        held = self.cache[0].offset
        if len(self.prefix) >= self.model.context_length:
            raise ContextOverflowError(f"the document is {len(self.prefix)} tokens; the context is "
                                       f"{self.model.context_length} (use --mode rlv or rag)")
        t = time.perf_counter()
        if held < len(self.prefix):
            prefill(self.model.net, self.prefix[held:], self.cache,
                    progress=(lambda d, n: progress(held + d, len(self.prefix))) if progress else None)
        self.prefill_seconds += time.perf_counter() - t
        self._snap = None

    def snapshot(self) -> None:
        """Remember the prefix state of every layer that cannot simply be trimmed back."""
        snap = [None if c.exact_trim else c.state() for c in self.cache]
        self._snap = snap
        self.snapshot_bytes = sum(t.numel() * t.element_size() for s in snap if s for t in s.values())

    def restore(self) -> None:
        """Back to exactly the prefix, whatever was appended since."""
        if self._snap is None:
            raise RuntimeError("restore() before snapshot()")
        t = time.perf_counter()
        n = len(self.prefix)
        for c, s in zip(self.cache, self._snap):
            if s is None:
                c.trim(max(0, c.offset - n))
            elif c.offset != n:
                c.load_state(s)
        self.restore_seconds = time.perf_counter() - t

    def generate(self, suffix: list[int], max_tokens: int = prompts.ANSWER_TOKENS) -> "Reply":
        """Greedy answer line after prefix + suffix; the cache is back at the prefix afterwards."""
        if not self.filled:
            self.fill()
        if self._snap is None:
            self.snapshot()
        ids = self.prefix + list(suffix)
        room = self.model.context_length - len(ids)
        if room <= 0:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.model.context_length}")
        try:
            return answer_line(self.model, ids, min(max_tokens, room), self.cache)
        finally:
            self.restore()

    @torch.inference_mode()
    def next_logits(self, suffix: list[int]) -> torch.Tensor:
        """Logits (vocab,) after prefix + suffix; the cache is back at the prefix afterwards."""
        from ..engine.generate import prefill

        if not self.filled:
            self.fill()
        if self._snap is None:
            self.snapshot()
        try:
            return prefill(self.model.net, list(suffix), self.cache)
        finally:
            self.restore()


@dataclass
class Reply:
    """One generated answer line: text, tokens generated, time to first token, seconds,
    and the smallest margin of its greedy choices (`AnswerStart`)."""

    text: str
    tokens: int
    ttft: float
    seconds: float
    min_margin: float | None = None


_DANGLING = {"was", "is", "are", "were", "be", "the", "a", "an", "of", "by", "to", "in", "at", "on", "for", "and",
             "named", "called", "after", "from", "with"}


def _dangling(line: str) -> bool:
    """A line that stops mid-sentence: on a colon, or on a function word."""
    line = line.rstrip()
    if line.endswith(":"):
        return True
    words = line.split()
    return bool(words) and not line.endswith((".", "!", "?")) and words[-1].lower() in _DANGLING


class AnswerStart:
    """Greedy choice that keeps the answer on the "Answer:" line.

    The prompt ends with "Answer:" and the answer is that line's text. After the
    whole document, a line break is often a base model's likeliest next token
    there, and greedy decoding that takes it can fall into a loop (Gemma 3 270M
    writes "\\nAnswer:\\nAnswer:..." for one of the report's questions, where the
    next choice is " At Baltic Freight."). So until the answer has visible text, a
    token that would end the line (a line break) or the answer (end of text) is
    passed over for the next best; after that it is plain greedy decoding.

    It also records each choice's margin: the logit of the chosen token minus the
    runner-up's (a log-probability gap; near 0, the choice was a coin flip that a
    small change to the attention, such as a compressed cache, can turn).
    """

    def __init__(self, tokenizer, tries: int = 16):
        self.tokenizer, self.tries = tokenizer, tries
        self.started = False
        self.margins: list[float] = []

    def ends_line(self, token: int) -> bool:
        if token in self.tokenizer.eot_ids:
            return True
        text = self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")
        return "\n" in text or "\r" in text

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        logits = logits.float()
        token = int(torch.argmax(logits))
        if not self.started and self.ends_line(token):
            logits = logits.clone()
            for _ in range(self.tries):
                logits[token] = float("-inf")
                token = int(torch.argmax(logits))
                if not self.ends_line(token):
                    break
        top = torch.topk(logits, 2).values
        self.margins.append(float(top[0] - top[1]))
        self.started = self.started or bool(self.tokenizer.token_bytes(token).strip())
        return token


def answer_text(pieces) -> tuple[str, int]:
    """One answer line from text pieces: (text, lines used). Blank lines are skipped;
    the first line break after text ends the answer, unless the line stops
    mid-sentence ("The captain was" / "Alma Petrakis."), when the next line
    completes it. Stops reading `pieces` as soon as the answer is complete."""
    lines: list[str] = []
    buf, finished = "", False
    for piece in pieces:
        buf += piece
        while "\n" in buf and not finished:
            line, buf = buf.split("\n", 1)
            if line.strip():
                lines.append(line.strip())
                finished = not _dangling(line) or len(lines) >= 2
        if finished:
            break
    if not finished and buf.strip():
        lines.append(buf.strip())
    return " ".join(lines), len(lines)


def answer_line(model, ids: list[int], max_tokens: int, cache: list) -> Reply:
    """Greedy decoding of one answer line after ids (the cache may already hold a
    prefix of them), starting on the prompt's last line (`AnswerStart`), read by
    `answer_text`."""
    from ..engine.generate import check_context, stream
    from ..engine.sampling import SamplingParams

    t0 = time.perf_counter()
    limit = check_context(len(ids), max_tokens, model.context_length)
    pick = AnswerStart(model.tokenizer)
    pieces = stream(model.net, model.tokenizer, list(ids), cache, SamplingParams(temperature=0.0), limit,
                    sampler=pick)
    first: list[float] = []
    stats: list = []

    def texts():
        for step in pieces:
            if step.stats:
                stats.append(step.stats)
            if step.text and not first:
                first.append(time.perf_counter() - t0)
            yield step.text

    try:
        text, _ = answer_text(texts())
    finally:
        pieces.close()
    # stopped early, every choice so far was yielded: one margin per choice
    n = stats[0].generated_tokens if stats else len(pick.margins)
    return Reply(text, n, first[0] if first else time.perf_counter() - t0, time.perf_counter() - t0,
                 round(min(pick.margins), 3) if pick.margins else None)


def yes_no_tokens(model) -> tuple[int, int]:
    """Token ids of " Yes" and " No" (first piece of each)."""
    return model.tokenize(" Yes", add_bos=False)[0], model.tokenize(" No", add_bos=False)[0]


def yes_score(model, pc: PrefixCache, suffix: list[int]) -> float:
    """logit(" Yes") - logit(" No") after prefix + suffix: a constrained yes/no answer."""
    y, n = yes_no_tokens(model)
    logits = pc.next_logits(suffix)
    return float(logits[y] - logits[n])


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr in tokens and a callback (done, total) for prefill."""
    if not enabled:
        return None, (lambda: None)
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="tok", unit_scale=True, file=sys.stderr, leave=False,
               dynamic_ncols=True)

    def update(done: int, _total: int) -> None:
        bar.update(done - bar.n)

    return update, bar.close


class DocumentSession:
    """Questions about one document (or several joined), in full, rag, rlv or auto mode.

    Made by `Model.load_document`. In full mode the document is prefilled into the
    KV cache once (or loaded from the on-disk document cache), and every question
    after it costs only its own tokens.
    """

    def __init__(self, model, sources, *, kv: str | None = None, mode: str = "auto", store=True,
                 progress: bool = True, log: Callable[[str], None] | None = None,
                 section_tokens: int | None = None, rag_chunk_tokens: int = 200, rag_top_k: int = 3,
                 quotes: int = QUOTES, rlv_options: dict | None = None,
                 notice: Callable[[str], None] | None = None):
        from .memory import working_memory
        from .store import DocumentStore

        if mode not in MODES:
            raise TightKVError(f"unknown mode '{mode}' (valid: {', '.join(MODES)})")
        self.model = model
        if isinstance(sources, DocumentText):
            self.doc = sources
        else:
            self.doc = read_documents([sources] if isinstance(sources, str) or not hasattr(sources, "__iter__")
                                      else list(sources))
        self.kv = kv or DOC_KV_DEFAULT
        from ..kv.spec import parse_kv

        parse_kv(self.kv)
        self.progress = progress
        self.log = log or (lambda s: None)
        self.notice = notice or (lambda s: print(s, file=sys.stderr))
        self.store = DocumentStore() if store is True else (store or None)
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
        self.pc: PrefixCache | None = None
        self.cache_source = ""  # "disk", "prefill" or ""
        self.mode = self.resolve_mode(mode)
        self.log(f"document: {self.doc_tokens} tokens ({', '.join(self.doc.names)}); working memory "
                 f"{self.wm} tokens ({self.wm_source}); mode {mode} -> {self.mode}")
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
                        title = s.title[len(head):].strip() if s.title.startswith(head) else s.title
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
            self.log(f"cache: loaded {self.store.path_for(self.model, self.doc, self.kv, self.prefix).name} "
                     f"({self.pc.nbytes / 1e6:.1f} MB KV) in {self.timings['load_s']:.2f}s")
        else:
            self.pc = PrefixCache(self.model, self.prefix, self.kv)
            update, close = progress_bar(len(self.prefix), "prefill document", self.progress)
            try:
                self.pc.fill(update)
            finally:
                close()
            self.cache_source = "prefill"
            self.timings["prefill_s"] = self.pc.prefill_seconds
            self.log(f"cache: prefilled {len(self.prefix)} tokens in {self.pc.prefill_seconds:.1f}s "
                     f"({self.pc.nbytes / 1e6:.1f} MB KV, kv {self.kv})")
            if self.store is not None:
                ts = time.perf_counter()
                path = self.store.save(self.model, self.doc, self.kv, self.prefix, self.pc.cache)
                self.timings["save_s"] = time.perf_counter() - ts
                self.log(f"cache: saved {path} ({path.stat().st_size / 1e6:.1f} MB) in {self.timings['save_s']:.2f}s")
        self.timings["document_s"] = time.perf_counter() - t
        ts = time.perf_counter()
        self.pc.snapshot()
        self.timings["snapshot_s"] = time.perf_counter() - ts
        self.log(f"snapshot: {self.pc.snapshot_bytes / 1e6:.1f} MB of non-trimmable layer state "
                 f"in {self.timings['snapshot_s'] * 1e3:.1f} ms")
        return self.pc

    def ask_full(self, question: str, max_tokens: int = prompts.ANSWER_TOKENS) -> Answer:
        t0 = time.perf_counter()
        fresh = self.pc is None or not self.pc.filled
        pc = self.load()
        asked = prompts.question_suffix(question)
        quotes = self.quotes_for(question, len(self.model.tokenize(asked, add_bos=False)) + max_tokens)
        suffix = self.model.tokenize(quotes_block(quotes) + asked, add_bos=False)
        reply = pc.generate(suffix, max_tokens=max_tokens)
        text = first_sentence(reply.text)
        sec = self.cite(text)
        ttft = (time.perf_counter() - t0 - reply.seconds + reply.ttft) if fresh else reply.ttft
        self.log(f"full: {len(suffix)} question tokens ({len(quotes)} quoted sentences) after {len(self.prefix)} "
                 f"cached; restore {pc.restore_seconds * 1e3:.1f} ms; smallest answer-token margin {reply.min_margin}")
        return Answer(text, "full", sec.label + " " + sec.title if sec else "", sec.index if sec else None,
                      ttft=ttft, seconds=time.perf_counter() - t0, prompt_tokens=len(self.prefix) + len(suffix),
                      min_margin=reply.min_margin,
                      stages=[{"stage": "quotes", "sentences": [[q.start, q.end] for q in quotes]}])

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

                self._rag = RagIndex(self.model, self.doc, kv=self.kv, chunk_tokens=self.rag_chunk_tokens,
                                     top_k=self.rag_top_k, log=self.log)
            return self._rag.ask(question, **kwargs)
        if mode == "rlv":
            if self._rlv is None:
                from .rlv import RLV

                self._rlv = RLV(self.model, self.sections, kv=self.kv, working_memory=self.wm, log=self.log,
                                evidence=self.evidence if self.quotes > 0 else None, quotes=self.quotes,
                                **self.rlv_options)
            return self._rlv.ask(question, **kwargs)
        raise TightKVError(f"unknown mode '{mode}'")

    @property
    def kv_bytes(self) -> int:
        return self.pc.nbytes if self.pc is not None else 0
