"""Whole-document QA: a document prefilled once into the (compressed) KV cache and
kept on disk (`session`, `store`), the question's best sentences quoted before it
(`evidence`, over `search`), the chunk-RAG baseline (`rag`), and RLV for documents
past the model's working memory (`rlv`, `memory`).

    from tightkv import Model
    doc = Model().load_document("report.md")
    print(doc.ask("Who leads the Lumen division?"))
"""

__all__ = ["Answer", "DocumentSession", "PrefixCache", "MODES"]


def __getattr__(name: str):
    """The session classes on first use: `documents.formats` alone (the CLI's help) loads no torch."""
    if name in ("Answer", "PrefixCache"):
        from . import reading

        return getattr(reading, name)
    if name in ("MODES", "DocumentSession"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
