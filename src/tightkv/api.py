"""The Python API: `Model` opens a GGUF and generates.

from tightkv import Model
m = Model.from_pretrained("gemma3:270m")
print(m.ask("What is gravity?"))
"""

from __future__ import annotations

import os
from pathlib import Path
import numpy as np

from .errors import ContextOverflowError, TightKVError
from .registry import resolve


def default_threads() -> int:
    """Physical cores, as llama.cpp defaults to."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


class Model:
    """A loaded GGUF model with its tokenizer and a per-layer KV cache.

    Args:
        path_or_name: a path to a .gguf file or a registry name ("qwen3:4b"; pulled
            into the store on first use); None opens the embedded Gemma 3 270M.
        kv: KV cache type or preset for keys and values (e.g. "f16", "q8_0:tq4",
            "progressive"); default "kvarn4", or `TIGHTKV_KV_CACHE_TYPE`. "auto"
            picks the best-quality type that fits the available memory at
            `context_length`, probed on a built-in text when the first cache is made (call
            `choose_kv` before that to probe your own text; `kv_pending` until then).
        context_length: tokens of context; defaults to the model's trained context.
            More than the trained context is an error unless `rope_scaling` is given.
        threads: CPU threads; defaults to the physical cores.
        rope_scaling: linear RoPE scaling, a factor (or {"type": "linear",
            "factor": F}), as llama.cpp's --rope-scale: positions are divided by F
            and context_length may go up to F times the trained context.

    Example::

        with Model("model.gguf", kv="progressive", context_length=131072, rope_scaling=4) as m:
            for step in m.generate("Once upon a time", stream=True):
                print(step.text, end="", flush=True)
    """

    def __init__(
        self,
        path_or_name: str | os.PathLike | None = None,
        *,
        kv: str | None = None,
        context_length: int | None = None,
        threads: int | None = None,
        rope_scaling: float | dict | None = None,
    ):
        import torch

        from .gguf.reader import read_gguf
        from .models.base import ARCHITECTURES, build_model, load_family

        from .engine.prompt import PromptBuilder
        from .kernels import build, qmatmul
        from .kv.spec import is_auto, resolve_kv

        self.kv_pending = is_auto(kv)  # "auto": chosen by `choose_kv`, at the latest by the first cache
        self._kv = resolve_kv(None if self.kv_pending else kv)  # parsed once (a bad spec fails before the weights load)
        self.kv_choice = None  # what `choose_kv` decided (`autokv.KVChoice`)
        self.threads = threads or default_threads()
        torch.set_num_threads(self.threads)
        qmatmul.set_threads(self.threads)
        build.library()  # built or loaded now (a first build takes a minute), not inside the first timed prefill
        # a registry model is pulled on first use (if tightkv can run its architecture)
        self.path: Path = resolve(path_or_name, runnable=set(ARCHITECTURES))
        self.gguf = read_gguf(self.path)
        load_family(self.gguf)  # an unsupported architecture is the first thing to report
        self.rope_factor: float | None = _apply_rope_scaling(self.gguf, rope_scaling)
        self.tokenizer = self._load_tokenizer()
        self.net = build_model(self.gguf)
        self.args = self.net.args
        if self.rope_factor is not None and not hasattr(self.args, "rope_scale"):
            raise TightKVError(f"RoPE scaling is not supported for {self.args.architecture} models")
        self.chat_template: str | None = self.gguf.metadata.get("tokenizer.chat_template")
        tokens = self.gguf.metadata.get("tokenizer.ggml.tokens", [])
        self.prompts = PromptBuilder(self.tokenizer, self.chat_template, tokens)  # chat text, ids, chunk ends
        self.set_context_length(context_length)
        self.last_stats = None  # GenerationStats of the last chat turn
        self.last_reasoning = ""  # the reasoning of the last chat turn (`chat`)

    def __repr__(self) -> str:
        kv = "auto" if self.kv_pending else str(self._kv)
        return f"Model({str(self.path)!r}, kv={kv!r}, context_length={self.context_length})"

    @property
    def kv(self):
        """The KV spec (`kv.spec.KVSpec`) of this model's caches. With kv="auto" it is chosen
        here on first use (probed on the built-in text, at this context), unless `choose_kv` chose it first."""
        if self.kv_pending:
            self.choose_kv()
        return self._kv

    def _load_tokenizer(self):
        from .errors import GGUFError
        from .gguf.tokenizer import load_tokenizer

        try:
            return load_tokenizer(self.gguf.metadata)
        except GGUFError as err:
            raise GGUFError(f"{self.path}: {err}") from None

    @classmethod
    def from_pretrained(cls, name: str, **kwargs) -> "Model":
        """Open a model by registry name (e.g. "gemma3:270m", "qwen3:4b") or .gguf path.

        A registry model that is not in the store yet (``$TIGHTKV_HOME``, default
        ``~/.cache/tightkv``) is pulled first, with a progress bar on stderr.
        Keyword arguments go to `Model`.
        """
        return cls(name, **kwargs)

    @property
    def max_context_length(self) -> int:
        """The longest context allowed: the trained context, times the RoPE-scaling
        factor when one was given."""
        trained = self.args.context_length
        return int(trained * self.rope_factor) if self.rope_factor else trained

    def set_context_length(self, n: int | None) -> None:
        """Change the context (None: the trained one); the one way to do it. A model whose
        RoPE depends on the context (Phi-3's LongRoPE factors, as llama.cpp picks them from
        its -c) follows it; the chat cache is dropped. Caches made before are stale."""
        self.context_length = self._check_context_length(n)
        if hasattr(self.net, "set_context_length"):
            self.net.set_context_length(self.context_length)
        self._chat_cache: list | None = None
        self._chat_ids: list[int] = []

    def _check_context_length(self, n: int | None) -> int:
        trained = self.args.context_length
        if n is None:
            return trained
        if n <= 0:
            raise TightKVError(f"context_length must be positive, got {n}")
        if n > self.max_context_length:
            if self.rope_factor:
                raise TightKVError(
                    f"context_length {n} exceeds {self.max_context_length} tokens, the model's "
                    f"trained context of {trained} times the RoPE scaling factor {self.rope_factor:g}"
                )
            raise TightKVError(
                f"context_length {n} exceeds the model's trained context of {trained} tokens "
                f"(pass rope_scaling={-(-n // trained)} to stretch it, at some loss of quality)"
            )
        return n

    # --- low-level surface -------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids for text. special=True parses control-token strings as control tokens."""
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int]) -> str:
        """Text for token ids."""
        return self.tokenizer.decode(list(ids))

    def choose_kv(
        self,
        text: str | None = None,
        memory: int | None = None,
        context: int | None = None,
        slots: int = 1,
        text_name: str = "the prompt",
        quiet: bool = False,
    ):
        """Choose the cache type as `kv="auto"` does and make it this model's: the
        best-quality type whose bytes at `context` (default this model's) for `slots`
        sequences fit `memory` bytes (default: the RAM available less 1 GiB) and whose
        KLD against f16, probed on `text` (default, or when shorter than 1K tokens: the
        text shipped with the package), is within 0.005, the +0.5% ΔPPL bar as a log-loss (`autokv`). Prints
        the decision in one line on stderr unless `quiet`; returns it (a `KVChoice`), also
        kept as `kv_choice`. Raises
        TightKVError saying how long a context would fit when no type does."""
        import sys

        from .autokv import choose
        from .kv.spec import parse_kv

        choice = choose(self, text, memory, context, slots, text_name, progress=not quiet)
        self._kv, self.kv_choice, self.kv_pending = parse_kv(choice.kv), choice, False
        self._chat_cache, self._chat_ids = None, []
        if not quiet:
            print(choice.line(), file=sys.stderr, flush=True)
        return choice

    def new_cache(self, kv=None) -> list:
        """A fresh per-layer KV cache: of this model's spec, or of `kv` (a spec or its text)."""
        from .kv.spec import parse_kv

        return parse_kv(kv or self.kv).make_caches(self.net.cache_layout(), self.context_length)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [len(ids), vocab] at every position, from one chunked prefill (float32
        prompts, as the measurements take them: `kernels.qmatmul.float_prompts`)."""
        import torch

        from .engine.generate import PREFILL_CHUNK
        from .kernels.qmatmul import float_prompts

        ids = list(ids)
        if len(ids) > self.context_length:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context of {self.context_length}")
        cache = self.new_cache()
        out = np.empty((len(ids), self.args.vocab_size), dtype=np.float32)
        with torch.inference_mode(), float_prompts():  # a measurement: float32 prompts
            for s in range(0, len(ids), PREFILL_CHUNK):
                part = torch.tensor(ids[s : s + PREFILL_CHUNK])
                out[s : s + part.numel()] = self.net(part, cache, logits_at=torch.arange(part.numel())).numpy()
        return out

    def prompt_logprobs(self, ids: list[int], top: int = 0, chunk: int = 64) -> list:
        """Each token's `TokenLogprob` given the tokens before it (None for the first), with
        its `top` best alternatives: what an echo of the prompt reports. One chunked prefill
        into a fresh cache, `chunk` positions' logits at a time."""
        import torch

        from .engine.generate import token_logprob
        from .kernels.qmatmul import float_prompts

        ids = list(ids)
        if len(ids) > self.context_length:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context of {self.context_length}")
        cache, out = self.new_cache(), [None]
        with torch.inference_mode(), float_prompts():  # scored as the measurements score
            for s in range(0, len(ids) - 1, chunk):
                part = torch.tensor(ids[s : s + chunk])
                logits = self.net(part, cache, logits_at=torch.arange(part.numel()))  # (n, vocab)
                out += [token_logprob(row, ids[s + i + 1], top) for i, row in enumerate(logits) if s + i + 1 < len(ids)]
        return out

    def embed(self, texts: str | list[str | list[int]], truncate: bool = False) -> list[list[float]]:
        """One embedding per text (or list of token ids): the final-normed hidden states
        pooled as the GGUF says (`{arch}.pooling_type`), else their mean, L2-normalized;
        `args.hidden_size` floats each. A text over the context is a `ContextOverflowError`
        unless `truncate` (then its first tokens are embedded). See `engine.embed`.

        Example::

            a, b = Model().embed(["The cat sleeps.", "A kitten naps."])
            similarity = sum(x * y for x, y in zip(a, b))
        """
        from .engine.embed import embed

        return embed(self, [texts] if isinstance(texts, str) else list(texts), truncate=truncate).vectors

    # --- generation ----------------------------------------------------------
    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_bos=True, special=False)
        return [int(t) for t in prompt]

    def generate(
        self,
        prompt: str | list[int],
        max_tokens: int | None = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: list[str] | str | None = None,
        stream: bool = False,
        cache: list | None = None,
        progress=None,
        prompt_cache=None,
        json_schema: dict | bool | None = None,
        grammar: str | None = None,
        logprobs: int | None = None,
        **penalties,
    ):
        """Generate a continuation of a prompt (text or token ids).

        Returns a `GenerationResult` (.text, .ids, .stats); with stream=True, an
        iterator of `GenerationStep` records (.text, .token), one per token; the
        last one has .stats (with .finish_reason) and the text still held back.
        `cache` may already hold a prefix of the prompt; `prompt_cache`
        (`engine.generate.PromptCache`) is how a prefix store meets the prompt.
        `json_schema` (a schema, or True for any JSON object) or `grammar` (Lark or
        llama.cpp GBNF) constrains the output (`engine.grammar`); `logprobs=N` adds each
        token's log-probability and its N best alternatives to the steps (.logprob).
        `penalties` are `frequency_penalty`, `presence_penalty`, `repeat_last_n` and
        `logit_bias` (token id -> bias), as `engine.sampling.SamplingParams` has them, and
        speculative decoding's `spec_type` ("ngram-simple": prompt lookup, the default; "draft": a
        draft model; "none"), `model_draft` (a GGUF path or registry name of the same vocabulary),
        `draft_max` and `draft_min`, as llama.cpp names them (`engine.speculative`): the output
        is the same with them, several tokens come per forward where drafts are accepted.
        """
        from .engine.generate import steps

        seq = self.sequence(
            prompt,
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            seed,
            stop,
            cache,
            progress,
            prompt_cache,
            json_schema,
            grammar,
            logprobs,
            **penalties,
        )
        pieces = steps(seq)
        return pieces if stream else _collect(pieces)

    def sequence(
        self,
        prompt: str | list[int],
        max_tokens: int | None = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: list[str] | str | None = None,
        cache: list | None = None,
        progress=None,
        prompt_cache=None,
        json_schema: dict | bool | None = None,
        grammar: str | None = None,
        logprobs: int | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_last_n: int = 64,
        logit_bias: dict[int, float] | None = None,
        spec_type: str | None = None,
        model_draft: str | None = None,
        draft_max: int | None = None,
        draft_min: int = 0,
    ):
        """The generation `generate` runs, as an `engine.generate.Sequence` of explicit
        steps (prefill chunks, tokens), for a scheduler that runs many at once."""
        from .engine.generate import PromptCache, Sequence, check_context
        from .engine.sampling import Sampler
        from .engine.speculative import make_speculator

        spec = self.spec_options(spec_type, model_draft, draft_max, draft_min)

        ids = self._prompt_ids(prompt)
        limit = check_context(len(ids), max_tokens, self.context_length)
        params = self.sampling_params(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repeat_last_n=repeat_last_n,
            logit_bias=logit_bias,
            seed=seed,
        )
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        cache = cache if cache is not None else self.new_cache()
        if prompt_cache is None:
            prompt_cache = PromptCache(
                cuts=tuple(self.prompts.prompt_cuts(ids))
            )  # chunks end at chat turns, blank lines
        constraint = self.constraint(json_schema, grammar)
        return Sequence(
            self.net,
            self.tokenizer,
            ids,
            cache,
            Sampler(params),
            limit,
            stops,
            progress,
            prompt_cache,
            constraint,
            logprobs,
            make_speculator(self, spec),
        )

    def speculate(
        self, spec_type: str | None = None, model_draft=None, draft_max: int | None = None, draft_min: int = 0
    ) -> None:
        """Set how this model's generations speculate when a call does not say (`generate`'s
        spec_type, model_draft, draft_max, draft_min): what `run` and `ask` set from their flags."""
        self._spec = self.spec_options(spec_type, model_draft, draft_max, draft_min)

    def spec_options(
        self, spec_type: str | None = None, model_draft=None, draft_max: int | None = None, draft_min: int = 0
    ):
        """`engine.speculative.SpecOptions` from generate's arguments, checked (a draft model is
        opened here, once: `draft_model`). With neither spec_type nor model_draft: what
        `speculate` set, else `engine.speculative.DEFAULT_SPEC`; a model_draft alone means "draft"."""
        from .engine.speculative import DEFAULT_SPEC, DRAFT_MAX, SpecOptions

        held = self.__dict__.get("_spec")
        if spec_type is None and model_draft is None and held is not None:
            return held
        kind = spec_type or ("draft" if model_draft else DEFAULT_SPEC)
        spec = SpecOptions(kind, DRAFT_MAX if draft_max is None else draft_max, draft_min, model_draft)
        spec.validate()
        if spec.active and spec.spec_type == "draft":
            self.draft_model(model_draft)
        return spec

    def draft_model(self, name) -> "Model":
        """The draft model `name` (a GGUF path or registry name), opened once with this model's
        context and threads; one whose vocabulary is not this model's is refused."""
        from .engine.speculative import check_vocab

        key = str(name)
        drafts = self.__dict__.setdefault("_drafts", {})
        if key not in drafts:
            draft = Model(name, kv="f16", threads=self.threads)
            check_vocab(self, draft, key)
            draft.set_context_length(min(self.context_length, draft.context_length))
            drafts[key] = draft
        return drafts[key]

    def sampling_params(self, **options):
        """`engine.sampling.SamplingParams` from its fields, checked (logit_bias's token ids
        against this model's vocabulary too); a bad value raises TightKVError."""
        from .engine.sampling import SamplingParams

        params = SamplingParams(**options)
        params.validate()
        vocab = self.tokenizer.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise TightKVError(f"logit_bias names token {max(params.logit_bias)}, past the vocabulary's {vocab}")
        return params

    def constraint(self, json_schema: dict | bool | None = None, grammar: str | None = None):
        """The `engine.grammar.Constraint` for a JSON schema (True: any JSON object) or a
        Lark / GBNF grammar; None when neither is given."""
        from .engine import grammar as g

        if json_schema is None and grammar is None:
            return None
        if json_schema is not None and grammar is not None:
            raise TightKVError("give a JSON schema or a grammar, not both")
        text = g.json_schema_grammar(json_schema) if json_schema is not None else g.lark_grammar(grammar)
        return g.Constraint(text, self.tokenizer)

    def ask(self, prompt: str, **kwargs) -> str:
        """One answer as a string: through the chat template when the model has one; a base
        model continues the text, with repeat_penalty 1.1 unless one is given
        (`engine.chat.BASE_REPEAT_PENALTY`: greedy, it would loop on one sentence)."""
        if self.chat_template:
            return self.chat([{"role": "user", "content": prompt}], reset=True, **kwargs)
        from .engine.chat import BASE_REPEAT_PENALTY

        kwargs.setdefault("repeat_penalty", BASE_REPEAT_PENALTY)
        return self.generate(prompt, **kwargs).text

    def chat(self, messages: list[dict], reset: bool = False, think: bool | str | None = None, **kwargs) -> str:
        """Answer a conversation; the KV cache is reused across turns when the
        conversation extends the previous one, so a turn prefills only new tokens.

        A model that reasons first (a ``<think>`` block, or gpt-oss's harmony analysis
        channel) returns its answer (harmony's final channel), no markup; the reasoning is in
        `last_reasoning` (give it back as an assistant message's `reasoning_content`).
        `think`: True or False, or a level "low", "medium", "high" (gpt-oss's reasoning
        effort; False is low there, as it always reasons), as Ollama's `think`; None: the
        model's default."""
        from .engine.reasoning import reply_reader, think_vars

        try:
            template_vars = think_vars(self.chat_template, think)
        except ValueError:
            raise TightKVError(f"think must be true, false, low, medium or high, not {think!r}") from None
        text = self.chat_text(messages, template_vars=template_vars)
        ids = self.chat_tokens(text)
        cache = self._reuse_chat_cache(ids, reset)
        kwargs["stop"] = self.chat_stops(kwargs.get("stop"))
        result = self.generate(ids, cache=cache, **kwargs)
        self._chat_ids = ids + result.ids
        self.last_stats = result.stats
        reader = reply_reader(self.chat_template, text)
        (r1, c1), (r2, c2) = reader.feed(result.text), reader.finish()
        self.last_reasoning = r1 + r2
        return c1 + c2

    def chat_stops(self, stop: list[str] | str | None = None) -> list[str]:
        """The stop strings of a chat turn (`engine.prompt.PromptBuilder.chat_stops`)."""
        return self.prompts.chat_stops(stop)

    def chat_ids(self, messages: list[dict], tools: list[dict] | None = None, **options) -> list[int]:
        """Prompt token ids for a conversation (`engine.prompt.PromptBuilder.chat_ids`)."""
        return self.prompts.chat_ids(messages, tools, **options)

    def chat_text(self, messages: list[dict], tools: list[dict] | None = None, **options) -> str:
        """The prompt text of a conversation, through the chat template or as plain text
        (`engine.prompt.PromptBuilder.chat_text`: continue_final, add_generation_prompt,
        template_vars)."""
        return self.prompts.chat_text(messages, tools, **options)

    def chat_tokens(self, text: str) -> list[int]:
        """The token ids of a prompt `chat_text` made (`engine.prompt.PromptBuilder.chat_tokens`)."""
        return self.prompts.chat_tokens(text)

    def _reuse_chat_cache(self, ids: list[int], reset: bool) -> list:
        old = self._chat_ids
        cache = self._chat_cache
        if reset or cache is None:
            self._chat_cache, self._chat_ids = self.new_cache(), []
            return self._chat_cache
        from .engine.generate import reuse_prefix

        if not reuse_prefix(cache, old, ids):
            self._chat_cache = cache = self.new_cache()
        return cache

    def load_document(
        self,
        path_or_text,
        *more,
        kv: str | None = None,
        mode: str = "auto",
        cache: bool = True,
        progress: bool = True,
        **kwargs,
    ):
        """A `DocumentSession` over one or more documents (paths, or text): `.ask(question)`.

        In full mode the document is prefilled once into the KV cache (kv defaults to
        the default cache type, "kvarn4", or $TIGHTKV_KV_CACHE_TYPE), saved under ``$TIGHTKV_HOME/documents`` and loaded from there
        next time (cache=False skips the disk); each question costs only its own
        tokens; cache may also be a `CacheStore` (another directory). mode: "full",
        "rag", "rlv" or "auto" (full when the document fits the model's measured working
        memory, else rlv). quotes=N (default 5; 0: none): full and rlv put the N sentences
        that best match a question before it. See `tightkv.documents`.
        """
        from .documents.session import DocumentSession

        return DocumentSession(self, [path_or_text, *more], kv=kv, mode=mode, store=cache, progress=progress, **kwargs)

    def close(self) -> None:
        """Release the cache and the mapped weights."""
        self._chat_cache = None
        self.net = None
        self.gguf = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _apply_rope_scaling(gguf, rope_scaling: float | dict | None) -> float | None:
    """Apply an explicit linear RoPE scaling to the GGUF metadata before the model is
    built, as llama.cpp's ``--rope-scaling linear --rope-scale N`` does; returns the
    factor (None when not asked for)."""
    if rope_scaling is None:
        return None
    if isinstance(rope_scaling, dict):
        kind = str(rope_scaling.get("type", rope_scaling.get("rope_type", "linear")))
        factor = rope_scaling.get("factor")
    else:
        kind, factor = "linear", rope_scaling
    if kind != "linear":
        raise TightKVError(f"RoPE scaling type '{kind}' is not supported (only 'linear')")
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise TightKVError(f"RoPE scaling factor must be a number, got {factor!r}") from None
    if not factor >= 1.0:
        raise TightKVError(f"RoPE scaling factor must be >= 1, got {factor:g}")
    arch = gguf.architecture
    m = gguf.metadata
    existing = float(m.get(f"{arch}.rope.scaling.factor") or 1.0)
    m[f"{arch}.rope.scaling.type"] = "linear"
    m[f"{arch}.rope.scaling.factor"] = existing * factor
    return factor


def _collect(pieces):
    from .engine.generate import GenerationResult

    text = []
    for step in pieces:
        text.append(step.text)
        if step.stats:
            return GenerationResult("".join(text), step.stats.ids, step.stats)
    raise RuntimeError("generation ended without a stats record")
