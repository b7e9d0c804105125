"""`tightkv serve` of the embedded model on loopback for the bench scripts that drive a live server."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request


def serve(port: int, ctx: int) -> subprocess.Popen:
    """Start the server (2 threads, no prompt files on disk) and wait until /health answers 200."""
    cmd = [sys.executable, "-m", "tightkv.cli", "serve", "--port", str(port), "--ctx", str(ctx), "--threads", "2",
           "--cache-disk", "0", "--log-level", "error"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become ready")
