"""Quoted evidence: the document's sentences that best match a question.

A small model with a whole document in its KV cache often has the fact it needs
and still answers with the wrong one of several similar facts (the first name in
a list of officers, another division's plant). Full mode therefore puts, between
the cached document and the question, the few sentences of the document that
match the question best:

    Document:
    ...the whole document (cached)...

    Relevant sentences:
    The Meridian division runs the plant in Ghent.
    The Meridian division is led by Lena Castell.

    Question: Who leads the division that runs the plant in Ghent?
    Answer:

The sentences are ranked lexically (BM25 over the question and over its
keywords, fused by Reciprocal Rank Fusion, as RLV's locate step does) and quoted
in document order, so a multi-hop question's two facts, which BM25 finds
separately, stand next to each other. The model still reads the whole document;
the quotes only point at it. `quotes=0` turns them off (plain full mode).
"""

from __future__ import annotations

from typing import Callable

from .search import BM25Index, rrf
from .text import Section, keywords, past_headings, sentences

QUOTES = 5  # sentences quoted per question in full mode and RLV reads (0: none)
MAX_CHARS = 400  # a longer "sentence" (a list, a table, code) is cut to this


class SentenceIndex:
    """The sentences of a text (headings and bare numbers left out), searchable with BM25."""

    def __init__(self, text: str):
        spans = [
            (a, b) for a, b in ((past_headings(text, a, b), b) for a, b in sentences(text)) if _is_sentence(text[a:b])
        ]
        self.sentences = [Section(i, a, b, _quote(text[a:b]), "", 0) for i, (a, b) in enumerate(spans)]
        self.index = BM25Index(self.sentences)

    def top(self, question: str, k: int = QUOTES) -> list[Section]:
        """The k sentences that best match the question, best first (RRF of BM25 over
        the question and its keywords)."""
        if k <= 0 or not self.sentences:
            return []
        ranked = rrf(self.index, {"question": question, "keywords": keywords(question)})
        return [self.sentences[i] for i, _ in ranked[:k]]

    def quote(self, question: str, k: int, room: int, model) -> list[Section]:
        """The k best sentences, as many as fit `room` of the model's tokens as a quoted block."""
        count = lambda t: len(model.tokenize(t, add_bos=False))  # noqa: E731
        return quotes_that_fit(self.top(question, k), room, count)


def quotes_that_fit(quotes: list[Section], room: int, count: Callable[[str], int]) -> list[Section]:
    """As many of the quotes (best first) as fit `room` tokens of quoted block."""
    kept: list[Section] = []
    for s in quotes:
        if count(quotes_block([*kept, s])) <= room:
            kept.append(s)
    return kept


def quotes_block(quotes: list[Section]) -> str:
    """The quoted sentences in document order, as they stand before the question ("" for none)."""
    if not quotes:
        return ""
    return "Relevant sentences:\n" + "\n".join(s.text for s in sorted(quotes, key=lambda s: s.start)) + "\n\n"


def _is_sentence(text: str) -> bool:
    return sum(c.isalpha() for c in text) >= 3  # headings are cut off by past_headings


def _quote(text: str) -> str:
    t = " ".join(text.split())
    return t if len(t) <= MAX_CHARS else t[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."
