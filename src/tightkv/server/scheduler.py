"""One worker thread owns the model; requests wait in a bounded FIFO queue.

The model is not thread-safe, so everything that touches it (loading,
tokenizing, prefill, decode) runs on the worker thread. Up to `parallel`
requests are active at once, batched continuously by the engine
(`engine.batch.Batch`: each step one prefill chunk of the oldest request still
reading its prompt and one token of every other); this module holds only the
thread, the queue and the jobs, and posts each step's events to their jobs. A
new prompt is thus read a chunk at a time between decode steps, and running
streams keep flowing. The rest wait in arrival order. When `max_queue` requests
are already waiting, `submit` refuses (the HTTP layer answers 503 with Retry-After).

A request is a `Job` over a protocol-neutral request (`engine.requests`): the
HTTP side awaits its events on an asyncio queue, the worker posts them with
`loop.call_soon_threadsafe`; once ACCEPTED, `job.prepared` says what the worker
made of it. `Job.cancel()` (a client
went away) is seen by the worker before the job's next token: its generator is
closed and its KV cache dropped at once.

Other model work (a document's load, a question about it: `server.documents`) is
a `Task`, run on the worker one at a time, in arrival order. A task calls its
`pause()` between two pieces of work (a prefill chunk, a token); the active jobs
then take steps for as long as the task's last piece took, so a long document
load shares the model with running streams instead of stopping them, and the
model still runs on one thread only.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.batch import ACCEPTED, DONE, ERROR, LOGPROB, PIECE, PREFILLED, Batch, Slot
from ..engine.requests import Prepared

log = logging.getLogger("tightkv.server")

RELEASE_AFTER_S = 2.0  # idle this long, the worker hands freed heap pages back to the OS
__all__ = ["ACCEPTED", "DONE", "ERROR", "LOGPROB", "PIECE", "Cancelled", "Job", "Scheduler", "Task", "Unavailable"]


class Unavailable(Exception):
    """The server cannot take the job now (loading, failed, or queue full)."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class Cancelled(Exception):
    """The job was cancelled (its client went away) before it finished."""


