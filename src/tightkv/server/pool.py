"""The models one server serves, by name, as Ollama does: `tightkv serve` (no model)
serves every model in the store, each loaded on its first request (a registry name not
pulled yet is pulled first, its progress in the log), kept `keep_alive` seconds once idle,
and evicted least recently used when the next one would not fit `--mem`; `tightkv serve
MODEL` serves that one model, loaded at start and pinned.

Each model is a `Resident`: its names and listing (`app.ServedModel`) and its `Scheduler`
(its own worker thread: the model is only touched there). A model's memory is what `plan`
counts: its weights, the working buffers and its KV cache at its context
(`autokv.footprint`); the runtime's own bytes count once. An eviction only ever unloads an idle
model, on its own worker; a load waits until enough idle models are out, or fails at once
when the model could never fit beside the pinned ones.
"""

from __future__ import annotations

import logging
import threading
import time

from .http import ApiError
from .scheduler import Scheduler, Unavailable

log = logging.getLogger("tightkv.server")

DEFAULT_KEEP_ALIVE = 300.0  # Ollama's: 5 minutes
EVICT_POLL_S = 0.1  # how often a waiting load looks again for room


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class Resident:
    """One model of the server: `served` (its names, its listing), `scheduler` (its worker),
    whether it is `pinned` (never evicted), and the bytes it holds while loaded."""

    def __init__(self, served, scheduler: Scheduler, pinned: bool):
        self.served, self.scheduler, self.pinned = served, scheduler, pinned
        self.footprint = 0  # bytes, once a load has claimed them
        self.holds = False  # loaded or loading: its footprint is spent

    @property
    def id(self) -> str:
        return self.served.id

    def released(self) -> None:
        """Its model is gone (unloaded, or its load failed): its bytes are free again."""
        self.holds = False


class ModelPool:
    """The residents by name, and the memory they share (`--mem`; None: no limit)."""

    def __init__(self, memory: int | None):
        from ..autokv import runtime_bytes

        self.memory = memory
        self.runtime = runtime_bytes()
        self.residents: dict[str, Resident] = {}
        self.lock = threading.Lock()
        self.started = False

    def add(self, resident: Resident) -> Resident:
        with self.lock:
            self.residents[resident.id] = resident
            if self.started:
                resident.scheduler.start()
        resident.scheduler.on_unload.append(resident.released)
        return resident

    def remove(self, resident: Resident) -> None:
        """Stop serving `resident` (its worker ends; its model is freed with it)."""
        with self.lock:
            self.residents.pop(resident.id, None)
        resident.scheduler.stop(timeout=5.0)
        resident.scheduler.model = resident.scheduler.batch = None
        resident.released()

    def find(self, name: str | None) -> Resident | None:
        with self.lock:
            found = list(self.residents.values())
        return next((r for r in found if r.served.knows(name)), None)

    def all(self) -> list[Resident]:
        with self.lock:
            return list(self.residents.values())

    def start(self) -> None:
        with self.lock:
            self.started = True
            residents = list(self.residents.values())
        for r in residents:
            r.scheduler.start()

    def stop(self, timeout: float) -> None:
        for r in self.all():
            r.scheduler.stop(timeout=timeout)

    # --- memory (on the loading model's worker) --------------------------------------
    def make_room(self, resident: Resident, need: int) -> None:
        """Claim `need` bytes for `resident`: evict idle unpinned models, least recently used
        first, until it fits (waiting while the others are busy); a 400 `ApiError` when it
        could never fit beside the pinned models."""
        resident.footprint = need
        if self.memory is None:
            resident.holds = True
            return
        asked: set[str] = set()
        while True:
            with self.lock:
                others = [r for r in self.residents.values() if r is not resident and r.holds]
                used = self.runtime + sum(r.footprint for r in others)
                if used + need <= self.memory:
                    resident.holds = True
                    return
                pinned = self.runtime + sum(r.footprint for r in others if r.pinned)
            if pinned + need > self.memory:  # a request that cannot be served here, ever: a 4xx, not a retry
                raise ApiError(
                    400,
                    f"model '{resident.id}' needs {gib(need)} (weights, buffers and its KV cache at its context) "
                    f"beside {gib(pinned)} always held, more than --mem {gib(self.memory)}; raise --mem, or "
                    "lower its context (num_ctx) or its KV type (kv_cache_type)",
                    param="model",
                    code="model_too_large",
                )
            idle = sorted(
                (r for r in others if not r.pinned and r.scheduler.loaded and r.scheduler.idle()),
                key=lambda r: r.scheduler.last_used,
            )
            if idle:
                if idle[0].id not in asked:
                    log.warning("evicting %s (least recently used) to make room for %s", idle[0].id, resident.id)
                    asked.add(idle[0].id)
                idle[0].scheduler.request_unload()
            time.sleep(EVICT_POLL_S)

    def used(self) -> int:
        """Bytes held by the loaded models and the runtime."""
        return self.runtime + sum(r.footprint for r in self.all() if r.holds)


async def ensure_loaded(resident: Resident, timeout: float = 600.0) -> None:
    """Load `resident`'s model if it is not loaded, and wait until it is (an error that
    its load raised is raised here)."""
    import asyncio

    sch = resident.scheduler
    if sch.state == "failed":
        raise Unavailable("the model failed to load")
    failures = sch.load_failures
    sch.load()
    deadline = time.monotonic() + timeout
    while sch.model is None or sch.state != "ready":
        if sch.state in ("failed", "stopped") or sch.load_failures > failures:
            err = sch.load_error or sch.error
            raise err if isinstance(err, Exception) else Unavailable("the model failed to load")
        if time.monotonic() > deadline:
            raise ApiError(503, "the model is still loading", "unavailable_error", headers={"Retry-After": "5"})
        await asyncio.sleep(0.05)


async def described(resident: Resident) -> None:
    """Its `served` knows the GGUF's metadata (its chat template among them): read from the
    header, or, for a model not pulled yet, once it is pulled and loaded."""
    import anyio

    if resident.served.path is None:
        await ensure_loaded(resident)
    await anyio.to_thread.run_sync(resident.served.read_header)
