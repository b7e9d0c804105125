"""Lexical search over pieces of a document: BM25 (`bm25s`) with our terms, and
Reciprocal Rank Fusion of several queries' rankings. Used by the RAG baseline
(chunks), RLV (sections) and full mode's quoted evidence (sentences)."""

from __future__ import annotations

from .text import Section, terms


class BM25Index:
    """bm25s over sections, with our terms (stop words out, light stemming)."""

    def __init__(self, sections: list[Section]):
        import bm25s

        self.sections = sections
        self.bm25 = bm25s.BM25()
        corpus = [terms(s.text) or ["_empty_"] for s in sections]
        self.bm25.index(corpus, show_progress=False)

    def rank(self, query: str, k: int | None = None) -> list[tuple[int, float]]:
        """[(section index, score)] with a positive score, best first."""
        q = terms(query)
        if not q or not self.sections:
            return []
        k = min(k or len(self.sections), len(self.sections))
        docs, scores = self.bm25.retrieve([q], k=k, show_progress=False)
        return [(int(d), float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


RRF_K = 60


def rrf(index: BM25Index, variants: dict[str, str], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal Rank Fusion of the BM25 rankings of several query variants:
    [(index, sum over variants of 1 / (k + rank))], best first."""
    fused: dict[int, float] = {}
    for q in variants.values():
        for rank, (i, _) in enumerate(index.rank(q)):
            fused[i] = fused.get(i, 0.0) + 1.0 / (k + rank + 1)
    return sorted(fused.items(), key=lambda x: (-x[1], x[0]))
