"""Small trained vocabularies in the forms gpt-oss and Gemma 4 GGUFs store, written as
vocab-only GGUFs, and the strings the tokenizer tests compare on.

The vocabularies are trained once with the `tokenizers` package (`python
tests/vocab_gguf.py` rewrites them) on the essays corpus plus `UNICODE_TEXT`, and
kept as JSON in tests/reference (`<name>_vocab.json`: tokens, token types, merges and
the tokenizer metadata), so that the ids recorded from llama.cpp stay valid without
`tokenizers` or the corpus:

- ``gpt-oss``: byte-level BPE (GPT-2 byte characters), pre-tokenizer ``gpt-4o``, then
  the o200k_harmony special tokens as control tokens, as `_set_vocab_gpt2` converts
  them (BOS ``<|startoftext|>``, EOS ``<|return|>``).
- ``gemma4``: `tokenizer.ggml.model` = 'gemma4', as llama.cpp's Gemma 4 converter
  (`LlamaHfVocab`) writes it: special tokens first (control), ``<0x00>``..``<0xFF>``
  (byte), then text pieces with ``▁`` for spaces (normal), the chat-parser tokens
  (``<|channel>``, ``<|tool_call>``, ``<|"|>``, ...) user-defined, scores -1000, no
  pre-tokenizer name, add_bos true.
"""

from __future__ import annotations

import json
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "reference"

TYPE_NORMAL, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_BYTE = 1, 3, 4, 6

UNICODE_TEXT = (
    "KV 캐시 압축을 통해 문서 전체를 로드하세요. 한국어 토큰화 테스트입니다.\n"
    "中文测试：模型量化与长上下文。日本語のテキスト、カタカナとひらがな。\n"
    "مرحبا بالعالم، هذا اختبار للترميز العربي.\n"
    "नमस्ते दुनिया, यह हिंदी पाठ का परीक्षण है।\n"
    "naïve façade — “quotes” and ‘single’ … ÀÉÎÕÜ àéîõü ñ ç ø å ß Ω Ж e\u0301 a\u0308\n"
    "Привет мир, Καλημέρα κόσμε, שלום עולם, สวัสดีชาวโลก\n"
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖✨🎉 ok👌\n"
    "def f(x):\n    return x ** 2  # 1234567890\n\tprint(f'{x!r}')\n"
) * 3

HARMONY_SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|reserved_200000|>",
    "<|reserved_200001|>",
    "<|return|>",
    "<|constrain|>",
    "<|reserved_200004|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|reserved_200009|>",
    "<|reserved_200010|>",
    "<|reserved_200011|>",
    "<|call|>",
]

GEMMA4_CONTROL = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|image|>",
    "<|audio|>",
]
GEMMA4_VISIBLE = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>"]
GEMMA4_NEWLINES = ["\n", "\n\n", "\n\n\n", "\n\n\n\n"]

# strings the tokenizers are compared on, with llama.cpp's ids
CASES = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space and trailing space ",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
    "CamelCaseWords and snake_case_words and HTTPServerError and iPhone",
    "They're we've I'll he'd she's it'S WE'RE YOU'VE can't won't o'clock rock'n'roll '' 's",
    "don't Don'T DON'T l'amour",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,234,567.89 -0.001e-5 0x1F 2024-06-25",
    "   three  two\t\ttabs \t mixed\n\n\n  \n   trailing   \r\nCRLF\r\n end  ",
    "\n",
    "\n\n",
    "\n\n\n\n\n",
    "a\nb\n\nc\n\n\nd",
    " \n \n\n ",
    "\t",
    "    ",
    "word    spaced\u00a0nbsp\u2009thin\u3000wide\u2028ls\u0085nel",
    "KV 캐시 압축을 통해 문서 전체를 로드하세요.",
    "中文测试：模型量化与长上下文。日本語のテキスト、カタカナとひらがな。",
    "مرحبا بالعالم، هذا اختبار للترميز العربي.",
    "नमस्ते दुनिया, यह हिंदी पाठ का परीक्षण है।",
    "naïve façade — “quotes” and ‘single’ … ellipsis; ÀÉÎÕÜ àéîõü ñ ç ø å ß Ω Ж",
    "e\u0301 a\u0308 o\u0302\u0323 \u0301 combining marks",
    "Привет мир, Καλημέρα κόσμε, שלום עולם, สวัสดีชาวโลก",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖✨🎉 ok👌",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 ½ ² Ⅻ ∑∫√∞≈ ™ © ®",
    "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    'https://example.com/path?q=1&r=2#frag  a@b.org  C:\\Users\\x  $HOME/~u  <b>x</b> {"k": [1, 2]}',
    "nul\x00 bell\x07 esc\x1b[31m del\x7f fs\x1c\x1d\x1e\x1f zwsp\u200b bom\ufeff end",
    "Hello , world ! Isn ' t it ? Yes . I 'm sure , 's 're 've 'll 'd 't",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((())) [[[]]] {{{}}} <<<>>> /// \\\\\\ |||",
    "Zoë Åsa Øystein Ærø İstanbul ǅemal ﬁnance Straße ΣΊΣΥΦΟΣ",
]

