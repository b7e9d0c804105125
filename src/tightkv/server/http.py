"""What the OpenAI, Ollama and Anthropic routes share: errors in each API's shape, request
parsing, running a job and streaming it with disconnect detection."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, StreamingResponse

from ..errors import ContextOverflowError, RequestError, TightKVError
from ..engine.requests import prepare, seeded
from .scheduler import ACCEPTED, DONE, ERROR, LOGPROB, PIECE, Cancelled, Job, Task, Unavailable

log = logging.getLogger("tightkv.server")


class ApiError(Exception):
    """An error answer: OpenAI-shaped on /v1/*, Ollama's flat shape on /api/*, Anthropic's
    on /v1/messages (its type named by the status, as Anthropic's API names them)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code
        self.headers = headers
        self.extra = extra

    def body(self, path: str) -> dict:
        if is_ollama(path):
            return {"error": self.message}
        if is_anthropic(path):
            return {"type": "error", "error": {"type": anthropic_error_type(self.status), "message": self.message}}
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}
        }


def is_ollama(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (api_error for any other 5xx)."""
    return ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_response(path: str, err: ApiError) -> JSONResponse:
    cls = OllamaJSON if is_ollama(path) else JSONResponse
    return cls(err.body(path), status_code=err.status, headers=err.headers)


def as_api_error(err: BaseException) -> ApiError:
    """Map an engine or scheduler exception to the answer a client gets."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, ContextOverflowError):
        counts = {"n_prompt_tokens": err.n_prompt_tokens, "n_ctx": err.n_ctx} if err.n_ctx else {}
        return ApiError(400, str(err), "exceed_context_size_error", code="context_length_exceeded", **counts)
    if isinstance(err, RequestError):
        return ApiError(400, str(err), param=err.param)
    if isinstance(err, TightKVError):
        return ApiError(400, str(err))
    if isinstance(err, Cancelled):
        return ApiError(499, "the client closed the request", code="client_closed_request")
    if isinstance(err, Unavailable):
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
        return ApiError(503, str(err), "unavailable_error", code="unavailable", headers=headers)
    log.error("request failed", exc_info=(type(err), err, err.__traceback__))
    return ApiError(500, "internal server error (see the server log)", "server_error", code="server_error")


# --- JSON ---------------------------------------------------------------------
def dumps(obj: Any) -> str:
    """Compact JSON, UTF-8 kept, as OpenAI and llama.cpp send it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def go_dumps(obj: Any) -> str:
    """JSON as Go's encoding/json writes it (Ollama): compact, HTML characters escaped."""
    return dumps(obj).translate(_GO_ESCAPES)


class OllamaJSON(JSONResponse):
    media_type = "application/json; charset=utf-8"

    def render(self, content: Any) -> bytes:
        return go_dumps(content).encode("utf-8")


COMPONENTS: dict[str, dict] = {}  # request schemas, merged into the OpenAPI document


def request_body(schema: type[BaseModel]) -> dict:
    """`openapi_extra` documenting a JSON body we parse ourselves (to answer 400, not 422)."""
    doc = schema.model_json_schema(ref_template="#/components/schemas/{model}")
    COMPONENTS.update(doc.pop("$defs", {}))
    COMPONENTS[schema.__name__] = doc
    ref = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def parse_body(request: Request, schema: type[BaseModel]) -> Any:
    """The request's JSON body validated against `schema`; any problem is a 400."""
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if not _union_tag(p))
        msg = first["msg"]
        if first["type"] == "missing":
            msg = "is required"
        raise ApiError(400, f"'{where}': {msg}" if where else msg, param=where or None) from None


def _union_tag(part: Any) -> bool:
    """pydantic puts union members ('str', 'list[ContentPart]', 'StreamOptions') into error locations."""
    if isinstance(part, int):
        return False
    return "[" in part or part in ("str", "int", "float", "bool", "none") or part[:1].isupper()


def _one_line(err: BaseException) -> str:
    return str(err).splitlines()[0][:200]


def finite(value: float | None, name: str) -> None:
    if value is not None and not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number", param=name)


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


# --- running jobs ------------------------------------------------------------------
async def start_job(request: Request, job_request) -> Job:
    """Queue a job for `job_request` (`engine.requests`) and wait until the worker has
    accepted (tokenized, validated) it; `job.prepared` then says what it made of it."""
    job = Job(job_request, asyncio.get_running_loop())
    try:
        request.app.state.tk.picked().scheduler.submit(job)  # the model the route picked (`ServerState.pick`)
    except Unavailable as err:
        raise as_api_error(err) from None
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        kind, value = await job.next_event()
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if kind == ERROR:
        raise as_api_error(value)
    assert kind == ACCEPTED
    return job


class JobGroup:
    """The jobs of one request's `n` choices (choice i is job i)."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    async def events(self) -> AsyncIterator[tuple[int, str, Any]]:
        """(choice, kind, value) of every job as they come, until each has ended."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, job: Job) -> None:
            async for kind, value in events(job):
                await queue.put((i, kind, value))

        tasks = [asyncio.create_task(pump(i, j)) for i, j in enumerate(self.jobs)]
        try:
            ended = 0
            while ended < len(self.jobs):
                i, kind, value = await queue.get()
                ended += kind in (DONE, ERROR)
                yield i, kind, value
        finally:
            for t in tasks:
                t.cancel()


async def start_choices(request: Request, job_request, n: int) -> JobGroup:
    """`n` jobs of one request, choice i seeded with seed + i (`engine.requests.seeded`).
    The first is prefilled before the others start, so they take its whole prompt (and
    logits) from the prefix store."""
    first = await start_job(request, job_request)
    jobs = [first]
    try:
        if n > 1:
            await first.prefilled.wait()
            for i in range(1, n):
                jobs.append(await start_job(request, seeded(job_request, i)))
    except BaseException:
        JobGroup(jobs).cancel()
        raise
    return JobGroup(jobs)


async def collect_all(request: Request, group: JobGroup) -> list[tuple]:
    """`collect` of each choice's job, side by side."""
    return list(await asyncio.gather(*(collect(request, j) for j in group.jobs)))


async def collect(request: Request, job: Job):
    """All of a job's text, its stats and its tokens' logprobs, if asked (non-streaming answers)."""
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    parts, logprobs = [], []
    try:
        while True:
            kind, value = await job.next_event()
            if kind == PIECE:
                parts.append(value)
            elif kind == LOGPROB:
                logprobs.append(value)
            elif kind == DONE:
                return "".join(parts), value, logprobs
            elif kind == ERROR:
                raise as_api_error(value)
    finally:
        watcher.cancel()
        job.cancel()  # no-op once done; stops the worker if we leave early


async def run_task(scheduler, work: Callable[[Any, Callable[[], None]], Any], request: Request | None = None) -> Any:
    """`work(model, pause)` run on `scheduler`'s worker (which owns the model) as a `Task`,
    after the tasks before it: its result, or its error as an `ApiError`. With `request`,
    the client going away cancels it (at its next `pause()`)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(value: Any, err: BaseException | None) -> None:
        if done.done():
            return
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(value)

    def post(value: Any, err: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(settle, value, err)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    task = Task(lambda model, pause: post(work(model, pause)), lambda err: post(None, err))
    try:
        scheduler.submit_task(task)
    except Unavailable as err:
        raise as_api_error(err) from None
    watcher = asyncio.create_task(_watch_disconnect(request, task)) if request is not None else None
    try:
        return await done
    except Exception as err:  # noqa: BLE001 - the request's error
        raise as_api_error(err) from None
    finally:
        task.cancel()  # no-op once done; stops the worker at its next pause if we leave early
        if watcher is not None:
            watcher.cancel()


async def prepare_only(scheduler, job_request):
    """`engine.requests.prepare` of a request on `scheduler`'s worker (which owns the model),
    without running it: the `Prepared` job, whose `ids` are the prompt's tokens (what the
    token-counting routes answer). A bad request raises its `ApiError`."""
    return await run_task(scheduler, lambda model, pause: prepare(model, job_request))


async def events(job: Job) -> AsyncIterator[tuple[str, Any]]:
    """A job's PIECE (and LOGPROB) events, then one DONE or ERROR event."""
    while True:
        kind, value = await job.next_event()
        yield kind, value
        if kind in (DONE, ERROR):
            return


async def _watch_disconnect(request: Request, job: Job | Task) -> None:
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel()
                return
    except (asyncio.CancelledError, Exception):
        return


class JobStream(StreamingResponse):
    """A streamed answer that stops its job when the client goes away.

    It always listens for `http.disconnect` while streaming (whatever ASGI
    version the server speaks), so a client that vanishes during a long prefill
    or in the queue is noticed too, not only at the next write.
    """

    def __init__(self, job: Job, content: AsyncIterator[str], media_type: str):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type=media_type, headers=headers)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client is gone
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self.job.cancel()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
