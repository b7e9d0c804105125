"""The tokenizer base shared by the vocab types: GGUF token types and llama.cpp's
attributes, the end-of-generation ids, and the special-token partition
(`tokenizer_st_partition`): control, unknown and user-defined tokens are cut out
of the raw text, longest text first. User-defined tokens are always cut out;
control and unknown ones only with ``special=True``.

llama.cpp's loader also retypes a few tokens by their text, and so does
`Tokenizer._setup_specials`: end-of-generation texts become control tokens; the
harmony (gpt-oss) tokens ``<|channel|>``, ``<|message|>``, ``<|start|>`` and
``<|constrain|>`` become user-defined, so they are cut out of plain text too and
render in the output, where a reply parser reads them; and with ``<|return|>`` and
``<|call|>`` in the vocab ``<|end|>`` ends no generation and is user-defined as well
(a harmony reply goes on after an analysis message's ``<|end|>``).
"""

from __future__ import annotations

from typing import Any

from ..errors import GGUFError

# GGUF token types (tokenizer.ggml.token_type)
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp token attributes (bit flags), as the loader derives them from the types
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

_TYPE_TO_ATTR = {
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_BYTE: ATTR_BYTE,
}

# Token texts that end generation (llama.cpp's special_eog_ids list, minus "</s>",
# which llama.cpp only lists for one OCR model and which Gemma uses as an HTML tag).
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",  # Gemma 4
    "<turn|>",  # Gemma 4
    "<|tool_response>",  # Gemma 4: a tool call waits for its response
    "<|flush|>",  # solar-open
    "<|calls|>",  # solar-open
    "<｜end▁of▁sentence｜>",
    "[e~[",  # MiniMax M2
)

# harmony tokens that llama.cpp always renders, as user-defined tokens
VISIBLE_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


