"""`tightkv client "message"`: chat with a running `tightkv serve` (or any
OpenAI-compatible server) through /v1/chat/completions; streams by default."""

from __future__ import annotations

import argparse
import json
import os
import sys
from urllib.parse import urlsplit

from ..errors import TightKVError
from ..remote import error_message, opener_for
from .flags import SAMPLING_DEFAULTS, add_sampling_flags

NAME = "client"
HELP = "send a chat message to a running server and print the answer"
DEFAULT_URL = "http://127.0.0.1:8080"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("message", nargs="*", help="the message (default: read standard input)")
    p.add_argument("--url", default=None, help=f"server address (default $TIGHTKV_URL or {DEFAULT_URL})")
    p.add_argument("--api-key", default=None, help="bearer key (default $TIGHTKV_API_KEY)")
    p.add_argument("--no-stream", dest="stream", action="store_false", help="wait for the whole answer")
    p.add_argument("--model", default=None, help="model id (default: the server's)")
    p.add_argument("--system", default=None, help="a system message first")
    p.add_argument(
        "--hidethinking",
        "--hide-thinking",
        action="store_true",
        help="do not print the reasoning (the answer's reasoning_content), only the answer",
    )
    add_sampling_flags(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server")


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    if not urlsplit(url).scheme:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[:-3]
    return url + "/v1/chat/completions"


def request_sampling(ns: argparse.Namespace) -> dict:
    """The request's sampling fields: `tightkv run`'s defaults (greedy), sent
    explicitly since an OpenAI server's own default is temperature 1.0; the
    extras (top_k, min_p, the penalties) only when set, for servers without them."""
    fields = {"temperature": ns.temperature}
    for name in (
        "model",
        "max_tokens",
        "seed",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "repeat_last_n",
    ):
        value = getattr(ns, name)
        if value is not None and value != SAMPLING_DEFAULTS.get(name):
            fields[name] = value
    if ns.stop:
        fields["stop"] = list(ns.stop)
    return fields


def run(ns: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    message = " ".join(ns.message)
    if not message and not sys.stdin.isatty():
        message = sys.stdin.read()
    if not message:
        raise TightKVError('no message given (usage: tightkv client "message")')
    url = _endpoint(ns.url or os.environ.get("TIGHTKV_URL") or DEFAULT_URL)
    key = ns.api_key or os.environ.get("TIGHTKV_API_KEY")
    messages = ([{"role": "system", "content": ns.system}] if ns.system else []) + [
        {"role": "user", "content": message}
    ]
    body = {"messages": messages, "stream": ns.stream, **request_sampling(ns)}
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    opener = opener_for(url)
    try:
        response = opener.open(request, timeout=ns.timeout)
    except urllib.error.HTTPError as err:
        raise TightKVError(f"server answered {err.code}: {error_message(err.read())}") from None
    except (urllib.error.URLError, OSError) as err:
        raise TightKVError(f"cannot reach {url}: {getattr(err, 'reason', err)}") from None
    from ..repl import ThinkingWriter

    def put(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    # the reasoning (reasoning_content: a thinking model, gpt-oss's analysis) as `tightkv run` shows it
    write = ThinkingWriter(put, hide=ns.hidethinking, color=sys.stdout.isatty())
    with response:
        if not ns.stream:
            message = json.loads(response.read())["choices"][0]["message"]
            write(message.get("reasoning_content") or "", message.get("content") or "")
            write.finish()
            sys.stdout.write("\n")
            return 0
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                sys.stdout.write("\n")
                raise TightKVError(f"server error: {error_message(data.encode())}")
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                write(delta.get("reasoning_content") or "", delta.get("content") or "")
        write.finish()
        sys.stdout.write("\n")
    return 0
