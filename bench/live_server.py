"""`tightkv serve` of the embedded model on loopback for the bench scripts that drive a live server."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request


def serve(port: int, ctx: int) -> subprocess.Popen:
    """Start the server on the embedded model, pinned (2 threads, no prompt files on disk), and
    wait until /health answers 200. Pinned: a fuzzed DELETE /api/delete cannot remove it from
    the user's store, as it could with `serve` of the whole store."""
    from tightkv.registry import DEFAULT_MODEL

    cmd = [
        sys.executable,
        "-m",
        "tightkv.cli",
        "serve",
        DEFAULT_MODEL,
        "--port",
        str(port),
        "--ctx",
        str(ctx),
        "--threads",
        "2",
        "--cache-disk",
        "0",
        "--log-level",
        "error",
    ]
    return start(cmd, port)


def start(cmd: list[str], port: int, timeout: float = 180) -> subprocess.Popen:
    """Run a server command and wait until its /health on 127.0.0.1:port answers 200."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become ready")
