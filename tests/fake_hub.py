"""A hub-like HTTP server on loopback, for pull tests without a network.

It answers what huggingface_hub asks the real hub for:

- ``HEAD/GET {hub}/{repo}/resolve/{rev}/{file}``: 302 to the CDN origin with
  X-Repo-Commit, ETag (a git oid), X-Linked-Etag (the LFS sha256) and
  X-Linked-Size; 404 with X-Error-Code EntryNotFound / RepoNotFound otherwise.
- ``GET {hub}/api/models/{repo}/revision/{rev}``: the repo's sha and siblings.
- ``HEAD/GET {cdn}/lfs/{sha256}``: the bytes, with ``Range: bytes=N-`` answered
  by 206 and Content-Range, optionally throttled, optionally corrupted.

The CDN is a second origin (another port), as on the real hub, so the client
stops at the 302 and reads the file's metadata from it.

    with FakeHub() as hub:
        hub.add("owner/repo", "model.gguf", data)
        env = {"HF_ENDPOINT": hub.url}
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self):
        self.files: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> bytes the CDN serves
        self.requests: list[dict] = []  # {origin, method, path, range}
        self.rate: float | None = None  # bytes/s the CDN sends at, None = unthrottled
        self.corrupt = False  # flip one byte of what the CDN sends
        self.lock = threading.Lock()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        for server in (self.hub, self.cdn):
            server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def add(self, repo: str, file: str, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.files[(repo, file)] = data
        self.blobs[sha] = data
        return sha

    def log(self, **item) -> None:
        with self.lock:
            self.requests.append(item)

    def gets(self, origin: str = "cdn") -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["origin"] == origin and r["method"] == "GET"]

    def __enter__(self) -> "FakeHub":
        for server in (self.hub, self.cdn):
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()


def _handler(hub: FakeHub, origin: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._answer(head=True)

        def do_GET(self):
            self._answer(head=False)

        def _answer(self, head: bool):
            path = unquote(urlsplit(self.path).path)
            hub.log(origin=origin, method=self.command, path=path, range=self.headers.get("Range"))
            try:
                if origin == "hub":
                    self._hub(path, head)
                else:
                    self._cdn(path, head)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _empty(self, status: int, headers: dict) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _hub(self, path: str, head: bool):
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and "revision" in parts:
                i = parts.index("revision")
                repo = "/".join(parts[2:i])
                files = [f for (r, f) in hub.files if r == repo]
                if not files:
                    return self._empty(404, {"X-Error-Code": "RepoNotFound"})
                body = json.dumps({"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, file = "/".join(parts[:2]), "/".join(parts[4:])
                if not any(r == repo for (r, _) in hub.files):
                    return self._empty(404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
                data = hub.files.get((repo, file))
                if data is None:
                    return self._empty(
                        404,
                        {
                            "X-Error-Code": "EntryNotFound",
                            "X-Repo-Commit": COMMIT,
                            "X-Error-Message": "Entry not found",
                        },
                    )
                sha = hashlib.sha256(data).hexdigest()
                oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                return self._empty(
                    302,
                    {
                        "Location": f"{hub.cdn_url}/lfs/{sha}?X-Amz-Signature=fake",
                        "X-Repo-Commit": COMMIT,
                        "ETag": f'"{oid}"',
                        "X-Linked-Etag": f'"{sha}"',
                        "X-Linked-Size": len(data),
                        "Accept-Ranges": "bytes",
                    },
                )
            self._empty(404, {})

        def _cdn(self, path: str, head: bool):
            parts = path.strip("/").split("/")
            data = hub.blobs.get(parts[-1]) if parts[0] == "lfs" else None
            if data is None:
                return self._empty(404, {})
            if hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:] if len(data) < 2 else data[:-1] + bytes([data[-1] ^ 0xFF])
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0] or 0)
            if start >= len(data) and data:
                return self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
            body = data[start:]
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{parts[-1]}"')
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            step = 64 * 1024
            for i in range(0, len(body), step):
                self.wfile.write(body[i : i + step])
                if hub.rate:
                    time.sleep(step / hub.rate)

    return Handler
