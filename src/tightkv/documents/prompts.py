"""Completion-style prompts for document QA.

The embedded model (Gemma 3 270M) is a base model with no chat template, so every
prompt is a document followed by a "Question: ...\\nAnswer:" line, answered greedily
up to the end of the line (the answer starts on that line: `session.AnswerStart`).
The document part is a fixed prefix, so its KV cache can be reused (and saved)
while questions change. Full mode, RAG and RLV share this format; only what stands
under "Document:" differs (the whole document, retrieved chunks, read sections).
"""

from __future__ import annotations

ANSWER_STOP = ["\n"]
ANSWER_TOKENS = 96  # a cap: the answer ends at its first sentence or line (reading.answer_text)


def document_prefix(text: str) -> str:
    """What precedes every question in full mode: the whole document."""
    return f"Document:\n{text.rstrip()}\n\n"


def question_suffix(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer:"


DOCUMENT_HEAD = "Document:\n"


def section_part(section) -> str:
    """One section as it stands in a read, in document order after `DOCUMENT_HEAD`:
    a read is the head, then its sections' parts (each tokenized on its own, so a
    read that starts with the same sections starts with the same tokens)."""
    return section.text.strip() + "\n\n"


def chunks_context(chunks) -> str:
    """RAG context: retrieved chunks in rank order, as retrieved."""
    return "Document:\n" + "\n\n".join(c.text.strip() for c in chunks) + "\n\n"


def verify_suffix(question: str, answer: str) -> str:
    """A yes/no judgement after the context: the next token is " Yes" or " No"."""
    return (
        f"Question: {question.strip()}\nProposed answer: {answer.strip()}\n"
        f"Does the document above state this answer? Yes or No?\nReply:"
    )


def reformulate_prompt(question: str) -> str:
    """Ask the model for a search query (the optional third RLV query variant)."""
    return (
        "Rewrite each question as a short search query.\n"
        "Question: When did the company open its first factory?\nQuery: company first factory opened year\n"
        f"Question: {question.strip()}\nQuery:"
    )
