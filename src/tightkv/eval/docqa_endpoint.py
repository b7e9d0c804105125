"""Document QA on a target that only completes text (`tightkv docqa --endpoint`).

Full mode (the whole document, the quoted sentences, the question) and chunk RAG
send the local engine's prompts, token for token (`documents.prompts`), as one
completion each (two: the first token is chosen as the local engine's
`AnswerStart` does, from the endpoint's alternatives); the answer is its first
line or sentence (`answer_text`). RLV, which reads sections into the engine's
own cache and compares logits, runs only locally.
"""

from __future__ import annotations

import time
from typing import Callable

from ..documents import prompts
from ..documents.evidence import QUOTES, SentenceIndex, quotes_block
from ..documents.rag import RagIndex
from ..documents.reading import answer_text
from ..documents.text import DocumentText, answer_matches
from .docqa import DocSet, summarize

MODES = ("full", "full-plain", "rag")


class TokenCounter:
    """What retrieval and quoting ask of a model: its tokenizer and its context."""

    def __init__(self, tokens, context_length: int):
        self.tokens, self.context_length = tokens, context_length

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return (self.tokens.bos if add_bos else []) + self.tokens.tokenize(text)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokens.detokenize(ids)


def _prompt(model: TokenCounter, d: DocSet, question: str, mode: str, evidence, rag) -> list[int]:
    """The prompt's token ids for one question, as the local engine builds them."""
    asked = prompts.question_suffix(question)
    if mode == "rag":
        return model.tokenize(prompts.chunks_context(rag.retrieve(question)) + asked)
    prefix = model.tokenize(prompts.document_prefix(d.text))
    quotes = []
    if mode == "full" and evidence is not None:
        room = (
            model.context_length - len(prefix) - len(model.tokenize(asked, add_bos=False)) - prompts.ANSWER_TOKENS - 8
        )
        quotes = evidence.quote(question, QUOTES, room, model)
    return prefix + model.tokenize(quotes_block(quotes) + asked, add_bos=False)


def run_target_config(
    target, tokens, docs: list[DocSet], mode: str, context_length: int, log: Callable[[str], None] = print
) -> dict:
    """Every question of a set in one mode on one target; a record shaped as
    `docqa.run_config`'s (accuracy, its interval, seconds per question)."""
    model = TokenCounter(tokens, context_length)
    items = []
    for d in docs:
        evidence = SentenceIndex(d.text) if mode == "full" else None
        rag = RagIndex(model, DocumentText(d.text, ("doc",))) if mode == "rag" else None
        for q in d.questions:
            t0 = time.perf_counter()
            ids = _prompt(model, d, q.question, mode, evidence, rag)
            text, _ = answer_text([target.answer_line(ids, prompts.ANSWER_TOKENS)])
            ok = answer_matches(text, q.answer)
            seconds = time.perf_counter() - t0
            log(
                f"  [{mode}/{target.label}] {d.meta.get('seed', '')}/{q.id} {'OK ' if ok else 'BAD'} {text[:60]!r} "
                f"(want {q.answer[0]!r}) {seconds:.1f}s"
            )
            items.append(
                {
                    "id": q.id,
                    "doc": d.meta.get("seed"),
                    "kind": q.kind,
                    "question": q.question,
                    "expected": q.answer[0],
                    "answer": text,
                    "correct": ok,
                    "prompt_tokens": len(ids),
                    "seconds": round(seconds, 3),
                }
            )
    rec = summarize(items)
    rec.update(
        {
            "mode": mode,
            "kv": target.label,
            "docs": len(docs),
            "doc_tokens": sum(len(model.tokenize(prompts.document_prefix(d.text))) for d in docs),
        }
    )
    return rec
