"""`tightkv ask --doc FILE "question"`: questions about whole documents.

The document is prefilled once into the (compressed) KV cache, with a progress
bar, and saved under ``$TIGHTKV_HOME/documents``; the next `ask` about the same
document, model and KV spec loads it instead (see tightkv.kv.saved).
Modes: full (the document in context), rag (chunk-RAG baseline), rlv
(Read-Locate-Verify), auto (full when the document fits the model's measured
working memory, else rlv).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..documents import formats
from ..errors import TightKVError
from .flags import CTX_HELP, add_auto_flags, add_kv_flags, add_spec_flags, auto_memory, kv_spec, spec_kwargs

NAME = "ask"
HELP = "answer questions about documents (whole document in the KV cache, RAG or RLV)"
ANSWER_TOKENS = 96  # documents.prompts.ANSWER_TOKENS, not imported here: the CLI starts without torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("questions", nargs="*", metavar="QUESTION", help="one or more questions, answered in turn")
    p.add_argument("-m", "--model", default=None, help="registry name or .gguf path (default: the embedded model)")
    p.add_argument(
        "--doc",
        "-d",
        action="append",
        default=[],
        metavar="FILE",
        help=f"a document: {formats.described()} (repeatable: the documents are read together)",
    )
    p.add_argument(
        "--mode",
        choices=["auto", "full", "rag", "rlv"],
        default="auto",
        help="full: whole document in context; rag: top-k BM25 chunks; rlv: read-locate-verify; "
        "auto: full if the document fits the model's working memory, else rlv (default)",
    )
    add_kv_flags(p)
    add_auto_flags(p)
    add_spec_flags(p)
    p.add_argument("-c", "--ctx", type=int, default=None, help=CTX_HELP)
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=ANSWER_TOKENS,
        help=f"answer tokens at most (default {ANSWER_TOKENS}); the answer ends at the end of its "
        "first sentence or line",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the on-disk document cache")
    p.add_argument(
        "--cache-info",
        action="store_true",
        help="list the cached documents (file size, KV bytes) and exit; with --doc, only its file",
    )
    p.add_argument("--clear-cache", action="store_true", help="delete every cached document and exit")
    p.add_argument("--reads", type=int, default=3, help="rlv: reads at most per question (lookup + research)")
    p.add_argument("--reformulate", action="store_true", help="rlv: add the model's reformulation as a query variant")
    p.add_argument(
        "--quotes",
        type=int,
        default=None,
        metavar="N",
        help="full and rlv: quote the N sentences that best match the question before it (default 5; 0: none)",
    )
    p.add_argument("--top-k", type=int, default=3, help="rag: chunks in context (default 3)")
    p.add_argument("--chunk-tokens", type=int, default=200, help="rag: chunk size in tokens (default 200)")
    p.add_argument("--verbose", "-v", action="store_true", help="log each stage (cache, locate, lookup, verify)")
    p.add_argument("--json", action="store_true", help="print answers and timings as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(ns: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    from ..documents.library import clear_saved
    from ..kv.saved import CacheStore, format_entries

    store = CacheStore()
    if ns.clear_cache:
        print(f"deleted {clear_saved(store)} cached documents from {store.root}")
        return 0
    if ns.cache_info and not ns.doc:
        rows = store.entries()
        print(json.dumps(rows, indent=1) if ns.json else format_entries(rows))
        return 0
    if not ns.doc:
        raise TightKVError("give a document with --doc FILE (see: tightkv ask --help)")
    if not ns.questions and not ns.cache_info:
        raise TightKVError('give a question after the flags, e.g. tightkv ask --doc report.md "Who is the CEO?"')
    if ns.max_tokens < 1:
        raise TightKVError(f"--max-tokens must be positive, got {ns.max_tokens}")
    if ns.quotes is not None and ns.quotes < 0:
        raise TightKVError(f"--quotes must be 0 or more, got {ns.quotes}")

    from ..api import Model
    from ..documents.evidence import QUOTES
    from ..documents.session import DocumentSession
    from ..documents.text import read_documents

    kv = kv_spec(ns)
    doc = read_documents([Path(d) for d in ns.doc])  # file errors before the model loads
    log = _eprint if ns.verbose else None
    model = Model(ns.model, kv=kv, threads=ns.threads, context_length=ns.ctx or None)
    model.speculate(**spec_kwargs(ns))
    if model.kv_pending:  # --kv auto: fitted to the document (and its answer), unless -c asks for more
        need = len(model.tokenize(doc.text)) + 2 * ANSWER_TOKENS + 512
        model.choose_kv(
            doc.text,
            memory=auto_memory(ns),
            context=ns.ctx or min(model.context_length, need),
            text_name="the document",
        )
    t_model = time.perf_counter() - t_start
    if log:
        from .flags import model_label

        log(f"model: {model_label(ns.model)} loaded in {t_model:.2f}s")
    session = DocumentSession(
        model,
        doc,
        kv=model.kv,
        mode=ns.mode,
        store=None if ns.no_cache else store,
        keep_text=True,
        progress=not ns.no_progress and not ns.json,
        log=log,
        rag_top_k=ns.top_k,
        rag_chunk_tokens=ns.chunk_tokens,
        quotes=QUOTES if ns.quotes is None else ns.quotes,
        rlv_options={"reads": ns.reads, "reformulate": ns.reformulate},
    )
    t_ready = time.perf_counter() - t_start
    if ns.questions:
        _eprint(session.mode_line(ns.mode))
    if ns.cache_info:
        path = store.path_for(model, doc, session.kv, session.prefix)
        rows = [r for r in store.entries() if r["path"] == str(path)]
        print(json.dumps(rows, indent=1) if ns.json else format_entries(rows) if rows else f"not cached: {path}")
        if not ns.questions:
            return 0
    out = []
    for i, q in enumerate(ns.questions):
        answer = session.ask(q, max_tokens=ns.max_tokens)
        rec = answer.as_dict()
        rec["question"] = q
        if i == 0:
            rec["ttft_s"] = round(t_ready + answer.ttft, 4)  # from the command's start: model, document, question
        out.append(rec)
        if not ns.json:
            print(answer.text or "(no answer)")
            if answer.citation:
                print(f"  [source: {answer.citation}{'' if answer.verified in (None, True) else ', unverified'}]")
            sys.stdout.flush()
        if log:
            log(f"time: first token {rec['ttft_s']:.2f}s, answer {answer.seconds:.2f}s ({answer.mode})")
    if ns.json:
        doc_info = {
            "mode": session.mode,
            "kv": str(session.kv),
            "doc_tokens": session.doc_tokens,
            "working_memory": session.wm,
            "cache_source": session.cache_source,
            "kv_bytes": session.kv_bytes,
            "model_load_s": round(t_model, 4),
            "ready_s": round(t_ready, 4),
            **{k: round(v, 4) for k, v in session.timings.items()},
        }
        if session.pc is not None and session.store is not None:
            doc_info["cache_file"] = str(store.path_for(model, doc, session.kv, session.prefix))
            doc_info["snapshot_bytes"] = session.pc.snapshot_bytes
        print(json.dumps({"document": doc_info, "answers": out}, indent=1))
    return 0
