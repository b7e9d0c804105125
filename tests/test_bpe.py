"""Byte-level BPE tests: tiktoken's ids on the real GPT-2 ranks, pre-tokenizers, special tokens.

The GPT-2 ranks are `whisper/assets/gpt2.tiktoken` from the PyPI source package
`openai-whisper` 20250625 (MIT licensed), committed as tests/reference/gpt2.tiktoken
(sha256 checked), so these tests need no network. The ranks are
written into a vocab-only GGUF (`tokenizer.ggml.model` = 'gpt2') and read back
through tightkv's reader.
"""

from __future__ import annotations

import base64
import hashlib
import time
from pathlib import Path

import pytest
from gguf import GGUFWriter

from tightkv.errors import GGUFError
from tightkv.gguf.bpe import BYTE_TO_CHAR, GPT2, PRE_TOKENIZERS, BPETokenizer, PreTokenizer, byte_encode
from tightkv.gguf.reader import read_gguf
from tightkv.gguf.tokenizer import TYPE_CONTROL, TYPE_NORMAL, TYPE_USER_DEFINED, Tokenizer, load_tokenizer

RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT = 50256

# Llama 3's and Qwen 2's regexes as their tokenizer.json (and tiktoken) write them
HF_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
HF_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SAMPLES = {
    "korean": "KV 캐시 압축을 통해 문서 전체를 로드하세요. 한국어 토큰화 테스트입니다.",
    "chinese": "中文测试：模型量化与长上下文。日本語のテキスト、カタカナとひらがな。",
    "emoji": "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖✨🎉 ok👌",
    "accents": "naïve façade — “quotes” and ‘single’ … ellipsis; ÀÉÎÕÜ àéîõü ñ ç ø å ß Ω Ж e\u0301 a\u0308",
    "scripts": "مرحبا بالعالم שלום नमस्ते สวัสดี Καλημέρα Привет мир 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 ½ ² Ⅻ ∑∫√∞≈",
    "whitespace": (
        "   three  two\t\ttabs \t mixed\n\n\n  \n   trailing   \r\nCRLF\r\n\u00a0nbsp\u2009thin\u3000wide end  "
    ),
    "python": (
        "def fib(n: int) -> int:\n"
        "    '''Return the n-th Fibonacci number.'''\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b  # tuple swap\n"
        "    return a\n\n\n"
        'if __name__ == "__main__":\n'
        "\tprint({i: fib(i) for i in range(10)}, [x**2 for x in (1, 2, 3)])\n"
    ),
    "numbers": "1,234,567.89 and -0.001e-5, 3.14159265358979, 1000000000000, 0x1F, 2024-06-25T12:34:56Z, 007",
    "contractions": "They're we've I'll he'd she's it'S WE'RE YOU'VE can't won't o'clock rock'n'roll '' 's",
    "urls": 'https://example.com/path?q=1&r=2#frag  a@b.org  C:\\Users\\x  $HOME/~u  <b>x</b> {"k": [1, 2]}',
    "controls": "nul\x00 bell\x07 esc\x1b[31m del\x7f fs\x1c\x1d\x1e\x1f zwsp\u200b bom\ufeff end",
    "long": "x" * 3000 + " " + "ab" * 500 + " " * 700 + "!" * 300,
}


# -- the GPT-2 ranks and their GGUF --------------------------------------------


@pytest.fixture(scope="session")
def ranks_file() -> Path:
    path = Path(__file__).resolve().parent / "reference" / "gpt2.tiktoken"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == RANKS_SHA256, "unexpected gpt2.tiktoken contents"
    return path


