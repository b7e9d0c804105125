"""GPT-2 byte-level BPE (`tokenizer.ggml.model` = 'gpt2'), as llama.cpp's `llm_tokenizer_bpe` runs it.

Llama 3, Qwen 2/3, SmolLM, Phi-2, GPT-2 and most other non-SentencePiece models
store this kind of vocabulary. Encoding follows llama.cpp step by step:

1. Special-token partition, shared with the SentencePiece tokenizer
   (`SPMTokenizer._partition`, llama.cpp's `tokenizer_st_partition`):
   user-defined tokens are always cut out of the text, control and unknown ones
   only with ``special=True``. There is no space prefix.
2. Pre-tokenization (`unicode_regex_split`): the regexes that
   `tokenizer.ggml.pre` names (`PRE_TOKENIZERS`) are applied one after the
   other; each cuts every piece of the previous pass into its matches, and the
   text between matches stays a piece of its own.
3. Each piece (a "word") is UTF-8 encoded and every byte mapped to its GPT-2
   unicode stand-in (`BYTE_TO_CHAR`), the form the vocabulary is written in.
   With ``ignore_merges`` (Llama 3) a word that is itself a token is taken
   whole. Otherwise, starting from single bytes, the adjacent pair whose merge
   (`tokenizer.ggml.merges`, "left right") comes first is merged, the leftmost
   pair on ties, until no adjacent pair has a merge.
4. Every resulting symbol is looked up in the vocabulary; a symbol that is not
   a token falls back to one token per byte.

Words repeat a lot in real text, so their ids are cached; a 640 KB English text
encodes in well under a second.

Decoding maps each character of a normal token back to its byte
(`token_bytes`), so decoding is exact and a stream can be cut between any two
tokens; user-defined tokens give their text, control tokens nothing. llama.cpp's
optional space clean-up (`clean_spaces`) is not applied.

Gemma 4 (`tokenizer.ggml.model` = 'gemma4', or `tokenizer.ggml.pre` = 'gemma4')
stores a SentencePiece-style BPE that llama.cpp runs through the same code with
three changes (`SPM_STYLE_PRES`): spaces become ``▁`` before anything else; the
only pre-tokenizer split is between newline runs and the rest
(``[^\n]+|[\n]+``), and a newline run that is itself a token is taken whole;
words are not byte-encoded (merges and tokens are plain UTF-8), and a symbol with
no token falls back to ``<0xNN>`` byte tokens (a byte without one is dropped).
Normal tokens decode with ``▁`` back to spaces. A BOS is always added (llama.cpp
overrides ``add_bos_token`` = false for it).

Deliberate differences from llama.cpp, for inputs real vocabularies do not hit:
- a symbol with no token falls back to its bytes' tokens (llama.cpp looks up
  single bytes of the byte-encoded UTF-8 string and, for non-ASCII bytes,
  silently drops them);
- a `tokenizer.ggml.pre` that llama.cpp does not know is a load error there;
  here it warns and uses the GPT-2 regex.
"""

from __future__ import annotations

import heapq
import warnings
from typing import Any

import regex

