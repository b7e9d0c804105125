"""Progress on stderr for the long work: prefill of a document, RLV reads, ppl, bench, niah.

On a terminal it is a tqdm bar, redrawn in place. Anywhere else (a pipe, a log
file) it writes plain lines, never a carriage return: one when another tenth of
the work is done or `TIGHTKV_PROGRESS_SECONDS` (default 10) seconds have
passed since the last one, and a summary line at the end:

    perplexity chunk 2/3:  41% 1918/4605 tok  410 tok/s  6.6s left  f16 14.262
    perplexity: 3 chunks x 1 KV type, 4605 tok in 11s (408 tok/s)  f16 14.108
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO

EVERY_ENV = "TIGHTKV_PROGRESS_SECONDS"
DEFAULT_EVERY = 10.0


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get(EVERY_ENV, DEFAULT_EVERY)))
    except ValueError:
        return DEFAULT_EVERY


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def duration(seconds: float) -> str:
    """12.3s under a minute, then 4m05s, then 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


class Progress:
    """`total` units of work (`unit`, e.g. tokens) under a label that may change
    (`describe`), with a short postfix (`note`, e.g. the running perplexity).

    `update(n)` adds n done; `close()` ends it: on a terminal the bar stays as
    its last state when `leave`, and the summary line is written in either case
    unless `summary=False`. `enabled=False` writes nothing at all.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "tok",
        stream: IO[str] | None = None,
        enabled: bool = True,
        leave: bool = False,
        summary: bool = True,
    ):
        self.label, self.total, self.unit = label, int(total), unit
        self.stream = stream or sys.stderr
        self.enabled, self.leave, self.summary = enabled, leave, summary
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.n, self.desc, self.postfix = 0, label, ""
        self.detail = ""  # said in the summary line before the count, e.g. "3 chunks x 2 KV types"
        self.start = time.monotonic()
        self.last_line, self.last_tenth = self.start, 0
        self.every = _every()
        self.closed = False
        self.bar = None
        if enabled and self.tty:
            from tqdm import tqdm

            sized = _columns(self.stream) > 0  # a pty may report 0x0, where tqdm would draw nothing
            self.bar = tqdm(
                total=self.total,
                desc=label,
                unit=unit,
                file=self.stream,
                leave=leave,
                mininterval=0.5,
                dynamic_ncols=sized,
                **({} if sized else {"ncols": 80, "nrows": 24}),
            )

    # --- feeding it ------------------------------------------------------------
    def describe(self, desc: str) -> None:
        self.desc = desc
        if self.bar is not None:
            self.bar.set_description(desc, refresh=False)

    def note(self, postfix: str) -> None:
        self.postfix = postfix
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled or self.closed:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        tenth = int(10 * self.n / self.total) if self.total else 0
        if self.n < self.total and (tenth > self.last_tenth or now - self.last_line >= self.every):
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()
            self.last_line, self.last_tenth = now, tenth

    def advance_to(self, done: int) -> None:
        """Set the count done so far (for callbacks that report a running total)."""
        if done > self.n:
            self.update(done - self.n)

    # --- text ------------------------------------------------------------------
    def rate(self, now: float | None = None) -> float:
        elapsed = (now or time.monotonic()) - self.start
        return self.n / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """One progress line: label, percent, count, rate, time left, postfix."""
        rate = self.rate(now)
        pct = int(100 * self.n / self.total) if self.total else 100
        left = f"  {duration((self.total - self.n) / rate)} left" if rate > 0 and self.n < self.total else ""
        tail = f"  {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {pct:3d}% {self.n}/{self.total} {self.unit}  {rate:.0f} {self.unit}/s{left}{tail}"

    def summary_line(self) -> str:
        elapsed = time.monotonic() - self.start
        tail = f"  {self.postfix}" if self.postfix else ""
        what = f"{self.detail}, " if self.detail else ""
        return (
            f"{self.label}: {what}{self.n} {self.unit} in {duration(elapsed)} ({self.rate():.0f} {self.unit}/s){tail}"
        )

    def close(self, summary: bool = True) -> None:
        """End the bar; the summary line comes unless summary=False (or the
        constructor's summary=False)."""
        if self.closed:
            return
        self.closed = True
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.summary and summary:
            self.stream.write(self.summary_line() + "\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(summary=kind is None)  # no summary for work that failed or was interrupted