@pytest.fixture(scope="session")
def ranks(ranks_file) -> dict[bytes, int]:
    out = {}
    for line in ranks_file.read_bytes().splitlines():
        token, rank = line.split()
        out[base64.b64decode(token)] = int(rank)
    assert sorted(out.values()) == list(range(len(out))) and len(out) == EOT
    return out


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE of `token` using only ranks below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def ranks_to_merges(ranks: dict[bytes, int]) -> list[str]:
    """GGUF merges from tiktoken ranks, in rank order.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank. A
    multi-byte token is therefore made by the one merge that BPE over its bytes,
    restricted to lower ranks, ends with: two parts (the reverse of how the ranks
    were trained; HF's tiktoken converter does the same).
    """

    def enc(b: bytes) -> str:
        return "".join(BYTE_TO_CHAR[x] for x in b)

    merges = []
    for token in sorted(ranks, key=ranks.get):
        if len(token) > 1:
            parts = _bpe_parts(ranks, token, ranks[token])
            assert len(parts) == 2, (token, parts)
            merges.append(f"{enc(parts[0])} {enc(parts[1])}")
    return merges


@pytest.fixture(scope="session")
def gpt2_gguf(ranks, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bpe") / "gpt2-vocab.gguf"
    tokens = ["".join(BYTE_TO_CHAR[x] for x in t) for t in sorted(ranks, key=ranks.get)] + ["<|endoftext|>"]
    w = GGUFWriter(str(path), "gpt2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([TYPE_NORMAL] * EOT + [TYPE_CONTROL])
    w.add_token_merges(ranks_to_merges(ranks))
    w.add_bos_token_id(EOT)
    w.add_eos_token_id(EOT)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def gpt2_meta(gpt2_gguf) -> dict:
    return read_gguf(gpt2_gguf).metadata


@pytest.fixture(scope="session")
def tok(gpt2_meta) -> BPETokenizer:
    return load_tokenizer(gpt2_meta)


def _tiktoken(ranks, pat_str):
    import tiktoken

    return tiktoken.Encoding(
        name="gpt2-ranks", pat_str=pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOT}
    )


@pytest.fixture(scope="session")
def tt(ranks):
    return _tiktoken(ranks, GPT2)


def _first_difference(a: list[int], b: list[int]) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at {k}: ours {a[k : k + 6]}, tiktoken {b[k : k + 6]}"


# -- tiktoken on the GPT-2 ranks ------------------------------------------------


def test_gpt2_vocab(tok, gpt2_meta):
    assert isinstance(tok, BPETokenizer) and isinstance(tok, Tokenizer)
    assert gpt2_meta["tokenizer.ggml.model"] == "gpt2"
    assert tok.vocab_size == EOT + 1 and len(tok.ranks) == 50000
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.ignore_merges) == (EOT, EOT, False, False)
    assert tok.eot_ids == {EOT}
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2 adds no BOS


def test_essays_equal_tiktoken(gpt2_meta, tt, essays_file):
    text = essays_file.read_text(encoding="utf-8")
    fresh = load_tokenizer(gpt2_meta)  # cold word cache
    start = time.perf_counter()
    ids = fresh.encode(text)
    elapsed = time.perf_counter() - start
    ref = tt.encode_ordinary(text)
    assert ids == ref, _first_difference(ids, ref)
    assert elapsed < 5, f"essays took {elapsed:.1f} s"
    assert fresh.decode(ids) == text


@pytest.mark.parametrize("name", SAMPLES)
def test_unicode_and_code_equal_tiktoken(tok, tt, name):
    text = SAMPLES[name]
    ids = tok.encode(text)
    ref = tt.encode_ordinary(text)
    assert ids == ref, _first_difference(ids, ref)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_all_samples_in_one_text(tok, tt):
    text = "\n".join(SAMPLES.values())
    assert tok.encode(text) == tt.encode_ordinary(text)


def test_streaming_token_bytes(tok):
    # Chinese characters and emoji split into byte tokens that are not UTF-8 on their own
    ids = tok.encode("模型🤖")
    pieces = [tok.token_bytes(i) for i in ids]
    assert len(pieces) > 2 and any(_bad_utf8(p) for p in pieces)
    assert b"".join(pieces).decode("utf-8") == "模型🤖"
    with pytest.raises(ValueError):
        tok.token_bytes(tok.vocab_size)


def _bad_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_special_rule_on_gpt2(tok, tt):
    text = "a<|endoftext|>b <|endoftext|>"
    # special=False: the control token's text is plain text, as tiktoken's encode_ordinary
    assert tok.encode(text) == tt.encode_ordinary(text)
    # special=True: it is the control token, as tiktoken's encode with it allowed
    assert tok.encode(text, special=True) == tt.encode(text, allowed_special="all")
    assert tok.decode(tok.encode(text, special=True)) == "ab "  # control tokens render as nothing