from ..errors import GGUFError
from .spm import SPACE
from .vocab import (
    ATTR_UNDEFINED,
    TYPE_NORMAL,
    Tokenizer,
    _meta_id,
    _TYPE_TO_ATTR,
    eot_ids_from_metadata,
)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (`bytes_to_unicode`, llama.cpp's `unicode_byte_to_utf8`)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 character (one byte) -> its GPT-2 stand-in
_BYTE_TRANSLATE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    """`text`'s UTF-8 bytes, each written as its GPT-2 stand-in character."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TRANSLATE)


# -- pre-tokenizers ----------------------------------------------------------
# The regexes of llama.cpp's `llm_tokenizer_bpe` constructor, by pre-tokenizer.

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# GPT-2. llama.cpp spells it without the final "|\s+", but its own implementation of
# it (`unicode_regex_split_custom_gpt2`, used wherever it appears) has that branch.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# regex list, ignore_merges, add_bos default, aliases (`tokenizer.ggml.pre` values)
_PRE_SPECS: list[tuple[tuple[str, ...], bool, bool, tuple[str, ...]]] = [
    (
        (GPT2,),
        False,
        False,
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ),
    ),
    (
        (LLAMA3,),
        True,
        True,
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
    ),
    ((LLAMA3,), False, False, ("dbrx", "smaug-bpe", "glm4", "chatglm-bpe")),
    (
        (QWEN2,),
        False,
        False,
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
    ),
    ((QWEN35,), False, False, ("qwen35",)),
    (
        (r"\p{N}", GPT2),
        False,
        False,
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
    ),
    ((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"), False, False, ("falcon",)),
    ((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"), False, False, ("deepseek-coder",)),
    (
        (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3),
        False,
        False,
        ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
    ),
    ((TEKKEN,), True, True, ("tekken",)),
    ((GPT4O,), False, False, ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")),
    ((SEED_CODER,), False, False, ("seed-coder",)),
    ((BAILINGMOE,), False, False, ("bailingmoe", "bailingmoe2", "llada-moe")),
    ((r" ?[^(\s|.,!?…。，、।۔،)]+",), False, False, ("poro-chat", "bloom", "gpt3-finnish")),
    ((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False, ("default",)),
]

PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    name: (regexes, ignore_merges, add_bos) for regexes, ignore_merges, add_bos, names in _PRE_SPECS for name in names
}
# SentencePiece-style BPE (Gemma 4): "▁" for spaces, no byte encoding, <0xNN> byte tokens
SPM_STYLE_PRES = ("gemma4", "granite-embed-multi-311m")
for _name in SPM_STYLE_PRES:
    PRE_TOKENIZERS[_name] = ((r"[^\n]+|[\n]+",), False, True)

_CACHE_LIMIT = 200_000

# Fill-in-the-middle tokens that llama.cpp also counts as end of generation (Qwen 2.5
# vocabularies have them): metadata key, then the token texts it looks for.
_FIM_EOG = (
    ("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("tokenizer.ggml.fim_rep_token_id", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)),
)


class PreTokenizer:
    """llama.cpp's `unicode_regex_split` for one list of regexes (without the byte encoding)."""

    def __init__(self, regexes: tuple[str, ...] | list[str]):
        self.regexes = tuple(regexes)
        self._patterns = [regex.compile(r) for r in self.regexes]
        single = self._patterns[0] if len(self._patterns) == 1 else None
        # one regex without groups: findall gives the words; checked to cover the text
        self._findall = single.findall if single is not None and single.groups == 0 else None

    def split(self, text: str) -> list[str]:
        """The words of `text`, in order; they join back to `text`."""
        if self._findall is not None:
            words = self._findall(text)
            if sum(map(len, words)) == len(text):
                return words
        pieces = [text]
        for pattern in self._patterns:
            out: list[str] = []
            for piece in pieces:
                pos = 0
                for m in pattern.finditer(piece):
                    start, end = m.span()
                    if start > pos:
                        out.append(piece[pos:start])  # text between matches stays a piece
                    if end > start:
                        out.append(piece[start:end])
                    pos = end
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces


class BPETokenizer(Tokenizer):
    """Byte-level BPE vocab (`tokenizer.ggml.model` = 'gpt2'), or Gemma 4's SentencePiece-style
    one ('gemma4'), as llama.cpp runs them."""

    def __init__(
        self,
        tokens: list[str],
        merges: list[str],
        types: list[int] | None = None,
        *,
        pre: str | None = "gpt-2",
        bos_id: int | None = 11,
        eos_id: int | None = 11,
        add_bos: bool | None = None,
        add_eos: bool = False,
        eot_ids: set[int] | None = None,
    ):
        n = len(tokens)
        if n == 0:
            raise GGUFError("tokenizer vocabulary is empty")
        self.texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types = types if types is not None else [TYPE_NORMAL] * n
        self.attrs = [_TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in types]
        self.ids: dict[str, int] = {}
        for i, t in enumerate(self.texts):
            self.ids.setdefault(t, i)
        self.vocab_size = n

        # merges: "left right", split at the first space after the first character;
        # the first occurrence of a pair keeps its rank
        ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            cut = m.find(" ", 1)
            pair = (m[:cut], m[cut + 1 :]) if cut >= 0 else ("", "")
            ranks.setdefault(pair, rank)
        self.ranks = ranks

        # pre-tokenizer; llama.cpp uses 'default' when the GGUF names none
        if pre is None or pre == "":
            warnings.warn("GGUF names no BPE pre-tokenizer (tokenizer.ggml.pre); using 'default'", stacklevel=2)
            pre = "default"
        spec = PRE_TOKENIZERS.get(pre)
        if spec is None:
            warnings.warn(f"unknown BPE pre-tokenizer '{pre}' (tokenizer.ggml.pre); using 'gpt-2'", stacklevel=2)
            spec = PRE_TOKENIZERS["gpt-2"]
        regexes, self.ignore_merges, default_add_bos = spec
        self.pre = pre
        self.pre_tokenizer = PreTokenizer(regexes)
        self.spm_style = pre in SPM_STYLE_PRES

        self.bos_id = bos_id
        self.eos_id = eos_id
        # llama.cpp turns Gemma 4's add_bos_token = false into true
        self.add_bos = default_add_bos if add_bos is None or self.spm_style else bool(add_bos)
        self.add_eos = bool(add_eos)

        self._setup_specials(eos_id, eot_ids)

        if self.spm_style:
            self._byte_ids = [self.ids.get(f"<0x{b:02X}>") for b in range(256)]
        else:
            self._byte_ids = [self.ids.get(c) for c in BYTE_TO_CHAR]
        self._cache: dict[str, tuple[int, ...]] = {}
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "BPETokenizer":
        """Build from GGUF metadata (keys `tokenizer.ggml.*`)."""
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise GGUFError("GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise GGUFError("GGUF has a BPE tokenizer but no merges (tokenizer.ggml.merges)")
        n = len(tokens)
        types = meta.get("tokenizer.ggml.token_type")
        if types is not None and len(types) < n:
            raise GGUFError(f"tokenizer has {len(types)} token types for {n} tokens")
        eot = eot_ids_from_metadata(meta, n)
        for key, texts in _FIM_EOG:
            i = _meta_id(meta, key, None, n)
            if i is None:
                i = next((tokens.index(t) for t in texts if t in tokens), None)
            if i is not None:
                eot.add(i)
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        # a 'gemma4' model is its own pre-tokenizer and has no default BOS/EOS ids
        gemma4 = meta.get("tokenizer.ggml.model") == "gemma4"
        default_id = None if gemma4 else 11
        return cls(
            list(tokens),
            list(merges),
            list(types[:n]) if types is not None else None,
            pre="gemma4" if gemma4 else meta.get("tokenizer.ggml.pre"),
            bos_id=_meta_id(meta, "tokenizer.ggml.bos_token_id", default_id, n),
            eos_id=_meta_id(meta, "tokenizer.ggml.eos_token_id", default_id, n),
            add_bos=None if add_bos is None else bool(add_bos),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            eot_ids=eot,
        )

    # -- encoding -----------------------------------------------------------

    def _encode_text(self, text: str, special: bool, encode_fragment) -> list[int]:
        out: list[int] = []
        if text:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: U+FFFD, as llama.cpp reads bad UTF-8
                text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            for frag in self._partition(text, special):
                out.extend([frag] if isinstance(frag, int) else encode_fragment(frag))
        return out

    def _encode_fragment(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        if self.spm_style:
            text = text.replace(" ", SPACE)
        for word in self.pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        """One pre-tokenized word: byte-encode, merge, look up."""
        s = word if self.spm_style else byte_encode(word)
        ids = self.ids
        if self.ignore_merges or (self.spm_style and not s.strip("\n")):
            i = ids.get(s)  # taken whole: a Llama 3 word, a Gemma 4 newline run
            if i is not None:
                return (i,)
        out: list[int] = []
        for sym in self.merge(s):
            i = ids.get(sym)
            if i is not None:
                out.append(i)
            else:  # no such token: one token per byte
                out.extend(self._fallback(sym))
        return tuple(out)

    def _fallback(self, sym: str) -> list[int]:
        """The byte tokens of a symbol that is no token: GPT-2 byte characters (each one
        byte), or Gemma 4's <0xNN> tokens of its UTF-8 (llama.cpp drops a missing one)."""
        if self.spm_style:
            return [i for i in map(self._byte_ids.__getitem__, sym.encode("utf-8")) if i is not None]
        out = []
        for c in sym:
            i = self._byte_ids[CHAR_TO_BYTE[c]]
            if i is None:
                raise GGUFError(f"tokenizer has no token for byte 0x{CHAR_TO_BYTE[c]:02X}")
            out.append(i)
        return out

    def merge(self, s: str) -> list[str]:
        """The BPE merge of byte-encoded `s`: lowest merge rank first, leftmost on ties."""
        n = len(s)
        if n < 2:
            return [s] if s else []
        ranks = self.ranks
        size = [1] * n  # symbol k starts at character k; size 0 once merged away
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for k in range(n - 1):
            r = ranks.get((s[k], s[k + 1]))
            if r is not None:
                heap.append((r, k, 1, 1))
        if not heap:
            return list(s)
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, sl, sr = pop(heap)
            right = left + sl
            if size[left] != sl or right >= n or size[right] != sr:
                continue  # stale: one side has merged since
            total = sl + sr
            size[left] = total
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                sb = size[before]
                r = ranks.get((s[before:left], s[left : left + total]))
                if r is not None:
                    push(heap, (r, before, sb, total))
            if after >= 0:
                sa = size[after]
                r = ranks.get((s[left:after], s[after : after + sa]))
                if r is not None:
                    push(heap, (r, left, total, sa))
        out = []
        k = 0
        while k != -1:
            out.append(s[k : k + size[k]])
            k = nxt[k]
        return out

    # -- decoding -----------------------------------------------------------

    def normal_bytes(self, text: str) -> bytes:
        """GPT-2's byte characters back to bytes; other characters stay as their UTF-8.
        Gemma 4: the text with "▁" back to spaces."""
        if self.spm_style:
            return text.replace(SPACE, " ").encode("utf-8")
        get = CHAR_TO_BYTE.get
        data = bytearray()
        for c in text:
            byte = get(c)
            if byte is None:  # not a GPT-2 byte character: keep it as text
                data += c.encode("utf-8")
            else:
                data.append(byte)
        return bytes(data)
