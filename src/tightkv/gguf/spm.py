"""The SentencePiece-style vocab (`tokenizer.ggml.model` = 'llama'), as llama.cpp's
`llm_tokenizer_spm` runs it.

Encoding follows llama.cpp step by step:

1. Special-token partition (`tokenizer_st_partition`): control, unknown and
   user-defined tokens are cut out of the raw text, longest text first.
   User-defined tokens are always cut out; control and unknown ones only with
   ``special=True``.
2. Each remaining text fragment gets a leading space when `add_space_prefix` is
   set and it is first or follows a special token, then spaces become '▁'.
3. The SPM merge: start from single characters and keep merging the adjacent
   pair whose concatenation is the highest-scoring vocab entry (ties go to the
   leftmost pair); symbols that are not in the vocab fall back to <0xNN> tokens.

Speed: a merge can only join two characters if some vocab entry contains that
character pair, so a fragment can be cut wherever the pair at the cut appears in
no vocab entry; the pieces merge independently and exactly as the whole would.
Pieces (mostly words) are cached. `encode_reference` skips the cutting and the
cache and is kept as the reference for tests.
"""

from __future__ import annotations

import heapq
import re
from typing import Any

from ..errors import GGUFError
from .vocab import (
    ATTR_UNDEFINED,
    TYPE_NORMAL,
    Tokenizer,
    _meta_id,
    _TYPE_TO_ATTR,
    eot_ids_from_metadata,
)

SPACE = "\u2581"  # '▁', SentencePiece's escaped space

_CUT_BEFORE_SPACE = re.compile(f"(?={SPACE})")
_LONG_PIECE = 64  # pieces longer than this are also cut at every safe character pair
_CACHE_LIMIT = 200_000


