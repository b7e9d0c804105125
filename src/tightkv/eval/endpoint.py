"""An OpenAI-compatible server as what the checks run against (`--endpoint`).

`niah`, `docqa` and `ppl` measure a *target*: a local KV type on the local model
(`LocalTarget`) or a model behind an HTTP endpoint (`EndpointTarget`): vLLM,
llama.cpp's llama-server, Ollama's /v1 or `tightkv serve`. Every target answers
the same token ids, so one table holds both kinds and the first entry is the
baseline.

What an endpoint must offer:
- needles and document QA: `/v1/completions` (greedy, `temperature` 0);
- perplexity and KLD: the prompt's log-probabilities, `echo` with `logprobs` on
  `/v1/completions` (vLLM and `tightkv serve` give them; llama-server and Ollama
  do not, and the check says so);
- the tokenizer: `/tokenize` (llama.cpp's, vLLM's and ours), or a local model
  with the same vocabulary named on the command line. When the endpoint
  tokenizes as we do, prompts go as token ids (exactly the local prompts); else
  as text.

An endpoint gives at most 20 alternatives per position, so KLD against another
target is taken over the baseline's top 20 tokens and the rest of the vocabulary
as one outcome: a lower bound of the full KLD, which llama-perplexity and the
local path compute over the whole vocabulary.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from ..remote import error_message, opener_for
from ..errors import TightKVError

TOP = 20  # alternatives per position asked of an endpoint (vLLM's default --max-logprobs)
PROBE = "The quick brown fox, 1234 times: naïve café!\n\n"


class EndpointError(TightKVError):
    """An endpoint that cannot be reached, refuses a request, or lacks what a check needs."""


def is_endpoint(entry: str) -> bool:
    """True for an entry of --compare that names a server (http:// or https://)."""
    return entry.startswith(("http://", "https://"))


class Endpoint:
    """An OpenAI-compatible server: `URL` or `URL#model` (the model it serves; default
    the `model` argument, else the first of its /v1/models)."""

    def __init__(self, entry: str, api_key: str | None = None, model: str | None = None, timeout: float = 600.0):
        url, _, fragment = entry.partition("#")
        url = url.rstrip("/")
        self.base = url[:-3] if url.endswith("/v1") else url
        self.api_key = api_key or os.environ.get("TIGHTKV_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self._model = fragment or model
        self._opener = opener_for(self.base)

    def request(self, path: str, body: dict | None = None) -> dict:
        """GET (no body) or POST JSON to base + path; an HTTP error or an unreachable
        server is an `EndpointError` with the server's own message."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, headers=headers, method="GET" if body is None else "POST"
        )
        try:
            with self._opener.open(req, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise EndpointError(f"{self.base}{path} answered {err.code}: {error_message(err.read())}") from None
        except (urllib.error.URLError, OSError) as err:
            raise EndpointError(f"cannot reach {self.base}: {getattr(err, 'reason', err)}") from None
        except ValueError:
            raise EndpointError(f"{self.base}{path} did not answer JSON") from None

    @property
    def model(self) -> str:
        """The served model's id (asked of /v1/models once when not given)."""
        if self._model is None:
            data = self.request("/v1/models").get("data") or []
            if not data:
                raise EndpointError(f"{self.base}/v1/models lists no model: give --model")
            self._model = data[0]["id"]
        return self._model

    @property
    def context_length(self) -> int | None:
        """The served context in tokens, where the server says it (vLLM's and our
        max_model_len, llama.cpp's /props n_ctx); None if it does not."""
        for path, body, keys in (
            ("/tokenize", {"model": self.model, "content": "", "prompt": ""}, ["max_model_len"]),
            ("/props", None, ["default_generation_settings", "n_ctx"]),
            ("/v1/models", None, ["data", 0, "max_model_len"]),
        ):
            try:
                value = self.request(path, body)
                for k in keys:
                    value = value[k]
                return int(value)
            except (EndpointError, KeyError, IndexError, TypeError, ValueError):
                continue
        return None

    @property
    def label(self) -> str:
        """host:port/model, a model id that is a file path shortened to its name."""
        name = self.model.rstrip("/").rsplit("/", 1)[-1] if self.model.startswith("/") else self.model
        return f"{urlsplit(self.base).netloc}/{name if len(name) <= 24 else name[:21] + '...'}"

    def tokenize(self, text: str, special: bool = False) -> tuple[list[int], list[str] | None] | None:
        """(ids, pieces or None) from the server's /tokenize; None if it has none."""
        body = {
            "model": self.model,
            "content": text,
            "prompt": text,
            "add_special": special,
            "add_special_tokens": special,
            "with_pieces": True,
            "return_token_strs": True,
        }
        try:
            doc = self.request("/tokenize", body)
        except EndpointError as err:
            if any(f" answered {code}:" in str(err) for code in (404, 405, 501)):
                return None
            raise
        tokens = doc.get("tokens")
        if not isinstance(tokens, list):
            return None
        if tokens and isinstance(tokens[0], dict):  # llama.cpp's with_pieces
            pieces = [
                t["piece"] if isinstance(t["piece"], str) else bytes(t["piece"]).decode("utf-8", "replace")
                for t in tokens
            ]
            return [int(t["id"]) for t in tokens], pieces
        return [int(t) for t in tokens], doc.get("token_strs")

    def complete(
        self, prompt: list[int] | str, max_tokens: int, stop: list[str] | None = None, top: int | None = None
    ) -> tuple[str, dict | None]:
        """A greedy completion of the prompt (token ids or text), and with `top` the
        alternatives ({text: logprob}) for its first token (None if the server gives none)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0}
        if stop:
            body["stop"] = stop
        if top:
            body["logprobs"] = top
        doc = self.request("/v1/completions", body)
        try:
            choice = doc["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{self.base}/v1/completions answered no choice") from None
        return choice.get("text") or "", _first_alternatives(choice.get("logprobs")) if top else None

    def prompt_logprobs(self, ids: list[int], top: int = TOP) -> tuple[list[float | None], list[dict | None]]:
        """Each prompt token's log-probability given those before it, and the `top`
        best alternatives ({text: logprob}) at its position (None for the first):
        an echo with `logprobs` on /v1/completions."""
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": top, "temperature": 0.0}
        try:
            try:
                doc = self.request("/v1/completions", body)
            except EndpointError:  # a prompt as long as the context has no room for the one token: ask for none
                doc = self.request("/v1/completions", {**body, "max_tokens": 0})
        except EndpointError as err:
            raise EndpointError(
                f"{self.label} gives no prompt logprobs (echo with logprobs on /v1/completions; "
                f"llama-server and Ollama do not): {err}"
            ) from None
        try:
            lp = doc["choices"][0]["logprobs"]
            values, tops = lp["token_logprobs"][: len(ids)], lp["top_logprobs"][: len(ids)]
        except (KeyError, IndexError, TypeError):
            values, tops = [], []
        if len(values) < len(ids) or any(v is None for v in values[1:]):
            raise EndpointError(
                f"{self.label} gives no prompt logprobs (echo with logprobs on /v1/completions "
                f"returned {len(values)} of {len(ids)} prompt tokens; llama-server and Ollama do "
                "not echo): perplexity and KLD cannot be measured there, needles and docqa can"
            )
        return values, tops


def _first_alternatives(logprobs) -> dict | None:
    """{text: logprob} of the first generated token's alternatives, from OpenAI's
    completions format (top_logprobs: [{text: logprob}]) or the chat format that
    llama-server also uses there (content: [{top_logprobs: [{token, logprob}]}])."""
    try:
        if "top_logprobs" in logprobs:
            return dict(logprobs["top_logprobs"][0])
        return {t["token"]: t["logprob"] for t in logprobs["content"][0]["top_logprobs"]}
    except (KeyError, IndexError, TypeError, ValueError):
        return None


class Tokens:
    """The tokenizer a run builds its prompts with: a local model's, or an endpoint's
    /tokenize. `bos` is the list the model starts a sequence with (empty for none)."""

    def __init__(self, tokenize, piece, detokenize, bos: list[int], source: str):
        self.tokenize, self.piece, self.detokenize, self.bos, self.source = tokenize, piece, detokenize, bos, source

    @classmethod
    def local(cls, model) -> "Tokens":
        return cls(
            lambda text: model.tokenize(text, add_bos=False),
            lambda i: token_text(model.tokenizer, i),
            model.detokenize,
            model.tokenize(""),
            str(model.path),
        )

    @classmethod
    def remote(cls, endpoint: Endpoint) -> "Tokens":
        got = endpoint.tokenize(PROBE)
        if got is None:
            raise EndpointError(
                f"{endpoint.base} has no /tokenize: name the model on the command line "
                "(a registry name or .gguf path) for its tokenizer"
            )
        pieces: dict[int, str] = {}

        def tokenize(text: str) -> list[int]:
            ids, ps = endpoint.tokenize(text)
            if ps:
                pieces.update(zip(ids, ps))
            return ids

        def piece(i: int) -> str:
            if i not in pieces:
                pieces[i] = detokenize([i])
            return pieces[i]

        def detokenize(ids: list[int]) -> str:
            doc = endpoint.request("/detokenize", {"model": endpoint.model, "tokens": ids})
            return doc.get("content", doc.get("prompt", ""))

        bos = endpoint.tokenize("", special=True)[0]
        return cls(tokenize, piece, detokenize, bos, endpoint.label)


def token_text(tokenizer, token: int) -> str:
    """A token's text as the servers report it in logprobs (invalid UTF-8 replaced)."""
    return tokenizer.token_bytes(token).decode("utf-8", errors="replace")


class LocalTarget:
    """A KV type on the local model.

    Prompts that begin alike (the haystack before each prompt's first needle) take what they
    share from a prefix store in RAM (`engine.prefixes.PrefixStore`): a prompt's chunk ends
    that an earlier prompt also reached by the same tokens are stored as it is prefilled, and
    a later prompt restores the longest of them. A cache restored at a chunk end continues bit
    for bit as a cold prefill does, so every answer is the one a fresh cache gives
    (`reuse=False`: a fresh cache each time)."""

    def __init__(self, model, kv: str, ram_bytes: int | None = None, reuse: bool = True):
        from ..engine.prefixes import PrefixStore

        model.new_cache(kv)  # a bad type name fails here, before any work
        self.model, self.kv, self.label = model, kv, kv
        self.prefixes = PrefixStore(model, kv, ram_bytes=ram_bytes) if reuse else None
        self._seen: set[int] = set()  # hashes of the earlier prompts' ids up to each chunk end

    def _shared_end(self, ids: list[int]) -> int:
        """The last chunk end before the end of ids that an earlier prompt reached by the
        same tokens (0: none); this prompt's chunk ends are remembered for the next ones."""
        from ..engine.generate import PREFILL_CHUNK

        ends = range(PREFILL_CHUNK, len(ids), PREFILL_CHUNK)
        keys = [hash(tuple(ids[:e])) for e in ends]
        shared = max((e for e, k in zip(ends, keys) if k in self._seen), default=0)
        self._seen.update(keys)
        return shared

    def _cache(self, ids: list[int], progress=None) -> list:
        """A cache holding the start of ids that earlier prompts shared (restored from the
        store, or prefilled and stored at each chunk end), or an empty one."""
        from ..engine.generate import PREFILL_CHUNK

        upto = self._shared_end(ids) if self.prefixes is not None else 0
        if not upto:
            return self.model.new_cache(self.kv)
        say = None if progress is None else lambda done, total: progress(upto - total + done, len(ids))
        _, cache = self.prefixes.fill(ids[:upto], list(range(PREFILL_CHUNK, upto + 1, PREFILL_CHUNK)), say)
        return cache

    def answer(self, ids: list[int], max_tokens: int, stop: list[str] | None = None, progress=None) -> str:
        cache = self._cache(ids, progress)
        held = cache[0].offset
        out = self.model.generate(
            ids,
            max_tokens=max_tokens,
            temperature=0.0,
            stop=stop,
            cache=cache,
            progress=None if progress is None else lambda done, total: progress(held + done, len(ids)),
        )
        return out.text

    def score(self, ids: list[int], first: int, top: int = TOP) -> tuple[list[float], list[dict]]:
        """The log-probabilities of ids[first+1:] and the `top` best alternatives
        ({text: logprob}) at each of those positions."""
        import torch

        from ..engine.score import scored_hidden, scored_logits
        from .ppl import OUTPUT_ROWS, ROW_SLICE

        hidden = scored_hidden(self.model.net, ids, self.model.new_cache(self.kv), first, 512)
        targets = torch.tensor(ids[first + 1 :])
        values, tops = [], []
        with torch.inference_mode():  # streamed as `ppl.score_chunk`: a block of logits, float64 a slice at a time
            for s in range(0, targets.numel(), OUTPUT_ROWS):
                logits = scored_logits(self.model.net, hidden[s : s + OUTPUT_ROWS])
                for a in range(0, logits.shape[0], ROW_SLICE):
                    logp = torch.log_softmax(logits[a : a + ROW_SLICE].double(), dim=-1)
                    values += logp.gather(1, targets[s + a : s + a + logp.shape[0], None])[:, 0].tolist()
                    best = logp.topk(top, dim=-1)
                    for v, i in zip(best.values.tolist(), best.indices.tolist()):
                        tops.append(text_logprobs([token_text(self.model.tokenizer, t) for t in i], v))
                del logits
        return values, tops


def text_logprobs(texts: list[str], values: list[float]) -> dict[str, float]:
    """{text: logprob} from parallel lists, tokens of the same text (such as broken
    UTF-8 pieces) summed."""
    out: dict[str, float] = {}
    for k, v in zip(texts, values):
        out[k] = v if k not in out else math.log(math.exp(out[k]) + math.exp(v))
    return out


class EndpointTarget:
    """A model behind an OpenAI-compatible endpoint; prompts go as token ids when it
    tokenizes as `tokens` does, else as text."""

    def __init__(self, endpoint: Endpoint, tokens: Tokens):
        self.endpoint, self.label = endpoint, endpoint.label
        got = endpoint.tokenize(PROBE)
        self.as_ids = got is not None and got[0] == tokens.tokenize(PROBE)
        self.tokens = tokens

    def _prompt(self, ids: list[int]) -> list[int] | str:
        if self.as_ids:
            return ids
        n = len(self.tokens.bos)
        return self.tokens.detokenize(ids[n:] if ids[:n] == self.tokens.bos else ids)

    def answer(self, ids: list[int], max_tokens: int, stop: list[str] | None = None, progress=None) -> str:
        return self.endpoint.complete(self._prompt(ids), max_tokens, stop)[0]

    def answer_line(self, ids: list[int], max_tokens: int) -> str:
        """Greedy decoding that keeps the answer on the prompt's last line, as the local
        engine's `AnswerStart`: a first token without visible text (a line break, the
        end) is passed over for the likeliest one with text among the alternatives."""
        first, alternatives = self.endpoint.complete(self._prompt(ids), 1, top=5)
        visible = [t for t, _ in sorted((alternatives or {}).items(), key=lambda kv: -kv[1]) if t.strip()]
        if first.strip() or not visible:
            start = first
        else:
            start = visible[0]
        prompt = self._prompt(ids)
        prompt = prompt + self.tokens.tokenize(start) if isinstance(prompt, list) else prompt + start
        return start + self.endpoint.complete(prompt, max_tokens - 1)[0]

    def score(self, ids: list[int], first: int, top: int = TOP) -> tuple[list[float], list[dict]]:
        if not self.as_ids:
            raise EndpointError(
                f"{self.label} does not tokenize as {self.tokens.source}: perplexity needs "
                "the same token ids on both sides"
            )
        values, tops = self.endpoint.prompt_logprobs(ids, top)
        return [float(v) for v in values[first + 1 :]], [t or {} for t in tops[first + 1 :]]


def open_targets(
    entries: list[str], load_model, model_named: bool, api_key: str | None = None, served: str | None = None
) -> tuple[Tokens, list]:
    """(tokens, targets): one target per entry, a URL (or URL#model) or a local KV type
    on the model `load_model()` returns (loaded once, only if needed). The prompts'
    tokenizer is the local model's when one is named on the command line
    (`model_named`) or a local type is measured, else the first endpoint's /tokenize."""
    loaded = []

    def model():
        if not loaded:
            loaded.append(load_model())
        return loaded[0]

    endpoints = {e: Endpoint(e, api_key, served) for e in entries if is_endpoint(e)}  # one per URL
    local = model_named or not all(map(is_endpoint, entries))
    tokens = Tokens.local(model()) if local else Tokens.remote(next(iter(endpoints.values())))
    kinds = [e for e in entries if e not in endpoints]
    ram = 0
    if kinds:  # the local types' prefix stores share a quarter of the RAM available
        from ..engine.prefixes import default_ram_budget

        ram = default_ram_budget() // len(kinds)
    targets = [
        EndpointTarget(endpoints[e], tokens) if e in endpoints else LocalTarget(model(), e, ram) for e in entries
    ]
    return tokens, targets