# special tokens inside text, per vocabulary (special on and off)
SPECIAL_CASES = {
    "gpt-oss": [
        "<|start|>user<|message|>Hi there!<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|return|>",
        "<|startoftext|>text<|endoftext|> more <|call|><|constrain|>json",
        "a<|end|>b<|return|>c <|channel|> d<|reserved_200000|>",
        "<|start|><|start|><|end|> <|end|>\n<|message|>",
        "<|sta rt|> <|end <|message|",
    ],
    "gemma4": [
        "<bos><|turn>user\nHi there!<turn|>\n<|turn>model\nHello.<turn|>\n",
        "<|turn>model\n<|channel>thought\nA greeting.<channel|>Hi<turn|>",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>ok<tool_response|>',
        "a<eos>b<pad>c<unk>d<mask> </s> <s> <|think|>",
        "<|image|><|audio|><|tool><tool|> <turn| <|turn",
    ],
}


_FUZZ_POOL = [
    *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    *" \t\n\r.,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`",
    *"  \n\n\u00a0\u3000\u2009",
    *"éüßñøçÀÉÎ",
    *"中文测试日本語カタカナ한국어",
    *"مرحباनमस्तेПриветΚαλημέρα",
    "e\u0301",
    "\u0308",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "❤️",
    "🤖",
    "'s",
    "'re",
    "'ll",
    "n't",
    "the",
    " the",
    " and",
    "ing",
    "tion",
    "1234567",
]


def fuzz_strings(n: int, specials: list[str], seed: int = 0) -> list[str]:
    """`n` random strings of pool pieces and special-token texts (the same on every Python)."""
    import random

    rng = random.Random(seed)
    pool = _FUZZ_POOL + specials
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def special_texts(vocab: dict) -> list[str]:
    """The texts of a vocabulary's control and user-defined tokens."""
    return [t for t, k in zip(vocab["tokens"], vocab["types"]) if k in (TYPE_CONTROL, TYPE_USER_DEFINED)]


def case_strings(name: str, vocab: dict, n_fuzz: int) -> list[str]:
    """`CASES`, the vocabulary's `SPECIAL_CASES` and `n_fuzz` `fuzz_strings`."""
    return CASES + SPECIAL_CASES[name] + fuzz_strings(n_fuzz, special_texts(vocab))


def encodings(strings: list[str], encode, pieces) -> list:
    """Per string: its ids for each (add_bos, special) and the bytes of its ids (BOS and
    specials parsed) decoded without and with special tokens. `encode(text, add_bos,
    special)` gives ids, `pieces(ids, special)` the joined bytes of their pieces."""
    out = []
    for text in strings:
        row = [encode(text, add, special) for add in (True, False) for special in (False, True)]
        out.append([row, [pieces(row[1], special).hex() for special in (False, True)]])
    return out


def digest(rows: list) -> str:
    """sha256 of `encodings` rows."""
    import hashlib

    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def vocab_path(name: str) -> Path:
    return REFERENCE / f"{name.replace('-', '_')}_vocab.json"


