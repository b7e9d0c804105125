"""Reading document files: text, HTML (headings kept for RLV's sections), PDF through pypdf,
and the one-line errors for what cannot be read; the texts the library keeps."""

from __future__ import annotations

import pytest

from tightkv.documents.formats import document_text, html_text
from tightkv.documents.library import DocumentLibrary, doc_id
from tightkv.documents.text import read_documents
from tightkv.errors import TightKVError
from web_helpers import tiny_pdf


def test_pdf_text_layer_is_read():
    data = tiny_pdf(["The keeper of the lighthouse is Orla Brennan.", "The lamp was replaced in 1998."])
    text = document_text("notes.pdf", data)
    assert "The keeper of the lighthouse is Orla Brennan." in text and "replaced in 1998" in text


def test_a_damaged_pdf_is_one_clear_line():
    with pytest.raises(TightKVError, match=r"^broken\.pdf: not a readable PDF") as err:
        document_text("broken.pdf", b"%PDF-1.4\nthis is not really a PDF\n")
    assert "\n" not in str(err.value)


def test_a_pdf_without_text_says_so():
    with pytest.raises(TightKVError, match="no text layer"):
        document_text("scan.pdf", tiny_pdf([]))


def test_html_keeps_headings_lists_and_drops_scripts():
    page = (
        "<html><head><title>t</title><style>p{}</style></head><body><h1>Report</h1>"
        "<p>First  paragraph,\n wrapped.</p><script>alert(1)</script><ul><li>one</li><li>two</li></ul>"
        "<h2>Next</h2><p>A &amp; B</p></body></html>"
    )
    assert html_text(page) == "# Report\n\nFirst paragraph, wrapped.\n\n- one\n- two\n\n## Next\n\nA & B\n"


def test_unknown_and_binary_files_are_refused():
    with pytest.raises(TightKVError, match=r"^sheet\.xlsx: only text, Markdown, HTML and PDF"):
        document_text("sheet.xlsx", b"PK\x03\x04")
    with pytest.raises(TightKVError, match="binary"):
        document_text("data.txt", b"abc\x00def")
    with pytest.raises(TightKVError, match="empty"):
        document_text("blank.md", b"  \n\n")


def test_ask_reads_pdf_and_html_files(tmp_path):
    (tmp_path / "a.pdf").write_bytes(tiny_pdf(["Alpha is the first letter."]))
    (tmp_path / "b.html").write_text("<h1>Beta</h1><p>Beta is the second letter.</p>")
    doc = read_documents([tmp_path / "a.pdf", tmp_path / "b.html"])
    assert doc.names == ("a.pdf", "b.html")
    assert "Alpha is the first letter." in doc.text and "# Beta\n\nBeta is the second letter." in doc.text


def test_library_keeps_texts_by_id(tmp_path):
    lib = DocumentLibrary(tmp_path)
    doc = read_documents(["The keeper is Orla Brennan.\r\n"])
    ident = lib.keep(doc)
    assert ident == doc_id(doc) == doc.sha256[:16] and lib.keep(doc) == ident
    assert lib.get(ident) == doc
    assert [r["id"] for r in lib.entries()] == [ident] and lib.entries()[0]["name"] == "text 1"
    assert lib.get("../../etc/passwd") is None and lib.get("0" * 16) is None
    assert lib.clear() == 1 and lib.entries() == []