class SPMTokenizer(Tokenizer):
    """SentencePiece-style vocab (`tokenizer.ggml.model` = 'llama'), as llama.cpp runs it."""

    def __init__(
        self,
        tokens: list[str],
        scores: list[float] | None = None,
        types: list[int] | None = None,
        *,
        bos_id: int | None = 1,
        eos_id: int | None = 2,
        unk_id: int | None = 0,
        add_bos: bool = True,
        add_eos: bool = False,
        add_space_prefix: bool = True,
        eot_ids: set[int] | None = None,
    ):
        n = len(tokens)
        if n == 0:
            raise GGUFError("tokenizer vocabulary is empty")
        # llama.cpp renames empty entries so every text maps to an id
        self.texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * n
        types = types if types is not None else [TYPE_NORMAL] * n
        self.attrs = [_TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in types]
        self.ids = {t: i for i, t in enumerate(self.texts)}
        self.vocab_size = n
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.unk_id = unk_id
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)
        self.add_space_prefix = bool(add_space_prefix)

        self._setup_specials(eos_id, eot_ids)

        # byte fallback: <0xNN>, else the single-byte character itself
        self._byte_ids: list[int | None] = []
        for b in range(256):
            i = self.ids.get(f"<0x{b:02X}>")
            if i is None and b < 0x80:
                i = self.ids.get(chr(b))
            self._byte_ids.append(i)

        # character pairs that occur inside some vocab entry; no merge crosses any other pair
        self._pairs = frozenset({t[k : k + 2] for t in self.texts for k in range(len(t) - 1)})
        self._cache: dict[str, list[int]] = {}
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "SPMTokenizer":
        """Build from GGUF metadata (keys `tokenizer.ggml.*`)."""
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise GGUFError("GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        n = len(tokens)
        scores = meta.get("tokenizer.ggml.scores")
        types = meta.get("tokenizer.ggml.token_type")
        if scores is not None and len(scores) < n:
            raise GGUFError(f"tokenizer has {len(scores)} scores for {n} tokens")
        if types is not None and len(types) < n:
            raise GGUFError(f"tokenizer has {len(types)} token types for {n} tokens")
        eot = eot_ids_from_metadata(meta, n)
        return cls(
            list(tokens),
            list(scores[:n]) if scores is not None else None,
            list(types[:n]) if types is not None else None,
            bos_id=_meta_id(meta, "tokenizer.ggml.bos_token_id", 1, n),
            eos_id=_meta_id(meta, "tokenizer.ggml.eos_token_id", 2, n),
            unk_id=_meta_id(meta, "tokenizer.ggml.unknown_token_id", 0, n),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
            eot_ids=eot,
        )

    # -- encoding -----------------------------------------------------------

    def encode_reference(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Like `encode`, but one SPM merge over each whole fragment: slow, for checking."""
        return self._bos_eos(self._encode_text(text, special, self._merge), add_bos)

    def _encode_text(self, text: str, special: bool, encode_fragment) -> list[int]:
        out: list[int] = []
        prev_special = True
        for frag in self._partition(text, special) if text else ():
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                frag = " " + frag
            out.extend(encode_fragment(frag.replace(" ", SPACE)))
            prev_special = False
        return out

    def _encode_fragment(self, text: str) -> list[int]:
        """Encode one escaped fragment piece by piece, through the cache."""
        out: list[int] = []
        cache = self._cache
        for piece in self._split(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._merge(piece)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
        return out

    def _split(self, text: str) -> list[str]:
        """Cut `text` where no vocab entry holds the two characters at the cut."""
        pairs = self._pairs
        pieces: list[str] = []
        for part in _CUT_BEFORE_SPACE.split(text):
            if not part:
                continue
            if pieces and (pieces[-1][-1] + part[0]) in pairs:
                pieces[-1] += part
            else:
                pieces.append(part)
        if not any(len(p) > _LONG_PIECE for p in pieces):
            return pieces
        out: list[str] = []
        for p in pieces:
            if len(p) <= _LONG_PIECE:
                out.append(p)
                continue
            start = 0
            for k in range(1, len(p)):
                if p[k - 1 : k + 1] not in pairs:
                    out.append(p[start:k])
                    start = k
            out.append(p[start:])
        return out

    def _merge(self, text: str) -> list[int]:
        """llama.cpp's `llm_tokenizer_spm_session::tokenize` on one escaped string."""
        ids = self.ids
        n = len(text)
        if n == 1:
            i = ids.get(text)
            return [i] if i is not None else self._bytes_to_ids(text)
        scores = self.scores
        size = [1] * n  # symbol i starts at character i; size 0 once merged away
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for k in range(n - 1):
            i = ids.get(text[k : k + 2])
            if i is not None:
                heap.append((-scores[i], k, k + 1, 2))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, right, total = pop(heap)
            sl, sr = size[left], size[right]
            if sl == 0 or sr == 0 or sl + sr != total:
                continue  # stale: one side has merged since
            size[left] = total
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                t = size[before] + total
                i = ids.get(text[before : before + t])
                if i is not None:
                    push(heap, (-scores[i], before, left, t))
            if after >= 0:
                t = total + size[after]
                i = ids.get(text[left : left + t])
                if i is not None:
                    push(heap, (-scores[i], left, after, t))
        out: list[int] = []
        k = 0
        while k != -1:
            piece = text[k : k + size[k]]
            i = ids.get(piece)
            if i is not None:
                out.append(i)
            else:
                out.extend(self._bytes_to_ids(piece))
            k = nxt[k]
        return out

    def _bytes_to_ids(self, piece: str) -> list[int]:
        out = []
        for b in piece.encode("utf-8"):
            i = self._byte_ids[b]
            if i is None:
                raise GGUFError(f"tokenizer has no byte token for 0x{b:02X}")
            out.append(i)
        return out

    # -- decoding -----------------------------------------------------------

    def normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8")

    def decode(self, ids: list[int], special: bool = False) -> str:
        """llama.cpp's `detokenize` (control tokens rendered only with `special`, no clean-up
        of spaces)."""
        data = self.decode_bytes(ids, special)
        if self.add_space_prefix and ids and self.token_bytes(ids[0]).startswith(b" "):
            data = data[1:]  # llama.cpp drops the space the encoder put in front
        return data.decode("utf-8", errors="replace")