def load_vocab(name: str) -> dict:
    """A stored vocabulary: tokens, types, merges, scores (or None) and metadata."""
    return json.loads(vocab_path(name).read_text(encoding="utf-8"))


def write_gguf(path: Path, vocab: dict) -> Path:
    """A vocab-only GGUF of `vocab` (as `load_vocab` gives it)."""
    from gguf import GGUFWriter

    meta = vocab["meta"]
    w = GGUFWriter(str(path), meta["arch"])
    w.add_tokenizer_model(meta["model"])
    if meta.get("pre"):
        w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(vocab["tokens"])
    if vocab.get("scores"):
        w.add_token_scores(vocab["scores"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(meta["bos"])
    w.add_eos_token_id(meta["eos"])
    if "pad" in meta:
        w.add_pad_token_id(meta["pad"])
    if "unk" in meta:
        w.add_unk_token_id(meta["unk"])
    if "add_bos" in meta:
        w.add_add_bos_token(meta["add_bos"])
    if "add_space_prefix" in meta:
        w.add_add_space_prefix(meta["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- training (only to rewrite the stored vocabularies) ----------------------------


def _corpus() -> list[str]:
    from tightkv.eval.corpus import essays_path

    return [*essays_path().read_text(encoding="utf-8").split("\n\n"), UNICODE_TEXT]


def _train(tokenizer, trainer) -> tuple[list[str], list[str]]:
    """Train; the learnt tokens in id order and the merges as 'left right'."""
    tokenizer.train_from_iterator(_corpus(), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def train_gpt_oss(n_merges: int = 400) -> dict:
    """Byte-level BPE on the corpus, then the harmony specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + n_merges, initial_alphabet=alphabet, show_progress=False)
    tokens, merges = _train(tok, trainer)
    types = [TYPE_NORMAL] * len(tokens) + [TYPE_CONTROL] * len(HARMONY_SPECIALS)
    tokens += HARMONY_SPECIALS
    meta = {
        "arch": "gpt-oss",
        "model": "gpt2",
        "pre": "gpt-4o",
        "bos": tokens.index("<|startoftext|>"),
        "eos": tokens.index("<|return|>"),
        "pad": tokens.index("<|endoftext|>"),
    }
    return {"tokens": tokens, "types": types, "merges": merges, "scores": None, "meta": meta}


def train_gemma4(n_merges: int = 400) -> dict:
    """SentencePiece-style BPE (``▁`` for spaces, newlines apart) in Gemma 4's GGUF layout."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=n_merges + 300, show_progress=False, limit_alphabet=300)
    learnt, merges = _train(tok, trainer)
    # newline runs are tokens no merge makes (llama.cpp takes such a word whole)
    merges = [m for m in merges if "\n" not in m]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    specials = GEMMA4_CONTROL + GEMMA4_VISIBLE + ['<|"|>', "<s>", "</s>"]
    taken = {*specials, *bytes_, *GEMMA4_NEWLINES}
    learnt = [t for t in learnt if "\n" not in t and t not in taken]
    tokens = specials + bytes_ + GEMMA4_NEWLINES + learnt
    types = (
        [TYPE_CONTROL] * len(GEMMA4_CONTROL)
        + [TYPE_USER_DEFINED] * (len(GEMMA4_VISIBLE) + 1)
        + [TYPE_NORMAL, TYPE_NORMAL]
        + [TYPE_BYTE] * 256
        + [TYPE_NORMAL] * (len(GEMMA4_NEWLINES) + len(learnt))
    )
    meta = {
        "arch": "gemma4",
        "model": "gemma4",
        "bos": tokens.index("<bos>"),
        "eos": tokens.index("<eos>"),
        "pad": tokens.index("<pad>"),
        "unk": tokens.index("<unk>"),
        "add_bos": True,
        "add_space_prefix": False,
    }
    return {"tokens": tokens, "types": types, "merges": merges, "scores": [-1000.0] * len(tokens), "meta": meta}


if __name__ == "__main__":
    for name, train in (("gpt-oss", train_gpt_oss), ("gemma4", train_gemma4)):
        vocab = train()
        vocab_path(name).write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        print(name, len(vocab["tokens"]), "tokens", len(vocab["merges"]), "merges")
