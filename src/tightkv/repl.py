"""The interactive chat of `tightkv run`, with Ollama's REPL commands.

The conversation's KV cache persists across turns: each turn renders the whole
conversation through the chat template, keeps the cached prefix it shares with
the previous turn, and prefills only the new tokens (``--verbose`` shows
``prompt eval count: N token(s) (M cached)``).

A model that reasons (a ``<think>`` block, gpt-oss's analysis channel) shows it as Ollama's
CLI does (`ThinkingWriter`), and the answer joins the conversation with its reasoning.

Commands: ``/set parameter NAME VALUE``, ``/set system TEXT``, ``/set verbose``,
``/set quiet``, ``/set think [LEVEL]``, ``/set nothink``, ``/set [no]hidethinking``,
``/show [info|parameters|template|system]``, ``/clear``,
``/bye``, ``/?``; ``\"\"\"`` starts and ends a multi-line message; Ctrl-C stops a
reply (and at the prompt, cancels the line); Ctrl-D exits.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable

from .errors import TightKVError

HELP = '''Available Commands:
  /set parameter NAME VALUE   Set a parameter: temperature, top_p, top_k, min_p, seed,
                              num_predict, repeat_penalty, repeat_last_n,
                              presence_penalty, frequency_penalty, num_ctx, stop
  /set system TEXT            Set the system message
  /set verbose | quiet        Show or hide token counts and speeds after each reply
  /set think [LEVEL] | nothink
                              Reasoning models: think (gpt-oss: how hard, low, medium
                              or high), or not
  /set hidethinking | nohidethinking
                              Hide or show the reasoning
  /show [info|parameters|template|system]
                              Show the model, the parameters, the chat template
  /clear                      Clear the conversation and its KV cache
  /bye                        Exit
  /?, /help                   This help

Use """ to begin and end a multi-line message.
Ctrl-C stops a reply; Ctrl-D (on an empty line) exits.'''

# Ollama's parameter names -> generate() keyword arguments
PARAMETERS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
    "max_tokens": ("max_tokens", int),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "stop": ("stop", str),
    "num_ctx": ("num_ctx", int),
}


# the `SamplingParams` fields /set parameter (and `tightkv run`'s flags) set, as /show parameters lists them
SAMPLING_OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


class Interrupted(Exception):
    """Ctrl-C during a reply."""


# Ollama's CLI draws the reasoning so (readline.ColorGrey, ColorBold, ColorDefault)
GREY, BOLD, PLAIN = "\033[38;5;245m", "\033[1m", "\033[0m"
THINKING, DONE_THINKING = "Thinking...\n", "...done thinking.\n\n"


class ThinkingWriter:
    """Writes a reply's (reasoning, content) pieces as Ollama's CLI shows a thinking model:
    "Thinking..." and the reasoning (grey on a terminal), "...done thinking." once the
    answer begins, then the answer; `hide`: the answer alone. `color`: ANSI colors (a
    terminal); else plain text, as Ollama's CLI writes to a pipe."""

    def __init__(self, write: Callable[[str], None], hide: bool = False, color: bool = False):
        self.write, self.hide, self.color = write, hide, color
        self.opened = self.closed = False
        self.last = ""  # the last character of the reasoning written

    def __call__(self, reasoning: str, content: str) -> None:
        if reasoning and not self.hide:
            if not self.opened:
                self.write(GREY + BOLD + THINKING + PLAIN + GREY if self.color else THINKING)
                self.opened, self.closed = True, False
            self.write(reasoning)
            self.last = reasoning[-1]
        if content:
            self._close(done=True)
            self.write(content)

    def finish(self) -> None:
        """The reply ended (within its reasoning, where it was cut short: no "done")."""
        self._close(done=False)

    def _close(self, done: bool) -> None:
        if not self.opened or self.closed:
            return
        if self.last != "\n":
            self.write("\n")
        if done:
            self.write(GREY + BOLD + DONE_THINKING + PLAIN if self.color else DONE_THINKING)
        elif self.color:
            self.write(PLAIN)
        self.closed = True


class ChatSession:
    """A conversation with a model whose KV cache is kept between turns.

    Args:
        model: a `tightkv.Model`.
        options: generate() keyword arguments (max_tokens, temperature, ...).
        system: an optional system message.
    """

    def __init__(self, model, options: dict, system: str | None = None, think: bool | str | None = None):
        self.model = model
        self.options = dict(options)
        self.options["stop"] = list(self.options.get("stop") or [])
        self.system = system
        self.think = think  # True, False, a level, or None: the model's default (`engine.reasoning.think_vars`)
        self.hide_thinking = False
        self.verbose = False
        self.messages: list[dict] = []
        self.cache: list | None = None
        self.held: list[int] = []  # ids the cache was filled from (valid up to its offset)

    def clear(self) -> None:
        self.messages, self.cache, self.held = [], None, []

    def conversation(self, user: str) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages + [{"role": "user", "content": user}]

    def _reuse_cache(self, ids: list[int]) -> list:
        if self.cache is None:
            self.cache, self.held = self.model.new_cache(), []
            return self.cache
        from .engine.generate import reuse_prefix

        if not reuse_prefix(self.cache, self.held, ids):  # a compressed or sliding cache that cannot go back
            self.cache, self.held = self.model.new_cache(), []
        return self.cache

    @property
    def cached_tokens(self) -> int:
        return self.cache[0].offset if self.cache else 0

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.cache) if self.cache else 0

    def reply(
        self,
        text: str,
        write: Callable[[str, str], None],
        stop_requested: Callable[[], bool] = lambda: False,
    ):
        """Answer one user message, streaming its (reasoning, content) pieces to `write`
        (a model that reasons: a <think> block or gpt-oss's analysis channel, split off
        with `engine.reasoning.reply_reader`); returns the GenerationStats, or None when
        `stop_requested` turned true mid-reply (the turn is then dropped from the
        conversation). The answer joins the conversation, its reasoning as the message's
        `reasoning_content`."""
        from .engine.reasoning import reply_reader, think_vars

        model = self.model
        prompt = model.chat_text(self.conversation(text), template_vars=think_vars(model.chat_template, self.think))
        ids = model.chat_tokens(prompt)
        reader = reply_reader(model.chat_template, prompt)
        options = dict(self.options, stop=model.chat_stops(self.options["stop"]))

        def progress(done: int, total: int) -> None:
            if stop_requested():
                raise Interrupted

        pieces = model.generate(ids, stream=True, cache=self._reuse_cache(ids), progress=progress, **options)
        said = {"reasoning": [], "content": []}

        def read(piece: tuple[str, str]) -> None:
            said["reasoning"].append(piece[0])
            said["content"].append(piece[1])
            write(*piece)

        stats = None
        try:
            for step in pieces:
                read(reader.feed(step.text))
                stats = step.stats
                if stats is None and stop_requested():
                    raise Interrupted
        except Interrupted:
            pieces.close()
            self.held = ids  # the cache holds a prefix of these (plus some reply tokens)
            return None
        read(reader.finish())
        reply, reasoning = "".join(said["content"]), "".join(said["reasoning"])
        answer = {"role": "assistant", "content": reply if model.chat_template else reply.strip()}
        if reasoning:
            answer["reasoning_content"] = reasoning
        self.messages += [{"role": "user", "content": text}, answer]
        self.held = ids + stats.ids
        return stats

    @property
    def hides_thinking(self) -> bool:
        """Whether the reasoning is left out of what is printed: asked for, or gpt-oss told
        not to think (it reasons all the same, at low effort)."""
        return self.hide_thinking or self.think is False

    def set_think(self, what: str, level: str | None = None) -> str:
        """Apply `/set think [LEVEL]` or `/set nothink`; returns what to print."""
        from .engine.reasoning import think_vars

        think: bool | str = what == "think"
        if think and level:
            think = level.lower()
            try:
                think_vars(self.model.chat_template, think)
            except ValueError:
                raise TightKVError(f"/set think takes low, medium or high, got '{level}'") from None
        self.think = think
        if think is False:
            return "Set 'nothink' mode."
        return f"Set 'think' mode{'' if think is True else f' ({think})'}."

    def set_parameter(self, name: str, value: str) -> str:
        """Apply `/set parameter NAME VALUE`; returns what to print."""
        if name not in PARAMETERS:
            raise TightKVError(f"unknown parameter '{name}' (known: {', '.join(sorted(PARAMETERS))})")
        key, kind = PARAMETERS[name]
        try:
            parsed = kind(value)
        except ValueError:
            raise TightKVError(f"parameter {name} takes {kind.__name__} values, got '{value}'") from None
        if key == "num_ctx":
            self.model.set_context_length(parsed)
            self.cache, self.held = None, []  # a new context (and maybe new RoPE factors): prefill afresh
            return f"Set parameter 'num_ctx' to '{parsed}'"
        if key == "stop":
            self.options["stop"].append(parsed)
            return f"Set parameter 'stop' to '{', '.join(self.options['stop'])}'"
        if key == "max_tokens" and parsed < 1:
            parsed = None  # Ollama's -1: until the model stops
        trial = {**self.options, key: parsed}
        from .engine.sampling import SamplingParams

        SamplingParams(**{k: trial[k] for k in SAMPLING_OPTIONS if k in trial}).validate()
        self.options[key] = parsed
        return f"Set parameter '{name}' to '{value}'"


def print_stats(s, load_seconds: float | None = None, file=None) -> None:
    """Ollama's --verbose timings, plus the cached prompt tokens and the KV size."""
    err = file or sys.stderr
    if load_seconds is not None:
        print(f"load duration:        {load_seconds:.3f}s", file=err)
    print(f"prompt eval count:    {s.prompt_tokens} token(s) ({s.cached_tokens} cached)", file=err)
    print(f"prompt eval duration: {s.prompt_seconds:.3f}s", file=err)
    print(f"prompt eval rate:     {s.prompt_tps:.2f} tokens/s", file=err)
    print(f"eval count:           {s.generated_tokens} token(s)", file=err)
    print(f"eval duration:        {s.generation_seconds:.3f}s", file=err)
    print(f"eval rate:            {s.generation_tps:.2f} tokens/s", file=err)
    print(f"kv cache:             {s.kv_bytes / 2**20:.2f} MiB", file=err)
    print(f"finish reason:        {s.finish_reason}", file=err)
    from .kernels import build

    print(f"cpu kernels:          {build.summary()}", file=err)
    err.flush()


def show(session: ChatSession, what: str) -> str:
    """The text of `/show ...`."""
    from .gguf.describe import describe, format_pairs

    m = session.model
    what = what or "info"
    if what == "info":
        pairs = describe(m.gguf)
        pairs += [
            ("context in use", f"{session.cached_tokens} of {m.context_length} tokens"),
            ("kv cache type", str(m.kv)),
            ("kv cache size", f"{session.kv_bytes / 2**20:.2f} MiB"),
            ("file", str(m.path)),
        ]
        return "  Model\n" + format_pairs(pairs)
    if what == "parameters":
        o = session.options
        pairs = [("num_ctx", m.context_length), ("num_predict", o.get("max_tokens") or -1)]
        pairs += [(k, o.get(k)) for k in SAMPLING_OPTIONS]
        pairs += [("stop", ", ".join(o.get("stop") or []) or "(none)")]
        return "  Parameters\n" + format_pairs(pairs)
    if what == "template":
        return m.chat_template or "(no chat template: the model runs as plain text completion)"
    if what == "system":
        return session.system or "(no system message)"
    raise TightKVError(f"unknown /show target '{what}' (info, parameters, template, system)")


def _setup_readline() -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())

        from .store import home

        path = home() / "history"
        try:
            readline.read_history_file(path)
        except OSError:
            pass
        readline.set_history_length(1000)
        import atexit

        def save():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(path)
            except OSError:
                pass

        atexit.register(save)
    except ImportError:
        pass


def read_message(prompt: str = ">>> ", more: str = "... ") -> str:
    """One message from the terminal; '\"\"\"' opens and closes a multi-line message.
    Raises EOFError on Ctrl-D and KeyboardInterrupt on Ctrl-C."""
    line = input(prompt)
    stripped = line.strip()
    if not stripped.startswith('"""'):
        return line
    body = stripped[3:]
    if body.endswith('"""') and len(body) >= 3:
        return body[:-3]
    lines = [body] if body else []
    while True:
        nxt = input(more)
        if nxt.rstrip().endswith('"""'):
            lines.append(nxt.rstrip()[:-3])
            break
        lines.append(nxt)
    return "\n".join(lines)


def run_repl(
    model,
    options: dict,
    verbose: bool = False,
    system: str | None = None,
    name: str | None = None,
    think: bool | str | None = None,
    hide_thinking: bool = False,
) -> int:
    """The chat loop; returns the exit code. `name` is what the banner calls the model;
    `think` and `hide_thinking` as `tightkv run`'s --think and --hidethinking."""
    session = ChatSession(model, options, system=system, think=think)
    session.verbose = verbose
    session.hide_thinking = hide_thinking
    _setup_readline()
    out = sys.stdout
    kind = "chat" if model.chat_template else "plain completion: no chat template"
    print(
        f"tightkv: {name or model.path.name} ({kind}). Send a message (/? for help, /bye or Ctrl-D to exit)",
        file=sys.stderr,
        flush=True,
    )
    while True:
        try:
            text = read_message()
        except EOFError:
            out.write("\n")
            out.flush()
            return 0
        except KeyboardInterrupt:
            out.write("\nUse Ctrl + d or /bye to exit.\n")
            out.flush()
            continue
        if not text.strip():
            continue
        if text.strip().startswith("/"):
            try:
                if _command(session, text.strip()) == "bye":
                    return 0
            except TightKVError as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
            continue
        try:
            _turn(session, text)
        except KeyboardInterrupt:  # Ctrl-C before the reply's own handler was in place
            out.write("\n(stopped)\n\n")
            out.flush()


def _turn(session: ChatSession, text: str) -> None:
    out = sys.stdout
    flag = {"stop": False}

    def on_sigint(signum, frame):
        flag["stop"] = True

    def put(piece: str) -> None:
        out.write(piece)
        out.flush()

    write = ThinkingWriter(put, hide=session.hides_thinking, color=out.isatty())
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        stats = session.reply(text, write, lambda: flag["stop"])
    except TightKVError as err:
        out.flush()
        print(f"error: {err}", file=sys.stderr, flush=True)
        return
    finally:
        signal.signal(signal.SIGINT, previous)
        write.finish()
    if stats is None:
        out.write("\n(stopped)\n\n")
        out.flush()
        return
    out.write("\n\n")
    out.flush()
    if session.verbose:
        print_stats(stats)


def _command(session: ChatSession, line: str) -> str | None:
    words = line.split()
    cmd, args = words[0].lower(), words[1:]
    if cmd in ("/bye", "/exit", "/quit"):
        return "bye"
    if cmd in ("/?", "/help"):
        print(HELP, flush=True)
    elif cmd == "/clear":
        session.clear()
        print("Cleared session context", flush=True)
    elif cmd == "/show":
        print(show(session, args[0].lower() if args else ""), flush=True)
    elif cmd == "/set":
        if not args:
            raise TightKVError("usage: /set parameter NAME VALUE | /set system TEXT | /set verbose | /set quiet")
        what = args[0].lower()
        if what == "parameter":
            if len(args) < 3:
                raise TightKVError("usage: /set parameter NAME VALUE")
            print(session.set_parameter(args[1].lower(), " ".join(args[2:])), flush=True)
        elif what == "system":
            session.system = line.split(None, 2)[2] if len(args) > 1 else None
            print("Set system message.", flush=True)
        elif what in ("verbose", "quiet"):
            session.verbose = what == "verbose"
            print(f"Set '{what}' mode.", flush=True)
        elif what in ("think", "nothink"):
            print(session.set_think(what, args[1] if len(args) > 1 else None), flush=True)
        elif what in ("hidethinking", "nohidethinking"):
            session.hide_thinking = what == "hidethinking"
            print(f"Set '{what}' mode.", flush=True)
        else:
            raise TightKVError(
                f"unknown /set target '{args[0]}' (parameter, system, verbose, quiet, think, nothink, "
                "hidethinking, nohidethinking)"
            )
    else:
        raise TightKVError(f"unknown command '{words[0]}' (type /? for help)")
    return None