class Job:
    """One generation request, shared between the event loop and the worker: `request`
    (an `engine.requests.ChatRequest` or `TextRequest`) is prepared on the worker."""

    def __init__(self, request, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.created = time.perf_counter()
        self.prompt: list[int] = []
        self.prepared: Prepared | None = None  # set before ACCEPTED is posted
        self.slot: Slot | None = None  # its place in the engine's batch, while active
        self.load_seconds = 0.0  # how long it waited for its model to load (Ollama's load_duration)
        self._cancelled = threading.Event()
        self.prefilled = asyncio.Event()  # set once its prompt is in its cache (or it ended)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def mark_prefilled(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.prefilled.set)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    def post(self, kind: str, value: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (shutdown)
            self.cancel()

    async def next_event(self) -> tuple[str, Any]:
        return await self.events.get()


@dataclass
class Task:
    """Model work other than a generation, run on the worker: `run(model, pause)`, which
    calls `pause()` between pieces of its work (the jobs take their turn there, and a
    cancelled task or a stopping server raises out of it); `fail(error)` is told when it
    could not run or did not finish."""

    run: Callable[[Any, Callable[[], None]], None]
    fail: Callable[[BaseException], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    """Loads the model on its worker thread, then runs jobs fairly (and tasks in turn).

    A `lazy` scheduler takes jobs at once and loads its model when the first one comes (the
    job waits meanwhile); `request_unload()` frees an idle model (a server short of memory
    for another one), never one with a job or task in flight."""

    def __init__(
        self,
        load: Callable[[], Any],
        parallel: int = 4,
        max_queue: int = 32,
        on_ready: Callable[[Any], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        cache_ram: int | None = None,
        cache_disk: int = 0,
        cache_disk_tokens: int = 1024,
        lazy: bool = False,
        name: str = "model",
    ):
        if parallel < 1 or max_queue < 0:
            raise ValueError("parallel must be >= 1 and max_queue >= 0")
        self._load = load
        self.lazy, self.name = lazy, name
        self.cache_ram = cache_ram  # the prefix store's RAM budget in bytes (None: the default, 0: off)
        self.cache_disk, self.cache_disk_tokens = cache_disk, cache_disk_tokens  # its disk budget (0: off)
        self.batch: Batch | None = None  # the engine's batch (and prefix store), made once the model is loaded
        self.parallel = parallel
        self.max_queue = max_queue
        self._on_ready = on_ready
        self._on_failure = on_failure
        self.model = None
        self.state = "loading"  # -> "ready" | "failed" | "stopped"
        self.error: BaseException | None = None
        self._cv = threading.Condition()
        self._inbox: collections.deque[Job] = collections.deque()
        self._waiting: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        self._tasks: collections.deque[Task] = collections.deque()
        self._turn = 0.0  # when the running task's current piece of work began
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tightkv-worker", daemon=True)
        self._job_seconds = 2.0  # running mean, for Retry-After
        self.served = 0
        self.tokens = 0
        self.drafted = self.draft_accepted = 0  # speculation's draft tokens, and those accepted
        self.cancelled = 0
        self._counts = (0, 0, 0)  # the batch counters of an unloaded model's batch
        self.keep_alive: float | None = None  # seconds the model stays loaded once idle (None: forever)
        self._want_load = False
        self._want_unload = False
        self.loading = False  # a load is under way on the worker
        self.load_failures, self.load_error = 0, None  # a lazy load's failures, the last one's error
        self.last_used = time.monotonic()
        self.on_unload: list[Callable[[], None]] = []  # told when the model is unloaded

    # --- event-loop side ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise `Unavailable`."""
        with self._cv:
            self._check_room()
            self._inbox.append(job)
            self._cv.notify()

    def submit_task(self, task: Task) -> None:
        """Queue a task (run after those before it), or raise `Unavailable`."""
        with self._cv:
            self._check_room()
            self._tasks.append(task)
            self._cv.notify()

    def _check_room(self) -> None:
        """Raise `Unavailable` unless the model is ready and the queue has room (lock held)."""
        if self.state == "loading":
            raise Unavailable("Loading model", retry_after=1)
        if self.state != "ready":
            raise Unavailable("the model is not available")
        held = len(self._active) + len(self._inbox) + len(self._waiting) + len(self._tasks)
        if held >= self.parallel + self.max_queue:
            raise Unavailable("the server is busy: too many requests are waiting", self.retry_after())

    def set_keep_alive(self, seconds: float | None) -> None:
        """How long the model stays loaded once idle (Ollama's keep_alive; 0: unload now,
        None: forever). An unloaded model (weights, caches, prefix store freed) loads again
        on the worker when the next request comes."""
        with self._cv:
            self.keep_alive = None if seconds is None else min(seconds, 1e9)
            self.last_used = time.monotonic()
            self._cv.notify()

    def load(self) -> None:
        """Load the model again if keep_alive unloaded it (Ollama's empty request)."""
        with self._cv:
            self._want_load = True
            self._cv.notify()

    def request_unload(self) -> None:
        """Unload the model as soon as it is idle (now, if it is); a job that comes first
        keeps it loaded."""
        with self._cv:
            self._want_unload = True
            self._cv.notify()

    def idle(self) -> bool:
        """No job or task waiting or running."""
        with self._cv:
            return not (self._inbox or self._waiting or self._active or self._tasks)

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def expires_in(self) -> float | None:
        """Seconds until an idle model unloads (None: never)."""
        if self.keep_alive is None:
            return None
        return max(0.0, self.last_used + self.keep_alive - time.monotonic())

    def retry_after(self) -> int:
        waiting = len(self._inbox) + len(self._waiting)
        return max(1, min(60, round(self._job_seconds * (1 + waiting) / self.parallel)))

    @property
    def processing(self) -> int:
        return len(self._active)

    @property
    def deferred(self) -> int:
        return len(self._inbox) + len(self._waiting)

    def kv_bytes(self) -> int:
        total = 0
        for job in list(self._active):
            cache = job.slot.cache if job.slot is not None else None
            if cache:
                total += sum(c.nbytes for c in cache)
        return total

    @property
    def batch_size(self) -> int:
        """Sequences in the last batched decode step."""
        return self.batch.batch_size if self.batch is not None else self._counts[0]

    @property
    def decode_steps(self) -> int:
        """Batched forward passes so far."""
        return self._counts[1] + (self.batch.decode_steps if self.batch is not None else 0)

    @property
    def decode_rows(self) -> int:
        """The tokens those passes carried."""
        return self._counts[2] + (self.batch.decode_rows if self.batch is not None else 0)

    def prefix_stats(self) -> dict:
        """The prefix store's entries, bytes, budget and hits (zeros when it is off)."""
        return (self.batch or Batch(None)).prefix_stats()

    # --- worker side -------------------------------------------------------
    def _run(self) -> None:
        try:
            if not self.lazy:
                self._load_model()
        except Exception as err:  # noqa: BLE001 - reported, then the server stops
            with self._cv:
                self.state, self.error = "failed", err
            if self._on_failure:
                self._on_failure(err)
            return
        with self._cv:
            self.state = "ready"
        try:
            self._serve()
        finally:
            with self._cv:
                self.state = "stopped"
                jobs = list(self._inbox) + list(self._waiting) + self._active
                tasks = list(self._tasks)
                self._inbox.clear(), self._waiting.clear(), self._tasks.clear()
                self._active = []
            for job in jobs:
                _close(job)
                job.post(ERROR, Unavailable("the server is shutting down"))
            for task in tasks:
                task.fail(Unavailable("the server is shutting down"))

    def _load_model(self) -> None:
        """Load the model and its batch; they are seen (`model` set) only once its listing
        knows it too (`on_ready`), so a request that waited for the load reads them whole."""
        self.loading = True
        try:
            model = self._load()
            batch = Batch.for_model(model, self.cache_ram, self.cache_disk, self.cache_disk_tokens, notice=log.warning)
            if self._on_ready:
                self._on_ready(model)
            self.model, self.batch = model, batch
        finally:
            self.loading = False
        self.last_used = time.monotonic()

    def _reload(self) -> None:
        began = time.perf_counter()
        try:
            self._load_model()
            with self._cv:
                for job in self._inbox:
                    job.load_seconds = time.perf_counter() - began
        except Exception as err:  # noqa: BLE001 - the waiting requests get the error
            self.model = self.batch = None
            self.load_error, self.load_failures = err, self.load_failures + 1
            log.warning("%s failed to load: %s", self.name, err)
            for hook in self.on_unload:
                hook()
            with self._cv:
                jobs, tasks = list(self._inbox), list(self._tasks)
                self._inbox.clear(), self._tasks.clear()
            for job in jobs:
                job.post(ERROR, err)
            for task in tasks:
                task.fail(err)

    def _unload(self, why: str = "keep_alive") -> None:
        """Free the model, its caches and the prefix store (keep_alive ran out, or the
        memory is wanted for another model)."""
        if self.batch is not None:
            self._counts = (0, self.decode_steps, self.decode_rows)
        self.model = self.batch = None
        for hook in self.on_unload:
            hook()
        _release_memory()
        log.warning("%s unloaded (%s); the next request loads it again", self.name, why)

    def _has_work(self) -> bool:
        return bool(self._inbox or self._waiting or self._active or self._tasks or self._stop or self._want_load)

    def _serve(self) -> None:
        released = True
        while True:
            if not released:  # idle for RELEASE_AFTER_S: give freed memory back (never in a request's way)
                with self._cv:
                    if not self._has_work():
                        self._cv.wait(RELEASE_AFTER_S)
                    idle = not self._has_work()
                if idle:
                    _release_memory()
                    released = True
            with self._cv:
                while not self._has_work():
                    if self.loaded and (self.expires_in() == 0 or self._want_unload):
                        self._unload("keep_alive" if not self._want_unload else "evicted")
                    self._want_unload = False
                    left = self.expires_in() if self.loaded else None
                    self._cv.wait(left)
                if self._stop:
                    return
                self._want_unload = False  # work came first: the model stays
                want, self._want_load = self._want_load, False
                want = want or bool(self._inbox or self._tasks)
            if want and not self.loaded:
                self._reload()
                if not self.loaded:
                    continue
            self._tick()
            released = False
            with self._cv:
                task = self._tasks.popleft() if self._tasks else None
            if task is not None:
                self._run_task(task)

    def _tick(self) -> None:
        """Take in the new jobs, admit those with a slot, and run one step."""
        with self._cv:
            new = list(self._inbox)  # they stay counted in the inbox while prepared
        for job in new:
            self._prepare(job)
        self._admit()
        self._step()

    def _busy(self) -> bool:
        with self._cv:
            return bool(self._inbox or self._waiting or self._active)

    def _run_task(self, task: Task) -> None:
        """Run a task to its end; the jobs take their turns at its pauses."""
        self._turn = time.perf_counter()
        try:
            if task.cancelled.is_set():
                raise Cancelled("cancelled")
            task.run(self.model, lambda: self._pause(task))
        except Exception as err:  # noqa: BLE001 - the task's error, not the server's
            task.fail(err)
        finally:
            self.last_used = time.monotonic()

    def _pause(self, task: Task) -> None:
        """Between two pieces of a task: the jobs step for as long as the task's last piece
        took (half the time each while both have work); then the task goes on, unless it
        was cancelled or the server is stopping."""
        worked = time.perf_counter() - self._turn
        until = time.perf_counter() + worked
        while not self._stop and self._busy() and time.perf_counter() < until:
            self._tick()
        if self._stop:
            raise Unavailable("the server is shutting down")
        if task.cancelled.is_set():
            raise Cancelled("cancelled")
        self._turn = time.perf_counter()

    def _prepare(self, job: Job) -> None:
        """Tokenize and validate a new job; a bad request fails here, before it waits."""
        if job.cancelled:
            self.cancelled += 1
            self._leave_inbox(job)
            job.post(ERROR, Cancelled("cancelled"))
            return
        try:
            prep = self.batch.prepare(job.request)
        except Exception as err:  # noqa: BLE001 - the request's error, not the server's
            self._leave_inbox(job)
            job.post(ERROR, err)
            return
        job.prompt, job.prepared = prep.ids, prep
        self._leave_inbox(job, to=self._waiting)
        job.post(ACCEPTED, len(prep.ids))

    def _leave_inbox(self, job: Job, to: collections.deque | None = None) -> None:
        """Move a job out of the inbox in one locked step, so `submit` never sees it uncounted."""
        with self._cv:
            self._inbox.remove(job)
            if to is not None:
                to.append(job)

    def _admit(self) -> None:
        with self._cv:
            for job in self._waiting:
                if job.cancelled:
                    self.cancelled += 1
                    job.post(ERROR, Cancelled("cancelled"))
            self._waiting = collections.deque(j for j in self._waiting if not j.cancelled)
            while self._waiting and len(self._active) < self.parallel:
                job = self._waiting.popleft()
                try:
                    job.slot = self.batch.start(job.prepared, owner=job)
                except Exception as err:  # noqa: BLE001
                    job.post(ERROR, err)
                    _close(job)
                    continue
                self._active.append(job)

    def _step(self) -> None:
        """Drop the cancelled jobs, run one step of the batch, post its events."""
        live = []
        for job in list(self._active):
            if job.cancelled:
                self.cancelled += 1
                job.post(ERROR, Cancelled("cancelled"))
                self._finish(job)
            else:
                live.append(job)
        for slot, kind, value in self.batch.step([j.slot for j in live]):
            job = slot.owner
            if kind == PREFILLED:
                job.mark_prefilled()
                continue
            job.post(kind, value)
            if kind == DONE:
                self.served += 1
                self.tokens += value.generated_tokens
                self.drafted += value.draft_n
                self.draft_accepted += value.draft_n_accepted
                seconds = time.perf_counter() - slot.started
                self._job_seconds = 0.8 * self._job_seconds + 0.2 * seconds
            if kind in (DONE, ERROR):
                self._finish(job)

    def _finish(self, job: Job) -> None:
        _close(job)
        self.last_used = time.monotonic()
        with self._cv:
            if job in self._active:
                self._active.remove(job)


def _close(job: Job) -> None:
    """Drop a job's sequence and its cache."""
    job.mark_prefilled()  # whoever waits on its prompt stops waiting
    if job.slot is not None:
        job.slot.close()


def _release_memory() -> None:
    """When idle: collect cycles and hand freed heap pages back to the OS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
