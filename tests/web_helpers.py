"""Helpers for the document routes' and the web page's tests (no tests here): a document
with a planted fact, a tiny PDF written by hand, SSE events, and Debian's Chromium
driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import pytest

from test_server_helpers import LiveServer, request

CHROMIUM = os.environ.get("TIGHTKV_CHROMIUM", "/usr/bin/chromium")  # Debian's `chromium` package
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

FACT = "Orla Brennan"
QUESTION = "Who is the keeper of the Kestrel Point lighthouse?"
FACT_DOC = """# Kestrel Point

Kestrel Point is a rocky headland on the northern coast, three hours by road from the capital.
The village below it has a harbour with three piers, a chapel and a small museum of shipwrecks.
Most of the houses were built from grey granite quarried on the headland itself.

## The lighthouse

The lighthouse was first lit in 1871 and its lamp was replaced with an electric one in 1998.
The keeper of the Kestrel Point lighthouse is Orla Brennan, who took the post in 2015.
The tower is painted white with a single red band, and it stands 31 metres tall.

## Visitors

Visitors come mostly in summer, when the ferry to the outer islands leaves twice a day.
The museum opens at ten and closes at five, except on Mondays.
"""


def chromium() -> str:
    """The Chromium executable; in CI (CI=true) its absence fails the test, elsewhere it skips with the fix."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    why = f"no Chromium at {CHROMIUM}: apt-get install -y chromium (as .ci/run does)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 860):
    """A page of a fresh headless Chromium (its own user-data folder), closed afterwards."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with tempfile.TemporaryDirectory(prefix="tightkv-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def tiny_pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose text layer is `lines` (Helvetica), written by hand."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    content = "BT /F1 11 Tf 14 TL 60 740 Td " + " ".join(f"({esc(line)}) '" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        "/Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def multipart(name: str, data: bytes, fields: dict | None = None) -> tuple[bytes, str]:
    """A multipart/form-data body with one file field `file` (and text fields): (body, content type)."""
    boundary = "tightkv-test-boundary-7f3a"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in (fields or {}).items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def upload(server: LiveServer, name: str, data: bytes, **fields) -> tuple[int, dict]:
    """POST /v1/documents with a file: (status, JSON answer)."""
    body, ctype = multipart(name, data, fields)
    status, _, raw = request(server, "POST", "/v1/documents", body, headers={"Content-Type": ctype})
    return status, json.loads(raw)


def events(server: LiveServer, path: str, body=None, timeout: float = 300) -> list[dict]:
    """The JSON events of an SSE route (GET, or POST with `body`), its framing checked; [DONE] last."""
    status, headers, raw = request(server, "POST" if body is not None else "GET", path, body, timeout=timeout)
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw[:300]
    chunks = raw.decode().split("\n\n")
    assert chunks[-1] == "" and chunks[-2] == "data: [DONE]", raw[-200:]
    assert all(c.startswith("data: ") for c in chunks[:-1]), raw[:300]
    return [json.loads(c[6:]) for c in chunks[:-2]]
