"""`tightkv serve`: an OpenAI- and Ollama-compatible HTTP server over one model.

- `app`: the FastAPI app, `/health`, `/metrics`, API key and body-size guard
- `openai`: `/v1/chat/completions`, `/v1/completions`, `/v1/models` (SSE streams)
- `ollama`: `/api/chat`, `/api/generate` (NDJSON streams), `/api/tags`, `/api/show`, `/api/ps`, `/api/version`
- `scheduler`: the one worker thread that owns the model, a bounded FIFO queue
- `documents`, `sessions`: the web page's `/v1/documents` routes (upload, load as SSE, ask) and the
  documents open here; the page itself is `web/` (HTML, CSS, JavaScript), served at `/`
- `http`, `schemas`: error shapes, request parsing and validation, streaming
"""

from __future__ import annotations

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name):
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'tightkv.server' has no attribute {name!r}")
