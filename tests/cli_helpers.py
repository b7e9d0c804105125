"""Helpers for the CLI and registry tests: a private TIGHTKV_HOME, the CLI in a
subprocess (with a timeout, killed if it hangs), and a real terminal (pty)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REAL_HOME = Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[=>]")


def private_home(root: Path) -> Path:
    """A fresh TIGHTKV_HOME that shares the compiled kernels of the real one."""
    home = root / "tkhome"
    home.mkdir(parents=True, exist_ok=True)
    kernels = REAL_HOME / "kernels"
    if kernels.is_dir() and not (home / "kernels").exists():
        (home / "kernels").symlink_to(kernels, target_is_directory=True)
    return home


def seed_embedded(home: Path) -> None:
    """Put the embedded model into `home` without assembling it again: link the
    real store's blob (it is put there once, by the first test that needs it)."""
    from tightkv import registry

    saved = os.environ.get("TIGHTKV_HOME")
    os.environ["TIGHTKV_HOME"] = str(REAL_HOME)
    try:
        src = registry.resolve(registry.DEFAULT_MODEL, quiet=True)
    finally:
        if saved is None:
            os.environ.pop("TIGHTKV_HOME", None)
        else:
            os.environ["TIGHTKV_HOME"] = saved
    dst = home / "blobs" / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        try:
            os.link(src, dst)
        except OSError:
            dst.symlink_to(src)


def cli(*args: str, env: dict | None = None, timeout: float = 180, input: str | None = None):
    """Run `python -m tightkv.cli ARGS` and return the CompletedProcess; a child that
    hangs (e.g. at exit) is killed after `timeout` seconds."""
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tightkv.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"tightkv {' '.join(args)} timed out after {timeout}s; stderr: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_one_line_error(r, *needles: str) -> str:
    """A non-zero exit whose stderr ends with exactly one 'error: ...' line, no traceback."""
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), r.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


class Terminal:
    """A child process on a pseudo-terminal, driven like a user at a keyboard."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: stdin, stdout and stderr are the terminal
            try:
                os.execvpe(argv[0], argv, dict(os.environ, TERM="xterm", **(env or {})))
            finally:
                os._exit(127)
        self.raw = b""
        self.mark = 0  # `expect` searches the output after this point
        self.status: int | None = None

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace")).replace("\r", "")

    def _pump(self, seconds: float) -> bool:
        r, _, _ = select.select([self.fd], [], [], seconds)
        if not r:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            return False
        if not data:
            return False
        self.raw += data
        return True

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        """Wait for a regex in the output since the last match; move past it."""
        rx = re.compile(pattern, re.MULTILINE)
        end = time.monotonic() + timeout
        while True:
            m = rx.search(self.text, self.mark)
            if m:
                self.mark = m.end()
                return m
            if time.monotonic() > end or not self._pump(min(0.2, max(0.0, end - time.monotonic()))):
                m = rx.search(self.text, self.mark)
                if m:
                    self.mark = m.end()
                    return m
                raise AssertionError(
                    f"no {pattern!r} within {timeout}s; output since the last match:\n{self.text[self.mark :][-3000:]}"
                )

    def send(self, data: str | bytes) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def line(self, text: str) -> None:
        self.send(text + "\r")

    def wait(self, timeout: float = 30) -> int:
        """The exit status; a child still alive after `timeout` is killed (and fails the test)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            self._pump(0.1)
        self.kill()
        raise AssertionError(f"the terminal's process did not exit within {timeout}s")

    def kill(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.status = -9
        try:
            os.close(self.fd)
        except OSError:
            pass