@pytest.mark.parametrize("pre, pat", [("llama-bpe", HF_LLAMA3), ("qwen2", HF_QWEN2)], ids=["llama-bpe", "qwen2"])
def test_other_pre_tokenizers_equal_tiktoken(gpt2_meta, ranks, pre, pat, essays_file):
    """The GPT-2 ranks under Llama 3's and Qwen 2's regexes; Llama 3 also takes whole-word tokens first."""
    meta = dict(gpt2_meta, **{"tokenizer.ggml.pre": pre})
    tok = load_tokenizer(meta)
    assert tok.ignore_merges == (pre == "llama-bpe")
    assert tok.add_bos == (pre == "llama-bpe")  # Llama 3 adds its BOS, Qwen does not
    enc = _tiktoken(ranks, pat)
    text = "\n".join(SAMPLES.values()) + essays_file.read_text(encoding="utf-8")[:100_000]
    ids = tok.encode(text, add_bos=False)
    ref = enc.encode_ordinary(text)
    assert ids == ref, _first_difference(ids, ref)


def test_every_token_is_its_own_merge(tok):
    # so that taking a whole word that is a token (tiktoken, Llama 3) and merging agree
    assert all(len(tok.merge(t)) == 1 for t in tok.texts[:EOT])


# -- pre-tokenizers (no download needed) ----------------------------------------


def test_pre_tokenizer_table():
    for name, (regexes, _, _) in PRE_TOKENIZERS.items():
        PreTokenizer(regexes)  # every regex compiles
    assert PRE_TOKENIZERS["llama-bpe"] == PRE_TOKENIZERS["llama3"]
    assert PRE_TOKENIZERS["llama-bpe"][1:] == (True, True)
    assert PRE_TOKENIZERS["qwen2"][1:] == (False, False)


@pytest.mark.parametrize(
    "pre, pat", [("gpt-2", GPT2), ("llama-bpe", HF_LLAMA3), ("qwen2", HF_QWEN2)], ids=["gpt-2", "llama-bpe", "qwen2"]
)
def test_pre_tokenizer_equals_hf_split(pre, pat, essays_file):
    """Our split equals HF tokenizers' Split(Regex, 'isolated') on the tokenizer.json regex."""
    from tokenizers import Regex
    from tokenizers.pre_tokenizers import Split

    hf = Split(Regex(pat), behavior="isolated")
    ours = PreTokenizer(PRE_TOKENIZERS[pre][0])
    text = "\n".join(SAMPLES.values()) + essays_file.read_text(encoding="utf-8")[:50_000]
    words = ours.split(text)
    assert "".join(words) == text
    assert words == [w for w, _ in hf.pre_tokenize_str(text)]


def test_smollm_digits_then_gpt2():
    from tokenizers.pre_tokenizers import ByteLevel, Digits, Sequence

    hf = Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)])
    ours = PreTokenizer(PRE_TOKENIZERS["smollm"][0])
    text = "\n".join(SAMPLES.values())
    assert [byte_encode(w) for w in ours.split(text)] == [w for w, _ in hf.pre_tokenize_str(text)]


def test_regex_chain_keeps_unmatched_text():
    # llama.cpp's 'default': punctuation runs, GPT-2, digit runs, then groups of three digits;
    # text a regex does not match stays a piece of its own
    split = PreTokenizer(PRE_TOKENIZERS["default"][0]).split
    assert split("Hello, world!!! 12345") == ["Hello", ",", " world", "!!!", " ", "123", "45"]
    assert PreTokenizer([r"\d+"]).split("ab12cd") == ["ab", "12", "cd"]


# -- a tiny hand-made vocab -------------------------------------------------------


