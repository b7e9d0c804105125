"""`/v1/documents`: add a document, follow its load, ask about it (the web page's routes,
documented for scripts in docs/server.md). The state and the worker side are in `sessions`.

    POST /v1/documents                   multipart `file` (text, Markdown, HTML, PDF) or JSON {"text", "name"};
                                         optional `mode` (auto, full, rlv). 202 with the document's record
    GET  /v1/documents                   the store's documents: status here, tokens, KV type and bytes, cached
    GET  /v1/documents/{id}              one document's record
    GET  /v1/documents/{id}/text         its text (what the quoted spans index)
    POST /v1/documents/{id}/open         load it again (warm from RAM or the disk store)
    GET  /v1/documents/{id}/events       its load as SSE: status, progress ..., then loaded or error
    POST /v1/documents/{id}/ask          {"question", "mode", "stream"}: the answer, with its quoted spans
"""

from __future__ import annotations

from pathlib import PurePath

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from ..documents.formats import document_text
from ..documents.text import DocumentText, clean_text
from ..errors import TightKVError
from .http import COMPONENTS, ApiError, JobStream, as_api_error, dumps, parse_body, request_body
from .schemas import AddDocumentRequest, AskDocumentRequest, OpenDocumentRequest
from .sessions import MODES, Shelf

router = APIRouter(prefix="/v1/documents", tags=["Documents"])


def shelf(request: Request) -> Shelf:
    return request.app.state.tk.shelf


def _upload_body() -> dict:
    """The OpenAPI request body of the upload route: a multipart file, or JSON text."""
    extra = request_body(AddDocumentRequest)
    COMPONENTS["DocumentUpload"] = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary", "description": ".txt, .md, .html or .pdf"},
            "mode": {"type": "string", "enum": list(MODES)},
        },
    }
    extra["requestBody"]["content"]["multipart/form-data"] = {"schema": {"$ref": "#/components/schemas/DocumentUpload"}}
    return extra


@router.post(
    "",
    status_code=202,
    openapi_extra=_upload_body(),
    summary="Add a document (a file as multipart, or JSON text); it loads in the background",
)
async def add_document(request: Request):
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        doc, mode = await _read_upload(request)
    else:
        body = await parse_body(request, AddDocumentRequest)
        if not body.text.strip():
            raise ApiError(400, "the document is empty", param="text")
        doc, mode = DocumentText(clean_text(body.text), (body.name or "pasted text",)), body.mode
    try:
        entry = await run_in_threadpool(shelf(request).add, doc, mode)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - a full queue is a 503
        raise as_api_error(err) from None
    return JSONResponse(entry.record(), status_code=202)


async def _read_upload(request: Request) -> tuple[DocumentText, str]:
    """The uploaded file's text (a one-line 400 when it cannot be read) and the mode asked."""
    try:
        form = await request.form()
    except Exception as err:  # noqa: BLE001 - a malformed multipart body
        raise ApiError(400, f"the multipart body cannot be read: {str(err)[:120]}") from None
    upload, mode = form.get("file"), form.get("mode") or "auto"
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "'file': is required (a multipart file field named 'file')", param="file")
    if mode not in MODES:
        raise ApiError(400, f"'mode': must be one of {', '.join(MODES)}", param="mode")
    name = PurePath(upload.filename or "document").name[:200] or "document"
    data = await upload.read()
    try:
        text = await run_in_threadpool(document_text, name, data)
    except TightKVError as err:
        raise ApiError(400, str(err), param="file", code="unreadable_document") from None
    return DocumentText(clean_text(text), (name,)), mode


@router.get("", summary="The documents of the store, with their state here and their KV cache")
async def list_documents(request: Request):
    from .pool import ensure_loaded

    state = request.app.state.tk
    await ensure_loaded(state.default)  # its KV type decides which stored caches open warm
    rows = await run_in_threadpool(shelf(request).listing, str(state.served.path), state.served.kv)
    return {"object": "list", "data": rows}


def _entry(request: Request, doc_id: str):
    entry = shelf(request).get(doc_id)
    if entry is None:
        raise ApiError(
            404, f"no document '{doc_id}' (see GET /v1/documents)", "not_found_error", code="document_not_found"
        )
    return entry


@router.get("/{doc_id}", summary="One document's record")
async def get_document(doc_id: str, request: Request):
    return (await run_in_threadpool(_entry, request, doc_id)).record()


@router.get("/{doc_id}/text", summary="A document's text (the quoted spans are offsets into it)")
async def document_text_route(doc_id: str, request: Request):
    entry = await run_in_threadpool(_entry, request, doc_id)
    return {"id": entry.id, "name": entry.name, "names": list(entry.doc.names), "text": entry.doc.text}


@router.post(
    "/{doc_id}/open",
    status_code=202,
    openapi_extra=request_body(OpenDocumentRequest),
    summary="Open a stored document again: warm from RAM or the disk store",
)
async def open_document(doc_id: str, request: Request):
    raw = await request.body()
    mode = (await parse_body(request, OpenDocumentRequest)).mode if raw.strip() else None
    try:
        entry = await run_in_threadpool(shelf(request).open, doc_id, mode)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001
        raise as_api_error(err) from None
    return JSONResponse(entry.record(), status_code=202)


class _Unfollow:
    """What JobStream cancels when the client goes: stop following the load."""

    def __init__(self, stop):
        self.cancel = stop


@router.get("/{doc_id}/events", summary="A document's load as SSE: status, progress, then loaded or error")
async def document_events(doc_id: str, request: Request):
    entry = await run_in_threadpool(_entry, request, doc_id)
    queue, stop = shelf(request).follow(entry)

    async def sse():
        while True:
            event = await queue.get()
            yield f"data: {dumps(event)}\n\n"
            if event["type"] in ("loaded", "error") or (
                event["type"] == "status" and event["status"] not in ("queued", "loading")
            ):
                break
        yield "data: [DONE]\n\n"

    return JobStream(_Unfollow(stop), sse(), "text/event-stream")


@router.post(
    "/{doc_id}/ask",
    openapi_extra=request_body(AskDocumentRequest),
    summary="Ask about a document: the answer, its mode and quoted spans (SSE with stream: true)",
)
async def ask_document(doc_id: str, request: Request):
    body = await parse_body(request, AskDocumentRequest)
    if not body.question.strip():
        raise ApiError(400, "the question is empty", param="question")
    entry = await run_in_threadpool(_entry, request, doc_id)
    try:
        queue, task = shelf(request).ask(entry, body.question, body.mode, body.max_tokens)
    except Exception as err:  # noqa: BLE001 - a full queue is a 503
        raise as_api_error(err) from None
    if not body.stream:
        try:
            while True:
                event = await queue.get()
                if event["type"] == "answer":
                    return event
                if event["type"] == "error":
                    e = event["error"]
                    raise ApiError(event["status"], e["message"], e["type"], e.get("param"), e.get("code"))
        finally:
            task.cancel()

    async def sse():
        while True:
            event = await queue.get()
            yield f"data: {dumps(event)}\n\n"
            if event["type"] in ("answer", "error"):
                break
        yield "data: [DONE]\n\n"

    return JobStream(task, sse(), "text/event-stream")
