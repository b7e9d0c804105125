"""gpt-oss's and Gemma 4's tokenizers, exact against llama.cpp's.

The real vocabularies are not reachable here, so small ones are trained in the forms
their GGUFs store (`vocab_gguf`: byte-level BPE with pre-tokenizer ``gpt-4o`` and the
harmony specials; Gemma 4's SentencePiece-style BPE, `tokenizer.ggml.model` =
'gemma4'), written as vocab-only GGUFs and read back through tightkv's reader.

With llama-cpp-python installed, tightkv's ids and pieces are compared with
llama.cpp's (`Llama(vocab_only=True)`) on every case string, 400 random strings and
the first 100 KB of the essays in paragraphs, each with BOS on and off and special tokens parsed and not; and
every token's piece. Without it, the ids llama.cpp 0.3.36 gave (a few as literals, the
rest as a digest of all of them) are checked.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from vocab_gguf import case_strings, digest, encodings, load_vocab, write_gguf

from tightkv.gguf.reader import read_gguf
from tightkv.gguf.tokenizer import ATTR_CONTROL, ATTR_NORMAL, ATTR_USER_DEFINED, load_tokenizer

NAMES = ["gpt-oss", "gemma4"]
N_FUZZ_RECORDED = 200

# from llama-cpp-python 0.3.36: digest(encodings(case_strings(name, vocab, 200), ...))
RECORDED_DIGEST = {
    "gpt-oss": "09d0e0eef27c18ac5cbce59795ffa417c1d96efd76cc888be48a504b8566e50a",
    "gemma4": "3706302ad463f3838592558e7e6e3bdf9c018886dff283d7e360058ee98b6efe",
}

# from llama-cpp-python 0.3.36: (text, ids with BOS and special=False, ids without BOS and special=True)
RECORDED_IDS = {
    "gpt-oss": [
        ("Hello world", [39, 68, 309, 78, 360, 319], [39, 68, 309, 78, 360, 319]),
        ("  \n\n\n\n\n\ta", [499, 198, 198, 198, 198, 198, 197, 64], [499, 198, 198, 198, 198, 198, 197, 64]),
        (
            "don't Don'T 1234567",
            [67, 266, 340, 220, 35, 266, 6, 51, 220, 16, 17, 18, 19, 20, 21, 22],
            [67, 266, 340, 220, 35, 266, 6, 51, 220, 16, 17, 18, 19, 20, 21, 22],
        ),
        # the harmony tokens are cut out even with special=False
        ("<|start|>user<|message|>Hi<|end|>", [664, 302, 260, 666, 39, 72, 665], [664, 302, 260, 666, 39, 72, 665]),
    ],
    "gemma4": [
        ("Hello world", [2, 318, 824, 554, 671, 352, 344], [318, 824, 554, 671, 352, 344]),
        # "\n\n\n\n\n" is no token and no merge joins newlines: five "\n"
        ("  \n\n\n\n\n\ta", [2, 709, 277, 277, 277, 277, 277, 281, 341], [709, 277, 277, 277, 277, 277, 281, 341]),
        (
            "don't Don'T 1234567",
            [2, 854, 314, 553, 288, 330, 468, 298, 299, 300, 301, 302, 303, 304],
            [854, 314, 553, 288, 330, 468, 298, 299, 300, 301, 302, 303, 304],
        ),
        (
            "e\u0301 中文 👍🏽 नमस्ते",
            [2, 345, 388, 468, 489, 492, 468, 537, 535, 468, 435, 437, 441, 449, 433, 447],
            [345, 388, 468, 489, 492, 468, 537, 535, 468, 435, 437, 441, 449, 433, 447],
        ),
        (
            "<|turn>user\nHi<turn|>\n<|channel>x",
            [2, 81, 145, 360, 641, 354, 83, 588, 549, 277, 318, 349, 81, 360, 641, 354, 145, 83, 277, 12, 364],
            [5, 588, 549, 277, 318, 349, 6, 277, 12, 364],
        ),
    ],
}


@pytest.fixture(scope="module", params=NAMES)
def case(request, tmp_path_factory):
    """(name, stored vocab, GGUF path, tightkv tokenizer)."""
    name = request.param
    vocab = load_vocab(name)
    path = write_gguf(tmp_path_factory.mktemp("vocab") / f"{name}.gguf", vocab)
    return name, vocab, path, load_tokenizer(read_gguf(path).metadata)


def _tk_encode(tok):
    return lambda text, add, special: tok.encode(text, add_bos=add, special=special)


# -- recorded from llama.cpp (no llama_cpp needed) -----------------------------------


def test_recorded_ids(case):
    name, _, _, tok = case
    for text, with_bos, special in RECORDED_IDS[name]:
        assert tok.encode(text) == with_bos, text
        assert tok.encode(text, add_bos=False, special=True) == special, text


def test_recorded_digest(case):
    name, vocab, _, tok = case
    rows = encodings(case_strings(name, vocab, N_FUZZ_RECORDED), _tk_encode(tok), tok.decode_bytes)
    assert digest(rows) == RECORDED_DIGEST[name]


# -- llama.cpp itself ---------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(case):
    llama_cpp = pytest.importorskip("llama_cpp", exc_type=ImportError)
    llm = llama_cpp.Llama(str(case[2]), vocab_only=True, verbose=False)
    buf = (ctypes.c_char * 256)()

    def piece(i: int, special: bool) -> bytes:
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, i, buf, 256, 0, special)
        return bytes(buf[:n])

    def encode(text: str, add: bool, special: bool) -> list[int]:
        return llm.tokenize(text.encode("utf-8"), add_bos=add, special=special)

    def is_eog(i: int) -> bool:
        return llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)

    return encode, piece, is_eog, llm.n_vocab()


def test_same_as_llamacpp(case, llama, essays_file):
    name, vocab, _, tok = case
    encode, piece, _, _ = llama
    paragraphs = essays_file.read_text(encoding="utf-8")[:100_000].split("\n\n")
    strings = case_strings(name, vocab, 400) + paragraphs
    ours = encodings(strings, _tk_encode(tok), tok.decode_bytes)
    theirs = encodings(strings, encode, lambda ids, s: b"".join(piece(i, s) for i in ids))
    for text, a, b in zip(strings, ours, theirs):
        assert a == b, repr(text)


def test_pieces_and_eog_same_as_llamacpp(case, llama):
    _, _, _, tok = case
    _, piece, is_eog, n = llama
    assert tok.vocab_size == n
    for i in range(n):
        for special in (False, True):
            assert tok.token_piece(i, special) == piece(i, special), (i, tok.texts[i], special)
    assert tok.eot_ids == {i for i in range(n) if is_eog(i)}


# -- the rules, on the stored vocabularies ------------------------------------------


def _tok(name: str, tmp_path: Path, **meta):
    vocab = load_vocab(name)
    vocab["meta"].update(meta)
    return load_tokenizer(read_gguf(write_gguf(tmp_path / "v.gguf", vocab)).metadata)


def test_harmony_tokens(tmp_path):
    tok = _tok("gpt-oss", tmp_path)
    ids = tok.ids
    # rendered and cut out of plain text, as llama.cpp retypes them; <|end|> ends no generation
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"):
        assert tok.attrs[ids[text]] == ATTR_USER_DEFINED
        assert tok.encode(text, add_bos=False) == [ids[text]]
        assert tok.decode([ids[text]]) == text
    assert tok.eot_ids == {ids["<|return|>"], ids["<|call|>"], ids["<|endoftext|>"]}
    assert tok.decode([ids["<|return|>"]]) == "" and tok.decode([ids["<|return|>"]], special=True) == "<|return|>"
    assert not tok.add_bos and tok.bos_id == ids["<|startoftext|>"]


def test_gemma4_rules(tmp_path):
    tok = _tok("gemma4", tmp_path, add_bos=False)
    ids = tok.ids
    assert tok.spm_style and tok.add_bos  # llama.cpp overrides add_bos_token = false
    assert tok.encode("") == [ids["<bos>"]]
    # spaces are "▁"; a newline run that is a token is taken whole
    assert tok.encode("\n\n\n", add_bos=False) == [ids["\n\n\n"]]
    assert tok.encode("\n\n\n\n\n", add_bos=False) == [ids["\n"]] * 5
    assert tok.decode(tok.encode(" a  b\n")) == " a  b\n"
    # a character with no token falls back to its UTF-8 bytes' <0xNN> tokens
    assert tok.encode("\u2603", add_bos=False) == [ids["<0xE2>"], ids["<0x98>"], ids["<0x83>"]]
    assert tok.decode(tok.encode("\u2603")) == "\u2603"
    # end of generation: <eos>, <turn|>, and <|tool_response>, which stays unrendered
    assert tok.eot_ids == {ids["<eos>"], ids["<turn|>"], ids["<|tool_response>"]}
    assert tok.attrs[ids["<|tool_response>"]] & ATTR_CONTROL and tok.decode([ids["<|tool_response>"]]) == ""
    assert tok.decode([ids["<|channel>"], ids["<channel|>"]]) == "<|channel><channel|>"
    assert tok.attrs[ids["</s>"]] == ATTR_NORMAL and tok.encode("</s>", add_bos=False, special=True) != [ids["</s>"]]
