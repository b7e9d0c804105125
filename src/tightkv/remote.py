"""Talking to an OpenAI-compatible server over HTTP (`tightkv client`, the measured
endpoints of `eval.endpoint`): the opener and the one-line message of an error body."""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import urlsplit


def opener_for(url: str):
    """A urllib opener; loopback addresses bypass any proxy."""
    host = urlsplit(url).hostname or ""
    handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "localhost", "::1") else []
    return urllib.request.build_opener(*handlers)


def error_message(raw: bytes) -> str:
    """The message of an OpenAI-, llama.cpp- or Ollama-shaped error body (else its text)."""
    try:
        doc = json.loads(raw)
        err = doc.get("error", doc)
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return raw.decode("utf-8", "replace").strip()[:300]
