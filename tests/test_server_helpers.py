"""Helpers for the server tests (no tests here): a live `tightkv serve`
subprocess on a free loopback port, and small raw-HTTP clients."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`tightkv serve ARGS` in a subprocess on 127.0.0.1, stopped with terminate-then-kill.

    One torch thread: on a busy shared machine, OpenMP worker threads waiting at
    barriers make two-thread decoding many times slower than one.
    """

    def __init__(self, *args: str, api_key: str | None = None, env: dict | None = None):
        self.port = free_port()
        self.host = "127.0.0.1"
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile(prefix="tightkv-serve-", suffix=".log", delete=False)
        cmd = [
            sys.executable,
            "-m",
            "tightkv.cli",
            "serve",
            *args,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        if "--threads" not in args:
            cmd += ["--threads", "1"]
        if "--cache-disk" not in args:
            cmd += ["--cache-disk", "0"]  # no prompt files in the shared home unless a test asks
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> "LiveServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, _, _ = request(self, "GET", "/health", timeout=5)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # a hang at exit must not hang the tests
                self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)

    def headers(self, extra: dict | None = None) -> dict:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return {**h, **(extra or {})}


def request(
    server: LiveServer,
    method: str,
    path: str,
    body=None,
    headers: dict | None = None,
    timeout: float = 60.0,
    auth: bool = True,
) -> tuple[int, dict, bytes]:
    """One HTTP request; body: dict/list (sent as JSON), bytes or str (sent as is). -> (status, headers, raw body)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        h = server.headers(headers) if auth else {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post(server: LiveServer, path: str, body, **kw) -> tuple[int, dict]:
    status, _, raw = request(server, "POST", path, body, **kw)
    return status, json.loads(raw)


SSE_EVENT = re.compile(rb"data: ([^\n]+)\n\n")


def sse_events(raw: bytes) -> list:
    """Parse an SSE body, checking its framing byte for byte: only `data: <json>\\n\\n`
    events, the last one `data: [DONE]\\n\\n`. Returns the JSON payloads."""
    pos, out = 0, []
    while pos < len(raw):
        m = SSE_EVENT.match(raw, pos)
        assert m, f"bad SSE framing at byte {pos}: {raw[pos : pos + 80]!r}"
        out.append(m.group(1))
        pos = m.end()
    assert out and out[-1] == b"[DONE]", "an SSE stream must end with data: [DONE]"
    assert b"[DONE]" not in out[:-1]
    return [json.loads(x) for x in out[:-1]]


def ndjson_records(raw: bytes) -> list[dict]:
    """Parse NDJSON: one compact JSON object per '\\n'-terminated line, no blank lines."""
    assert raw.endswith(b"\n"), "NDJSON must end with a newline"
    lines = raw[:-1].split(b"\n")
    records = []
    for line in lines:
        assert line and not line.startswith(b" ") and b"\r" not in line, f"bad NDJSON line {line!r}"
        rec = json.loads(line)
        assert isinstance(rec, dict)
        records.append(rec)
    return records


def metrics(server: LiveServer) -> dict[str, float]:
    status, _, raw = request(server, "GET", "/metrics")
    assert status == 200
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("tightkv:")] = float(value)
    return out


def wait_idle(server: LiveServer, timeout: float = 30.0) -> dict[str, float]:
    """Wait until no request is processing or waiting; return the metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(server)
        if m["requests_processing"] == 0 and m["requests_deferred"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"server still busy after {timeout} s: {m}")
        time.sleep(0.05)


def stream_socket(server: LiveServer, path: str, body: dict, timeout: float = 60.0) -> socket.socket:
    """Send a POST on a raw socket and return it, unread."""
    payload = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {server.host}:{server.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if server.api_key:
        head.append(f"Authorization: Bearer {server.api_key}")
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    return sock


def read_until(sock: socket.socket, needle: bytes, count: int = 1, limit: int = 1 << 20) -> bytes:
    """Read from a socket until `needle` was seen `count` times."""
    data = b""
    while data.count(needle) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        assert len(data) < limit
    return data


def hard_close(sock: socket.socket, reset: bool) -> None:
    """Close as a killed process would: with an RST (SO_LINGER 0) or a plain FIN."""
    import struct

    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@contextlib.contextmanager
def running(*args: str, timeout: float = 180.0, **kw):
    """A LiveServer of ARGS, ready, stopped on the way out (a module fixture's body)."""
    srv = LiveServer(*args, **kw)
    try:
        yield srv.wait_ready(timeout)
    finally:
        srv.stop()


def openai_client(server: LiveServer, timeout: float = 120):
    """The official openai client on a live server (no retries: a test sees every answer)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
