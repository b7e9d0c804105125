"""Document text: reading files, splitting into sections (the RLV gist) or
fixed-size chunks (the RAG baseline), BM25 terms, keywords and answer matching.

Nothing here needs torch or a model: token counts come from a `count` callable
(a model's tokenizer in practice), so the splitting is testable on its own.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import TightKVError

from .formats import SUFFIXES, document_text

# a short English stop list: question words and function words carry no topic
STOPWORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers herself him
himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or other
our ours ourselves out over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which while who whom why will
with would you your yours yourself yourselves name named called tell says said according document text passage
""".split()
)

_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*\n")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


@dataclass(frozen=True)
class DocumentText:
    """One or more documents joined into one text, with a content hash."""

    text: str
    names: tuple[str, ...]
    starts: tuple[int, ...] = (0,)  # where each document begins in text

    def name_at(self, pos: int) -> str:
        """The name of the document that holds character `pos`."""
        i = max((k for k, s in enumerate(self.starts) if s <= pos), default=0)
        return self.names[i] if i < len(self.names) else ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def read_documents(sources: Sequence[str | Path]) -> DocumentText:
    """Read document files (or take strings as the text itself) and join them.

    A `Path`, or a string naming an existing file, is read (text and Markdown as
    UTF-8, HTML and PDF through `formats`); any other string is document text.
    Several documents are joined, each under a "Document N: name" line, so an
    answer can cite which one it came from.
    """
    if not sources:
        raise TightKVError("no document given")
    texts, names = [], []
    for i, src in enumerate(sources):
        text, name = _read_one(src, i)
        texts.append(text)
        names.append(name)
    if len(texts) == 1:
        return DocumentText(texts[0], tuple(names))
    joined, starts = "", []
    for i, (n, t) in enumerate(zip(names, texts)):
        if joined:
            joined += "\n\n"
        starts.append(len(joined))
        joined += f"Document {i + 1}: {n}\n\n{t}"
    return DocumentText(joined, tuple(names), tuple(starts))


def _looks_like_path(src: str) -> bool:
    if "\n" in src or len(src) >= 4096 or not src.strip():
        return False
    p = Path(src).expanduser()
    try:
        if p.is_file():
            return True
    except OSError:  # a name too long for the file system (or otherwise not a path): text
        return False
    return " " not in src.strip() and (p.suffix.lower() in SUFFIXES - {""} or "/" in src)


def _read_one(src: str | Path, i: int) -> tuple[str, str]:
    is_path = isinstance(src, Path) or (isinstance(src, str) and _looks_like_path(src))
    if not is_path:
        if isinstance(src, str) and src.strip():
            return clean_text(src), f"text {i + 1}"
        raise TightKVError("empty document")
    path = Path(src).expanduser()
    if not path.is_file():
        raise TightKVError(f"{path}: no such document file")
    return clean_text(document_text(str(path), path.read_bytes())), path.name


