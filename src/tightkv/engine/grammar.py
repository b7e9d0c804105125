"""Constrained decoding: a grammar (JSON schema, any JSON, Lark, GBNF, regex) masks the
logits of each step, so the output is valid by construction, never by retry.

The grammar engine is llguidance (guidance-ai; Rust, abi3 wheels, no torch or
transformers needed): it builds its token trie from our own vocab (`token_table`)
and answers each step's allowed-token bitmask in tens of microseconds even for
Gemma's 262,144 tokens (`bench/grammar_overhead.py` measures it beside xgrammar).
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import torch

from ..errors import TightKVError

ANY_JSON = {"type": "object"}  # OpenAI's json_object and Ollama's "json": one JSON object


class _Vocab:
    """What llguidance's `TokenizerWrapper` reads: each token's bytes (control tokens
    marked with a leading 0xFF, so no text grammar can produce them), EOS, and encode."""

    def __init__(self, tokenizer):
        from ..gguf.vocab import ATTR_CONTROL

        self.tok = tokenizer
        attrs = getattr(tokenizer, "attrs", None)
        texts = getattr(tokenizer, "texts", None)
        self.tokens = []
        for i in range(tokenizer.vocab_size):
            if attrs is not None and attrs[i] & ATTR_CONTROL:
                self.tokens.append(b"\xff" + texts[i].encode("utf-8"))
            else:
                self.tokens.append(tokenizer.token_bytes(i))
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eot_ids)
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [
            i for i in range(tokenizer.vocab_size) if attrs is not None and attrs[i] & ATTR_CONTROL
        ]

    def __call__(self, text: str) -> list[int]:
        return self.tok.encode(text, add_bos=False, special=False)


_TABLES: dict[int, object] = {}


def token_table(tokenizer):
    """The llguidance tokenizer of one of ours (built once per tokenizer: about a second for 262K tokens)."""
    import llguidance

    table = _TABLES.get(id(tokenizer))
    if table is None:
        eos = sorted(tokenizer.eot_ids) or None
        table = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tokenizer)), eos_token=eos)
        _TABLES[id(tokenizer)] = table
    return table


# llama.cpp's `space` rule (json-schema-to-grammar's SPACE_RULE): nothing, a space, or one or
# two line breaks and up to 20 spaces or tabs, between any two tokens of the JSON. A model may
# indent (Qwen's likeliest first token of an object is "{\n"), never run on in whitespace.
WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"
JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": WHITESPACE}


def json_schema_grammar(schema: dict | bool | None) -> str:
    """The grammar of one JSON value that validates against `schema` (None: any JSON object).
    An object that names its properties takes no others unless its schema says so, and an
    unbounded integer has at most 16 digits (`closed_objects`), as llama.cpp's and Ollama's
    converters have it (vLLM's closes objects too); whitespace between tokens as llama.cpp's
    grammars bound it (`WHITESPACE`)."""
    import llguidance

    if schema is True or schema is None:
        schema = ANY_JSON
    if not isinstance(schema, dict):
        raise TightKVError("a JSON schema must be an object")
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(closed_objects(schema)), defaults=JSON_OPTIONS)


def json_rule(schema: dict) -> str:
    """A Lark rule body (llguidance's ``%json``) for one JSON value valid for `schema`, closed
    and with bounded whitespace as `json_schema_grammar` makes it (a bare ``%json`` would take
    any whitespace, without end)."""
    return "%json " + json.dumps({**closed_objects(schema), "x-guidance": JSON_OPTIONS})


# where a schema holds subschemas: maps of them, lists of them, one
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
INTEGER_BOUND = 10**16 - 1  # llama.cpp's integers: at most 16 digits


def closed_objects(schema):
    """A copy of `schema` with `"additionalProperties": false` on every object schema that
    names properties and does not say (the JSON Schema default allows any others, which
    small models fill with invented keys), and a bound of +-INTEGER_BOUND on each side an
    integer leaves open (a small model denied the key it wanted may run on in digits; llama.cpp
    bounds every integer, `minimum` alone too, to 16 digits). A schema that
    intersects objects with a several-member allOf is left as it is: closing each member
    would leave nothing to match."""
    if not isinstance(schema, dict) or _has_intersection(schema):
        return schema
    return _close(schema)


def _has_intersection(schema) -> bool:
    if isinstance(schema, dict):
        return (isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1) or any(
            _has_intersection(v) for v in schema.values()
        )
    return isinstance(schema, list) and any(_has_intersection(v) for v in schema)


def _close(schema):
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_close(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key])
    if (
        ("properties" in out or "patternProperties" in out)
        and "additionalProperties" not in out
        and "unevaluatedProperties" not in out
    ):
        out["additionalProperties"] = False
    if out.get("type") == "integer":
        if not {"minimum", "exclusiveMinimum"} & set(out):
            out["minimum"] = -INTEGER_BOUND
        if not {"maximum", "exclusiveMaximum"} & set(out):
            out["maximum"] = INTEGER_BOUND
    return out


def lark_grammar(text: str) -> str:
    """A grammar in Lark syntax or llama.cpp's GBNF (llguidance converts GBNF)."""
    import llguidance

    try:
        return llguidance.grammar_from("grammar", text)
    except ValueError as err:
        raise TightKVError(f"the grammar does not parse: {str(err).splitlines()[0]}") from None


def regex_grammar(pattern: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_regex(pattern)


@lru_cache(maxsize=64)
def _checked(grammar: str, table_id: int) -> None:
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(grammar, _TABLES[table_id])
    if error and not error.startswith("WARNING"):
        raise TightKVError(f"the grammar is not valid: {error.splitlines()[0]}")


class Constraint:
    """One sequence's grammar state: `mask` the next logits, `accept` the token drawn.
    `finished` once the grammar is complete and admits nothing more (the sequence then
    ends with reason "stop")."""

    def __init__(self, grammar: str, tokenizer):
        import llguidance

        table = token_table(tokenizer)
        _checked(grammar, id(tokenizer))
        self.matcher = llguidance.LLMatcher(table, grammar, log_level=0)
        self.words = (table.vocab_size + 31) // 32
        self.bits = np.full(self.words, -1, dtype=np.int32)  # bit t: token t allowed
        self._fresh = False  # bits hold the mask of the current state

    def _compute(self) -> None:
        if self._fresh:
            return
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.words * 4)
        if self.matcher.is_error():
            raise TightKVError(f"constrained decoding failed: {self.matcher.get_error()}")
        self._fresh = True

    def allows(self, token: int) -> bool:
        """Whether the grammar admits `token` next."""
        self._compute()
        return bool((int(self.bits[token >> 5]) >> (token & 31)) & 1)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (vocab,) with every token the grammar forbids at -inf (a new tensor; in
        numpy, single-threaded: torch's parallel ops stall a busy box at this size)."""
        self._compute()
        allowed = np.unpackbits(self.bits.view(np.uint8), bitorder="little")[: logits.numel()]  # (vocab,)
        out = logits.float().numpy().copy()
        out[allowed == 0] = -np.inf
        return torch.from_numpy(out)

    def accept(self, token: int) -> None:
        self._fresh = False
        if not self.matcher.consume_token(token):
            raise TightKVError(
                f"constrained decoding: token {token} was not allowed ({self.matcher.get_error() or 'grammar'})"
            )

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()