class Tokenizer:
    """What the rest of tightkv needs from a tokenizer."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_ids: set[int]
    add_bos: bool

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`, equal to llama.cpp's `llama_tokenize(text, add_bos, special)`:
        BOS first and EOS last when `add_bos` and the vocab asks for them."""
        return self._bos_eos(self._encode_text(text, special, self._encode_fragment), add_bos)

    def _encode_text(self, text: str, special: bool, encode_fragment) -> list[int]:
        """The ids of `text` alone (no BOS/EOS), each plain fragment through encode_fragment."""
        raise NotImplementedError

    def _bos_eos(self, ids: list[int], add_bos: bool) -> list[int]:
        """ids with the BOS and EOS the vocab asks for (llama.cpp adds both only with add_special)."""
        if not add_bos:
            return ids
        if self.add_bos:
            if self.bos_id is None:
                raise GGUFError("tokenizer asks for a BOS token but has no bos_token_id")
            ids = [self.bos_id, *ids]
        if self.add_eos:
            if self.eos_id is None:
                raise GGUFError("tokenizer asks for an EOS token but has no eos_token_id")
            ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids: list[int], special: bool = False) -> str:
        """Text of `ids`, llama.cpp's `token_to_piece` of each joined (control tokens render
        as nothing, or with `special` as their text); bad UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: list[int], special: bool = False) -> bytes:
        """The bytes of `ids` as `decode` joins them."""
        return b"".join(self.token_piece(i, special) for i in ids)

    def token_piece(self, id: int, special: bool = False) -> bytes:
        """llama.cpp's `token_to_piece(id, special)`: `token_bytes`, but with `special`
        control and unknown tokens give their text."""
        if special and 0 <= id < self.vocab_size and self.attrs[id] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return self.texts[id].encode("utf-8")
        return self.token_bytes(id)

    def token_bytes(self, id: int) -> bytes:
        """The bytes token `id` adds to the output (may be part of a UTF-8 character), as
        llama.cpp's `token_to_piece(special=False)` gives them; memoized per id."""
        piece = self._pieces.get(id)
        if piece is None:
            if not 0 <= id < self.vocab_size:
                raise ValueError(f"token id {id} is outside the vocabulary (size {self.vocab_size})")
            attr, text = self.attrs[id], self.texts[id]
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                piece = b""
            elif attr & ATTR_USER_DEFINED:
                piece = text.encode("utf-8")
            elif attr & ATTR_NORMAL:
                piece = self.normal_bytes(text)
            elif attr & ATTR_BYTE:
                piece = bytes([int(text[3:5], 16)])
            else:  # unused or undefined types render as nothing
                piece = b""
            self._pieces[id] = piece
        return piece

    def normal_bytes(self, text: str) -> bytes:
        """The bytes of a normal token's text (each vocab type escapes them its own way)."""
        raise NotImplementedError

    # -- shared by the vocab types (needs self.texts, self.attrs, self.ids) ----

    def _setup_specials(self, eos_id: int | None, eot_ids: set[int] | None) -> None:
        """End-of-generation ids and the special-token partition tables."""
        self.eot_ids = self._retype_by_text(eos_id, eot_ids)

        # special-token partition order: longest text first (llama.cpp's std::sort leaves ties
        # unordered; that matters only if equal-length specials can overlap, none do in Gemma)
        specials = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        specials.sort(key=lambda i: -len(self.texts[i]))
        self._specials_all: dict[str, list[tuple[int, str, int]]] = {}  # first two chars -> (order, text, id)
        self._specials_user: dict[str, list[tuple[int, str, int]]] = {}
        for order, i in enumerate(specials):
            entry = (order, self.texts[i], i)
            self._specials_all.setdefault(self.texts[i][:2], []).append(entry)
            if not self.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN):
                self._specials_user.setdefault(self.texts[i][:2], []).append(entry)

    def _retype_by_text(self, eos_id: int | None, eot_ids: set[int] | None) -> set[int]:
        """The end-of-generation ids, retyping tokens by their text as llama.cpp's loader
        does (see the module docstring)."""
        ids, attrs = self.ids, self.attrs
        eog = set(eot_ids or ())
        for text in EOG_TEXTS:  # llama.cpp also makes them control tokens
            i = ids.get(text)
            if i is not None:
                eog.add(i)
                attrs[i] |= ATTR_CONTROL
        for text in VISIBLE_TEXTS:
            if text in ids:
                attrs[ids[text]] = ATTR_USER_DEFINED
        if eos_id is not None:
            eog.add(eos_id)
        eog_texts = {self.texts[i] for i in eog}
        has_call = bool(eog_texts & {"<|call|>", "<|calls|>"})
        end = ids.get("<|end|>")
        if end in eog and has_call and eog_texts & {"<|return|>", "<|flush|>"}:
            eog.discard(end)
            attrs[end] = ATTR_USER_DEFINED
        return eog

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """Cut special tokens out of `text`: a list of text fragments and token ids."""
        # only tokens whose first two characters occur in the text, in partition order
        found = []
        for head, group in (self._specials_all if special else self._specials_user).items():
            if head in text:
                found.extend(group)
        found.sort()
        frags: list[tuple[int, int] | int] = [(0, len(text))]
        for _, s, tid in found:
            if s not in text:
                continue
            size = len(s)
            out: list[tuple[int, int] | int] = []
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                start, end = f
                pos = text.find(s, start, end)
                if pos < 0:
                    out.append(f)
                    continue
                while pos >= 0:
                    if pos > start:
                        out.append((start, pos))
                    out.append(tid)
                    start = pos + size
                    pos = text.find(s, start, end)
                if start < end:
                    out.append((start, end))
            frags = out
        return [f if isinstance(f, int) else text[f[0] : f[1]] for f in frags]


def eot_ids_from_metadata(meta: dict[str, Any], n_tokens: int) -> set[int]:
    """The end-of-turn / end-of-message ids the metadata names."""
    eot = set()
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        i = _meta_id(meta, key, None, n_tokens)
        if i is not None:
            eot.add(i)
    return eot


def _meta_id(meta: dict[str, Any], key: str, default: int | None, n_tokens: int) -> int | None:
    """A special-token id from metadata, llama.cpp style: bad ids keep the default."""
    if default is not None and default >= n_tokens:
        default = None
    value = meta.get(key)
    if value is None:
        return default
    value = int(value)
    if 0 <= value < n_tokens:
        return value
    return default
