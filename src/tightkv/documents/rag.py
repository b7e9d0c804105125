"""The chunk-RAG baseline: fixed-size token chunks, BM25 (bm25s) top-k, answer.

What RLV is measured against: the document is cut every `chunk_tokens` tokens
(mid-sentence if that is where the count falls), the question alone is the BM25
query, the top `top_k` chunks go into the prompt in rank order, and the model's
answer is returned as is: no verification, no second look.
"""

from __future__ import annotations

import time
from typing import Callable

from . import prompts
from .reading import Answer, answer_line
from .search import BM25Index
from .text import DocumentText, Section, first_sentence, fixed_chunks


class RagIndex:
    """Chunks of a document and their BM25 index; `ask` answers from the top-k chunks."""

    def __init__(
        self,
        model,
        doc: DocumentText,
        kv: str | None = None,
        chunk_tokens: int = 200,
        top_k: int = 3,
        log: Callable[[str], None] | None = None,
    ):
        self.model, self.kv, self.top_k = model, kv, top_k
        self.log = log or (lambda s: None)
        ids = model.tokenize(doc.text, add_bos=False)
        self.chunks = fixed_chunks(ids, chunk_tokens, model.detokenize)
        self.index = BM25Index(self.chunks)
        self.log(f"rag: {len(self.chunks)} chunks of {chunk_tokens} tokens, top {top_k}")

    def retrieve(self, question: str) -> list[Section]:
        hits = self.index.rank(question, self.top_k)
        return [self.chunks[i] for i, _ in hits] or self.chunks[: self.top_k]

    def ask(self, question: str, max_tokens: int = prompts.ANSWER_TOKENS) -> Answer:
        t0 = time.perf_counter()
        chunks = self.retrieve(question)
        self.log("rag: retrieved " + ", ".join(c.title for c in chunks))
        prompt = prompts.chunks_context(chunks) + prompts.question_suffix(question)
        ids = self.model.tokenize(prompt, add_bos=True)
        r = answer_line(self.model, ids, max_tokens, self.model.new_cache(self.kv))
        top = chunks[0] if chunks else None
        return Answer(
            first_sentence(r.text),
            "rag",
            top.title if top else "",
            top.index if top else None,
            ttft=time.perf_counter() - t0 - r.seconds + r.ttft,
            seconds=time.perf_counter() - t0,
            prompt_tokens=len(ids),
            min_margin=r.min_margin,
            stages=[{"stage": "retrieve", "chunks": [c.index for c in chunks]}],
        )
