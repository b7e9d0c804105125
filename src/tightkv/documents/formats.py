"""A document file's text: plain text and Markdown as they are, HTML as Markdown-like
text (headings kept as `#` lines, so RLV's sections follow them), PDF through pypdf.

    text = document_text("report.pdf", data)    # bytes in, text out, or a one-line TightKVError

`tightkv ask --doc` and the server's upload route both read files through here, so
the same file gives the same text, the same tokens and so the same cached KV.
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser
from pathlib import PurePath

from ..errors import TightKVError

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".text", ""}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


def described() -> str:
    """The formats read, for help texts: "text or Markdown (.txt, .md, ...), HTML (...) or PDF (.pdf)"."""

    def suffixes(group: set[str]) -> str:
        return ", ".join(sorted(s for s in group if s))

    return (
        f"text or Markdown ({suffixes(TEXT_SUFFIXES)}, or no suffix), HTML ({suffixes(HTML_SUFFIXES)}) "
        f"or PDF ({suffixes(PDF_SUFFIXES)}, its text layer)"
    )


def supported(name: str) -> bool:
    """Whether a file name's suffix is one we read."""
    return PurePath(name).suffix.lower() in SUFFIXES


def document_text(name: str, data: bytes) -> str:
    """The text of a document file named `name` with contents `data`."""
    suffix = PurePath(name).suffix.lower()
    if suffix in PDF_SUFFIXES or data[:5] == b"%PDF-":
        text = pdf_text(name, data)
    elif suffix in HTML_SUFFIXES:
        text = html_text(_decode(name, data))
    elif suffix in TEXT_SUFFIXES:
        text = _decode(name, data)
    else:
        raise TightKVError(
            f"{name}: only text, Markdown, HTML and PDF documents are supported (.txt, .md, .html, .pdf)"
        )
    if not text.strip():
        raise TightKVError(f"{name}: the document is empty")
    return text


def _decode(name: str, data: bytes) -> str:
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return data.decode("utf-16", errors="replace")
    if b"\x00" in data[:8192]:
        raise TightKVError(f"{name}: looks like a binary file, not text")
    return data.decode("utf-8", errors="replace")


# --- PDF ----------------------------------------------------------------------------------------
def pdf_text(name: str, data: bytes) -> str:
    """The text layer of a PDF, page after page (pypdf); an unreadable, encrypted or
    image-only PDF is a one-line error."""
    import logging

    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd files are not ours to print
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise TightKVError(f"{name}: the PDF is encrypted; save an unprotected copy and add that")
        pages = [page.extract_text() or "" for page in reader.pages]
    except TightKVError:
        raise
    except Exception as err:  # noqa: BLE001 - pypdf raises many kinds for a damaged file
        detail = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise TightKVError(f"{name}: not a readable PDF ({detail})") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise TightKVError(f"{name}: the PDF has no text layer (a scanned image?); run OCR on it first")
    return text


# --- HTML ---------------------------------------------------------------------------------------
_SKIP = {"script", "style", "head", "noscript", "template", "svg", "nav", "footer"}
_BLOCK = {
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "aside",
    "blockquote",
    "table",
    "tr",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "form",
    "hr",
    "pre",
    "br",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
}
_LINE = {"br", "li", "tr", "dt", "dd"}  # blocks that start a line, not a paragraph


class _TextParser(HTMLParser):
    """Collects an HTML page's visible text; blocks become lines, headings `#` lines."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP:
            self.skipping += 1
        elif tag in _BLOCK:
            self.parts.append("\n" if tag in _LINE else "\n\n")
            if tag[0] == "h" and tag[1:].isdigit():
                self.parts.append("#" * int(tag[1:]) + " ")
            elif tag == "li":
                self.parts.append("- ")
            elif tag == "pre":
                self.pre += 1
        elif tag in ("td", "th"):
            self.parts.append(" ")  # cells of a row stay on its line

    def handle_endtag(self, tag):
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _BLOCK and tag not in _LINE:  # a line's end is the next line's start
            self.parts.append("\n\n" if tag[0] == "h" or tag in ("p", "pre", "table", "ul", "ol") else "\n")
            if tag == "pre":
                self.pre = max(0, self.pre - 1)

    def handle_data(self, data):
        if self.skipping:
            return
        self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_text(html: str) -> str:
    """The visible text of an HTML page, one block per line, headings as Markdown `#` lines."""
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    lines = [line.strip() for line in "".join(parser.parts).split("\n")]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