def tiny_meta(pre="gpt-2", **extra):
    """Byte tokens, a few merges, and special tokens of each kind."""
    tokens = list(BYTE_TO_CHAR)
    types = [TYPE_NORMAL] * 256
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "x y", "a b"]
    for text, kind in [
        ("he", TYPE_NORMAL),
        ("ll", TYPE_NORMAL),
        ("hell", TYPE_NORMAL),
        ("hello", TYPE_NORMAL),
        ("Ġw", TYPE_NORMAL),
        ("ba", TYPE_NORMAL),  # "ba": a token no merge makes
        ("<|begin_of_text|>", TYPE_CONTROL),
        ("<|eot_id|>", TYPE_CONTROL),
        ("<tool>", TYPE_USER_DEFINED),
    ]:
        tokens.append(text)
        types.append(kind)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|eot_id|>"),
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    meta.update(extra)
    return meta


def test_tiny_merges_and_fallback():
    t = load_tokenizer(tiny_meta())
    ids = t.ids
    assert t.encode("hello") == [ids["hello"]]
    assert t.encode("hell hello") == [ids["hell"], ids["Ġ"], ids["hello"]]  # no "Ġh" merge
    assert t.encode(" w") == [ids["Ġw"]]
    # "x y" merges to "xy", which is no token: it falls back to one token per byte
    assert t.encode("xy") == [ids["x"], ids["y"]]
    # "ba" is a token, but no merge makes it: GPT-2 does not take whole words
    assert t.encode("ba") == [ids["b"], ids["a"]]
    assert t.encode("é") == [ids[BYTE_TO_CHAR[0xC3]], ids[BYTE_TO_CHAR[0xA9]]]
    assert t.decode(t.encode("hello wé")) == "hello wé"


def test_tiny_llama3_rules():
    t = load_tokenizer(tiny_meta("llama-bpe"))
    bos = t.bos_id
    assert t.add_bos and t.ignore_merges
    assert t.encode("ba") == [bos, t.ids["ba"]]  # a word that is a token is taken whole
    assert t.encode("ba", add_bos=False) == [t.ids["ba"]]
    assert load_tokenizer(tiny_meta("llama-bpe", **{"tokenizer.ggml.add_bos_token": False})).encode("ba") == [
        t.ids["ba"]
    ]
    assert load_tokenizer(tiny_meta("qwen2")).add_bos is False
    assert load_tokenizer(tiny_meta("qwen2", **{"tokenizer.ggml.add_bos_token": True})).encode("") == [bos]


def test_tiny_special_tokens():
    t = load_tokenizer(tiny_meta())
    eot, tool = t.ids["<|eot_id|>"], t.ids["<tool>"]
    assert t.eot_ids == {eot}
    text = "he<|eot_id|><tool>ll"
    # special=False: control tokens stay text, user-defined tokens are still cut out
    plain = t.encode(text)
    assert eot not in plain and tool in plain
    assert t.decode(plain) == text
    # special=True: both are tokens; control tokens render as nothing, user-defined as their text
    ids = t.encode(text, special=True)
    assert ids == [t.ids["he"], eot, tool, t.ids["ll"]]
    assert t.decode(ids) == "he<tool>ll"
    assert t.token_bytes(eot) == b"" and t.token_bytes(tool) == b"<tool>"
    # llama.cpp also ends generation on fill-in-the-middle tokens such as Qwen's <|file_sep|>
    meta = tiny_meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["<|file_sep|>"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [TYPE_CONTROL]
    assert load_tokenizer(meta).eot_ids == {eot, len(meta["tokenizer.ggml.tokens"]) - 1}


def test_tiny_pre_warnings_and_errors():
    with pytest.warns(UserWarning, match="unknown BPE pre-tokenizer 'no-such-pre'.*'gpt-2'"):
        t = load_tokenizer(tiny_meta("no-such-pre"))
    assert t.pre_tokenizer.regexes == PRE_TOKENIZERS["gpt-2"][0]
    with pytest.warns(UserWarning, match="names no BPE pre-tokenizer.*'default'"):
        t = load_tokenizer(tiny_meta(None))
    assert t.pre_tokenizer.regexes == PRE_TOKENIZERS["default"][0]
    meta = tiny_meta()
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(GGUFError, match="no merges"):
        load_tokenizer(meta)
    with pytest.raises(GGUFError, match="vocabulary"):
        load_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": []})