def clean_text(text: str) -> str:
    """Line ends as `\\n`, no byte-order mark, one final line end: as every document is kept."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    return text.strip("\n") + "\n"


# --- sections (RLV gist) and chunks (RAG) --------------------------------------------


@dataclass
class Section:
    """A piece of the document: [start, end) characters, its title and token count."""

    index: int
    start: int
    end: int
    text: str
    title: str
    tokens: int

    @property
    def label(self) -> str:
        return f"§{self.index + 1}"

    def gist(self, words: int = 12) -> str:
        """The title and the opening words: one line for the index."""
        body = " ".join(self.text.split()[:words])
        return f"{self.label} [{self.start}:{self.end}] {self.title} | {body}"


def sentences(text: str, offset: int = 0) -> list[tuple[int, int]]:
    """Sentence (and paragraph) spans [(start, end)] covering text, in characters."""
    spans, last = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.end() > last:
            spans.append((offset + last, offset + m.end()))
            last = m.end()
    if last < len(text):
        spans.append((offset + last, offset + len(text)))
    return spans


def _headings(text: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group(2).strip()) for m in _HEADING.finditer(text)]


def split_sections(text: str, max_tokens: int, count: Callable[[str], int]) -> list[Section]:
    """The gist index: Markdown sections (by headings) split into windows of at most
    `max_tokens` tokens on sentence boundaries; text without headings is windows only.
    Each window carries the title of its heading (or its first words)."""
    heads = _headings(text)
    bounds = [0] + [h[0] for h in heads if h[0] > 0] + [len(text)]
    titles = {pos: title for pos, title in heads}
    # a part of (almost) no text joins the next one: a title alone is not a section, and a
    # short section keeps its title beside the next one's ("Leadership / Finances")
    small = max(8, max_tokens // 8)
    merged = [bounds[0]]
    for a, b in zip(bounds[1:-1], bounds[2:]):
        if count(text[merged[-1] : a]) < small:
            own = titles.get(merged[-1], "") if has_body(text[merged[-1] : a]) else ""
            titles[merged[-1]] = " / ".join(t for t in (own, titles.get(a, "")) if t)
            continue
        merged.append(a)
    bounds = merged + [bounds[-1]]
    out: list[Section] = []
    for a, b in zip(bounds, bounds[1:]):
        if not text[a:b].strip():
            continue
        title = titles.get(a, "")
        for s, e in _windows(text, a, b, max_tokens, count):
            piece = text[s:e]
            if not piece.strip():
                continue
            t = title or _first_words(piece)
            out.append(Section(len(out), s, e, piece, t, count(piece)))
    return out


def has_body(text: str) -> bool:
    """Whether text holds a line that is not blank and not a Markdown heading."""
    return any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())


def past_headings(text: str, a: int, b: int) -> int:
    """The start of span [a, b) past the Markdown heading lines it opens with (a heading
    followed by a single newline shares its first sentence's span)."""
    while a < b:
        lead = len(text[a:b]) - len(text[a:b].lstrip())
        if not text.startswith("#", a + lead):
            return a
        line_end = text.find("\n", a + lead, b)
        a = b if line_end < 0 else line_end + 1
    return a


def _first_words(text: str, n: int = 6) -> str:
    return " ".join(text.split()[:n])


def _windows(text: str, a: int, b: int, max_tokens: int, count: Callable[[str], int]) -> list[tuple[int, int]]:
    """Greedy windows of whole sentences within [a, b), each at most max_tokens
    (a single longer sentence is cut by characters)."""
    spans = sentences(text[a:b], a)
    pieces: list[tuple[int, int, int]] = []
    for s, e in spans:
        n = count(text[s:e])
        if n <= max_tokens:
            pieces.append((s, e, n))
            continue
        step = max(1, (e - s) * max_tokens // (n + 1))
        for x in range(s, e, step):
            y = min(e, x + step)
            pieces.append((x, y, count(text[x:y])))
    out, cur, cur_n = [], None, 0
    for s, e, n in pieces:
        if cur is not None and cur_n + n <= max_tokens:
            cur, cur_n = (cur[0], e), cur_n + n
        else:
            if cur is not None:
                out.append(cur)
            cur, cur_n = (s, e), n
    if cur is not None:
        out.append(cur)
    return out


def fixed_chunks(ids: list[int], size: int, decode: Callable[[list[int]], str]) -> list[Section]:
    """The RAG baseline's chunks: consecutive runs of `size` tokens, cut anywhere."""
    out, pos = [], 0
    for i in range(0, len(ids), size):
        piece = decode(ids[i : i + size])
        out.append(Section(len(out), pos, pos + len(piece), piece, f"chunk {len(out) + 1}", len(ids[i : i + size])))
        pos += len(piece)
    return out


# --- terms, keywords, answers ------------------------------------------------------


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def terms(text: str, keep_stopwords: bool = False) -> list[str]:
    """BM25 terms: lower-cased words, stop words dropped, crudely stemmed."""
    words = [w.lower() for w in _WORD.findall(text)]
    return [_stem(w) for w in words if keep_stopwords or w not in STOPWORDS]


def keywords(question: str) -> str:
    """The question's content words, capitalised names and numbers first."""
    words = _WORD.findall(question)
    names = [w for i, w in enumerate(words) if (w[:1].isupper() and i > 0) or any(c.isdigit() for c in w)]
    rest = [w for w in words if w.lower() not in STOPWORDS and w not in names]
    seen, out = set(), []
    for w in names + rest:
        if w.lower() not in seen and w.lower() not in STOPWORDS:
            seen.add(w.lower())
            out.append(w)
    return " ".join(out)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation or thousands separators, single spaces."""
    text = text.lower().replace(",", "")
    text = re.sub(r"[^\w\s.]", " ", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)
    return " ".join(text.split())


def answer_matches(answer: str, expected: str | Sequence[str]) -> bool:
    """Whether the expected answer (any of several) occurs in the answer, normalised."""
    got = f" {normalize_answer(answer)} "
    options = [expected] if isinstance(expected, str) else list(expected)
    return any(f" {normalize_answer(e)} " in got for e in options if e.strip())


def support(answer: str, passage: str) -> float:
    """The share of the answer's content words found in the passage (0..1)."""
    words = [w for w in terms(answer) if w]
    if not words:
        return 0.0
    have = set(terms(passage))
    return sum(w in have for w in words) / len(words)


# --- answer checks (RLV verify) ------------------------------------------------------

_NUMBER_WORDS = {
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "hundred",
    "thousand",
    "million",
    "billion",
    "dozen",
}
_NOT_A_PERSON = {
    "division",
    "company",
    "department",
    "board",
    "committee",
    "team",
    "group",
    "office",
    "plant",
    "council",
    "ministry",
    "unit",
    "inc",
    "ltd",
    "corporation",
    "government",
    "document",
    "section",
}
_NUMERIC_Q = re.compile(r"^(how (many|much|long|old|far|tall|high|big|large|often)|(in )?(what|which) year|when)\b")
_WORDS_Q = re.compile(
    r"^(what colou?r|where\b|((in|on|at|from) )?(what|which) (city|country|town|village|mountain|"
    r"island|river|day|month|company|colou?r|street|language|ingredient)\b)"
)
_PERSON_Q = re.compile(r"^(who|whom)\b|\b(by|to|with|after|for) whom\b|^after which (astronomer|person|scientist)\b")


_STOP = re.compile(r"[.!?][\"')\]]*(?=\s|$)")
_ABBREVIATION = re.compile(r"(\b(Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|Inc|Ltd|Co|vs|etc|e\.g|i\.e)|\b[A-Z]|\b[A-Z]\.[A-Z])$")


def sentence_end(text: str, final: bool = True) -> int | None:
    """Where the first sentence of `text` ends (the index after its stop), or None.
    A stop ends a sentence when whitespace follows (or the text ends, if `final`),
    and it does not close an abbreviation ("Dr.", "J.", "U.S.")."""
    for m in _STOP.finditer(text):
        if m.group()[0] == "." and _ABBREVIATION.search(text[: m.start()]):
            continue
        if m.end() < len(text) or final:
            return m.end()
    return None


def first_sentence(answer: str) -> str:
    """An answer cut to its first sentence (a base model often runs on)."""
    a = answer.strip()
    end = sentence_end(a)
    return a[:end].strip() if end else a


def answer_type_ok(question: str, answer: str) -> bool:
    """A cheap answer-type check: a number for how-many/which-year questions, a name
    (not an organisation unit) for who questions, words and not only a number (a
    year, say) for which-city/what-colour questions; anything for the rest."""
    q, a = question.strip().lower(), answer.strip()
    if not a:
        return False
    if _NUMERIC_Q.search(q):
        return bool(re.search(r"\d", a)) or any(w.strip(".,").lower() in _NUMBER_WORDS for w in a.split())
    if _WORDS_Q.search(q):
        new = set(terms(a)) - set(terms(q))
        return any(not any(c.isdigit() for c in w) for w in new)
    if _PERSON_Q.search(q):
        words = [w.strip(".,;:'\"()").lower() for w in a.split()]
        if any(w in _NOT_A_PERSON for w in words):
            return False
        return any(w[:1].isupper() and w.lower().strip(".,") not in STOPWORDS for w in a.split())
    return True


_RELATIVE = re.compile(
    r"^(?P<head>(who|what|which|where|when|how many|how much)\b.*?)\s+the\s+(?P<noun>[\w-]+)"
    r"\s+(that|which|who|whose)\s+.+\?$",
    re.IGNORECASE,
)


def follow_up(question: str, answer: str) -> str | None:
    """The second hop of a question with a relative clause, once the first hop's
    entity is known: ("Who leads the division that runs the plant in Ghent?",
    "The Meridian division.") -> "Who leads the Meridian division?"."""
    m = _RELATIVE.match(question.strip())
    ent = re.sub(r"^(the|a|an)\s+", "", answer.strip().rstrip(".!?,;"), flags=re.IGNORECASE)
    if not m or not ent or len(ent.split()) > 6:
        return None
    if m.group("noun").lower() not in ent.lower():
        ent = f"{ent} {m.group('noun')}"
    return f"{m.group('head')} the {ent}?"


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(text)}


def grounded(answer: str, passage: str) -> bool:
    """Whether the passage backs the answer: most of its content words occur in it,
    and every number in it does (a small model misquotes digits)."""
    return support(answer, passage) >= 0.5 and _numbers(answer) <= _numbers(passage)


def adds_information(question: str, answer: str) -> bool:
    """Whether the answer says something the question did not (not an echo of it, and
    not a heading copied from the document)."""
    if answer.lstrip().startswith("#"):
        return False
    return bool(set(terms(answer)) - set(terms(question)))
