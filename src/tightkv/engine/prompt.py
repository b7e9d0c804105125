"""Prompts: a conversation's text and token ids through the chat template, the stop
strings of a chat turn, and where a prompt's prefill chunks end.

A `PromptBuilder` is given the tokenizer and the chat template; `api.Model` builds one
(`Model.prompts`) and every face asks it for its prompts, so the CLI, the REPL, the
server and `Model.chat` render a conversation the same way.

The chunk ends off the prefill grid (`cut_points`) are where chat turns begin and where
a turn's last paragraph ends: a conversation's earlier turns, or a document before a
question, then end on a chunk, so they are a stored prefix (`engine.prefixes`) of the
next request, and the rest is computed exactly as a cold prefill computes it.
"""

from __future__ import annotations

from ..errors import TightKVError
from .chat import PLAIN_CHAT_STOPS, continues, plain_prompt, render_chat, render_continuation
from .generate import PREFILL_CHUNK
from .harmony import harmony_messages, is_harmony

MIN_TURN_CUT = 8  # turns that open before this position are no prefill cut (`turn_cuts`)


class PromptBuilder:
    """Prompt text and ids for one tokenizer and chat template (None: plain text chat).

    `token_texts` are the vocabulary's token strings (GGUF `tokenizer.ggml.tokens`), from
    which the template's `bos_token` and `eos_token` are taken."""

    def __init__(self, tokenizer, chat_template: str | None, token_texts: list[str]):
        self.tokenizer, self.chat_template, self.token_texts = tokenizer, chat_template, token_texts
        self._turn_token: int | None = None
        self._turn_token_found = False

    def token_text(self, token_id: int | None) -> str:
        """A token's text as the vocabulary spells it ("" for None or an unknown id)."""
        texts = self.token_texts
        return texts[token_id] if token_id is not None and 0 <= token_id < len(texts) else ""

    # --- conversations -------------------------------------------------------------
    def chat_stops(self, stop: list[str] | str | None = None) -> list[str]:
        """The stop strings of a chat turn: the caller's, plus the next "User:" turn of a
        model without a chat template (which sees the conversation as plain text)."""
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return stops if self.chat_template else stops + PLAIN_CHAT_STOPS

    def chat_ids(self, messages: list[dict], tools: list[dict] | None = None, **options) -> list[int]:
        """Prompt token ids for a conversation; `tools` (OpenAI function specs) are rendered
        by the chat template (`engine.tools.tool_format` says whether it takes them).
        Options as for `chat_text`."""
        return self.chat_tokens(self.chat_text(messages, tools, **options))

    def chat_text(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        continue_final: bool | None = None,
        add_generation_prompt: bool = True,
        template_vars: dict | None = None,
    ) -> str:
        """The prompt text of a conversation: through the chat template, or as plain text
        for a model without one. A last message from the assistant is continued, not
        answered in a new turn (`continue_final` None: whenever the assistant speaks last;
        False: a new turn all the same). `add_generation_prompt=False` ends the text with
        the last message's turn. `template_vars`: more template variables, e.g.
        ``{"enable_thinking": False}`` (Qwen3). A harmony template (gpt-oss) reads an
        assistant's `reasoning_content` as its `thinking` (`harmony.harmony_messages`)."""
        cont = continues(messages, continue_final)
        if is_harmony(self.chat_template):
            messages = harmony_messages(messages)  # reasoning_content as the template's thinking
        if not self.chat_template:
            return plain_prompt(messages, cont, add_generation_prompt)
        tok = self.tokenizer
        bos, eos = self.token_text(tok.bos_id), self.token_text(tok.eos_id)
        extra = dict(template_vars or {})
        if tools:
            extra["tools"] = tools
        if cont:
            return render_continuation(self.chat_template, messages, bos_token=bos, eos_token=eos, **extra)
        return render_chat(
            self.chat_template,
            messages,
            bos_token=bos,
            eos_token=eos,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    def chat_tokens(self, text: str) -> list[int]:
        """The token ids of a prompt `chat_text` made (control tokens parsed in a template's
        text; the BOS added unless the template wrote it)."""
        if not self.chat_template:
            return self.tokenizer.encode(text)
        bos = self.token_text(self.tokenizer.bos_id)
        return self.tokenizer.encode(text, add_bos=not (bos and text.startswith(bos)), special=True)

    # --- prefill chunk ends ----------------------------------------------------------
    def turn_cuts(self, ids: list[int]) -> list[int]:
        """Where the chat turns of a prompt begin (the positions of the token that opens
        each turn), for the prefill chunks: a conversation's earlier turns then end on a
        chunk, and are a stored prefix of its next request. [] without a chat template, or
        when its turns open with no special token. A turn that opens within the first
        `MIN_TURN_CUT` tokens (after the BOS, say) is no cut: so short a prefix saves
        nothing and would cost a forward pass of its own."""
        if not self._turn_token_found:
            self._turn_token, self._turn_token_found = self._find_turn_token(), True
        t = self._turn_token
        return [] if t is None else [i for i, x in enumerate(ids) if x == t and i >= MIN_TURN_CUT]

    def prompt_cuts(self, ids: list[int]) -> list[int]:
        """The extra prefill chunk ends of a prompt: where its chat turns begin
        (`turn_cuts`) and its `paragraph_cuts`."""
        return self.cut_points(ids)[0]

    def cut_points(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """`prompt_cuts`, and the `paragraph_cuts` among them."""
        turns = self.turn_cuts(ids)
        breaks = self.paragraph_cuts(ids, turns)
        return sorted({*turns, *breaks}), breaks

    def paragraph_cuts(self, ids: list[int], turns: list[int]) -> list[int]:
        """Just after each turn's last paragraph break ("\\n\\n"; in the last turn, only
        past the prompt's last prefill grid point). A question asked after a document in
        the same message then finds that document stored up to the break, whatever the
        question; a conversation's next turn has the same cuts in its earlier turns, and
        its grid points stay stored. `turns`: the prompt's `turn_cuts`."""
        grid = len(ids) // PREFILL_CHUNK * PREFILL_CHUNK
        cuts = []
        for start, end in zip([0, *turns], [*turns, len(ids)]):
            last = next((i for i in range(end - 1, start, -1) if self._paragraph_ends(ids, i)), None)
            if last is not None and last + 1 < end and (end < len(ids) or last + 1 > grid):
                cuts.append(last + 1)
        return cuts

    def _paragraph_ends(self, ids: list[int], i: int) -> bool:
        """Whether the text up to token i ends with a blank line."""
        piece = self.tokenizer.token_bytes(ids[i])
        return piece.endswith(b"\n\n") or (piece == b"\n" and self.tokenizer.token_bytes(ids[i - 1]).endswith(b"\n"))

    def _find_turn_token(self) -> int | None:
        """The special token that opens every chat turn, or None."""
        from ..gguf.vocab import ATTR_CONTROL, ATTR_USER_DEFINED

        if not self.chat_template:
            return None
        msgs = [{"role": "user", "content": "x"}]
        try:
            head = render_chat(self.chat_template, msgs, add_generation_prompt=False)
            full = render_chat(self.chat_template, msgs, add_generation_prompt=True)
        except TightKVError:
            return None
        if not full.startswith(head) or len(full) == len(head):
            return None
        ids = self.tokenizer.encode(full[len(head) :], add_bos=False, special=True)
        attrs = getattr(self.tokenizer, "attrs", None)
        if ids and attrs is not None and attrs[ids[0]] & (ATTR_CONTROL | ATTR_USER_DEFINED):
            return ids[0]
        return None
