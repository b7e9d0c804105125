"""What every document mode shares: a prefix prefilled once into a KV cache, then
many suffixes asked after it, and the greedy answer line read after each.

`PrefixCache` holds a per-layer cache filled with a token prefix (a document).
Each question is appended after the prefix and rolled back afterwards, so the
next question costs no document prefill. Rolling back is exact:

- a layer whose `exact_trim` holds (a global dense layer) is trimmed;
- any other layer (a sliding-window ring that dropped old tokens, a compressed
  layer whose exact recent window moved into the body) is restored from its
  `state()`, taken once after the prefix. `snapshot_bytes` and the restore time
  say what this costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import ContextOverflowError
from . import prompts
from .text import sentence_end


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
        quotes: the [start, end) character spans of the document's sentences quoted
            before the question that gave the answer (the evidence), in document order.
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
    quotes: list[tuple[int, int]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text

    def as_dict(self) -> dict:
        return {
            "answer": self.text,
            "mode": self.mode,
            "citation": self.citation,
            "section": self.section,
            "verified": self.verified,
            "ttft_s": round(self.ttft, 4),
            "seconds": round(self.seconds, 4),
            "prompt_tokens": self.prompt_tokens,
            "min_margin": self.min_margin,
            "stages": self.stages,
            "quotes": [list(q) for q in self.quotes],
        }


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
            raise ContextOverflowError(
                f"the document is {len(self.prefix)} tokens; the context is "
                f"{self.model.context_length} (use --mode rlv or rag)"
            )
        t = time.perf_counter()
        if held < len(self.prefix):
            prefill(
                self.model.net,
                self.prefix[held:],
                self.cache,
                progress=(lambda d, n: progress(held + d, len(self.prefix))) if progress else None,
            )
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

    def generate(
        self, suffix: list[int], max_tokens: int = prompts.ANSWER_TOKENS, on_text: Callable[[str], None] | None = None
    ) -> "Reply":
        """Greedy answer line after prefix + suffix; the cache is back at the prefix afterwards.
        `on_text(piece)` is told each generated piece of text as it comes."""
        if not self.filled:
            self.fill()
        if self._snap is None:
            self.snapshot()
        ids = self.prefix + list(suffix)
        room = self.model.context_length - len(ids)
        if room <= 0:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.model.context_length}")
        try:
            return answer_line(self.model, ids, min(max_tokens, room), self.cache, on_text)
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


_DANGLING = {
    "was",
    "is",
    "are",
    "were",
    "be",
    "the",
    "a",
    "an",
    "of",
    "by",
    "to",
    "in",
    "at",
    "on",
    "for",
    "and",
    "named",
    "called",
    "after",
    "from",
    "with",
}


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
    the answer ends at the end of its first sentence, or at the first line break
    after text, unless the line stops mid-sentence ("The captain was" / "Alma
    Petrakis."), when the next line completes it. Stops reading `pieces` as soon as
    the answer is complete."""
    lines: list[str] = []
    buf, finished = "", False
    for piece in pieces:
        buf += piece
        while "\n" in buf and not finished:
            line, buf = buf.split("\n", 1)
            if line.strip():
                lines.append(line.strip())
                finished = not _dangling(line) or len(lines) >= 2
        if not finished and "\n" not in buf:
            so_far = " ".join([*lines, buf.lstrip()])
            end = sentence_end(so_far, final=False)
            if end is not None:
                return so_far[:end].strip(), len(lines) + 1
        if finished:
            break
    if not finished and buf.strip():
        lines.append(buf.strip())
    return " ".join(lines), len(lines)


def answer_line(
    model, ids: list[int], max_tokens: int, cache: list, on_text: Callable[[str], None] | None = None
) -> Reply:
    """Greedy decoding of one answer line after ids (the cache may already hold a
    prefix of them), starting on the prompt's last line (`AnswerStart`), read by
    `answer_text`; `on_text` sees each generated piece as it comes (a stream)."""
    from ..engine.generate import check_context, stream
    from ..engine.sampling import SamplingParams
    from ..engine.speculative import make_speculator

    t0 = time.perf_counter()
    limit = check_context(len(ids), max_tokens, model.context_length)
    pick = AnswerStart(model.tokenizer)
    spec = make_speculator(model, model.spec_options()) if hasattr(model, "spec_options") else None
    pieces = stream(
        model.net,
        model.tokenizer,
        list(ids),
        cache,
        SamplingParams(temperature=0.0),
        limit,
        sampler=pick,
        speculator=spec,
    )
    first: list[float] = []
    stats: list = []

    def texts():
        for step in pieces:
            if step.stats:
                stats.append(step.stats)
            if step.text and not first:
                first.append(time.perf_counter() - t0)
            if step.text and on_text:
                on_text(step.text)
            yield step.text

    try:
        text, _ = answer_text(texts())
    finally:
        pieces.close()
    # stopped early, every choice so far was yielded: one margin per choice
    n = stats[0].generated_tokens if stats else len(pick.margins)
    return Reply(
        text,
        n,
        first[0] if first else time.perf_counter() - t0,
        time.perf_counter() - t0,
        round(min(pick.margins), 3) if pick.margins else None,
    )


def yes_no_tokens(model) -> tuple[int, int]:
    """Token ids of " Yes" and " No" (first piece of each)."""
    return model.tokenize(" Yes", add_bos=False)[0], model.tokenize(" No", add_bos=False)[0]


def yes_score(model, pc: PrefixCache, suffix: list[int]) -> float:
    """logit(" Yes") - logit(" No") after prefix + suffix: a constrained yes/no answer."""
    y, n = yes_no_tokens(model)
    logits = pc.next_logits(suffix)
    return float(logits[y] - logits[n])
