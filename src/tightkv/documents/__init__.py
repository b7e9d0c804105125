"""Whole-document QA: a document prefilled once into the (compressed) KV cache and
kept on disk (`session`, `store`), the question's best sentences quoted before it
(`evidence`, over `search`), the chunk-RAG baseline (`rag`), and RLV for documents
past the model's working memory (`rlv`, `memory`).

    from tightkv import Model
    doc = Model().load_document("report.md")
    print(doc.ask("Who leads the Lumen division?"))
"""

from .reading import Answer, PrefixCache
from .session import MODES, DocumentSession

__all__ = ["Answer", "DocumentSession", "PrefixCache", "MODES"]
