"""The web page of `tightkv serve`, driven in a real headless Chromium (Debian's package,
through Playwright): the API key asked once, a document with a planted fact added through
the page's one file input, its load, a question answered with the fact and a highlighted
quote, the document listed and reopened warm after a reload and after a server restart,
the clear errors that keep what was typed, and a phone's width."""

from __future__ import annotations

import re

import pytest

from cli_helpers import private_home, seed_embedded
from test_server_helpers import request, running
from web_helpers import FACT, FACT_DOC, QUESTION, browser_page, chromium

KEY = "web-test-key"
LOAD_MS = 240_000  # a load or an answer on a busy 2-core box


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    chromium()  # fails in CI, skips elsewhere, before a server starts
    home = private_home(tmp_path_factory.mktemp("web"))
    seed_embedded(home)
    return home


def serve(home):
    return running("--ctx", "4096", api_key=KEY, env={"TIGHTKV_HOME": str(home)})


def enter_key(page) -> None:
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key", KEY)
    page.press("#key", "Enter")
    page.wait_for_selector("#key-dialog", state="hidden")


def ask(page, question: str):
    """Type a question, send it with Enter; the answer's list item once it is complete."""
    before = page.locator(".msg.assistant").count()
    page.fill("#message", question)
    page.press("#message", "Enter")
    answer = page.locator(".msg.assistant").nth(before)
    answer.locator(".meta, .body").first.wait_for(timeout=LOAD_MS)
    page.wait_for_function(
        "n => !document.querySelectorAll('.msg.assistant')[n].classList.contains('pending')",
        arg=before,
        timeout=LOAD_MS,
    )
    return answer


def test_add_a_document_ask_and_reopen_it_warm(home, tmp_path):
    path = tmp_path / "kestrel.md"
    path.write_text(FACT_DOC)
    with serve(home) as server, browser_page() as page:
        assert request(server, "GET", "/", auth=False)[0] == 200  # the page itself needs no key
        assert request(server, "GET", "/v1/documents", auth=False)[0] == 401
        origins = set()
        page.on("request", lambda r: origins.add(re.match(r"^[a-z]+://[^/]+", r.url).group(0)))
        page.goto(server.url)
        enter_key(page)
        assert page.locator("input[type=file]").count() == 1 and page.locator("textarea").count() == 1
        assert page.get_attribute("#message", "id") == page.get_attribute("label[for=message]", "for")

        page.set_input_files("input[type=file]", str(path))
        page.wait_for_selector("#view-meta:has-text('tokens')", timeout=LOAD_MS)
        meta = page.inner_text("#view-meta")
        assert "kestrel.md" in meta and "mode full" in meta and "KV kvarn4" in meta and "prefilled now" in meta
        assert FACT in page.inner_text("#view")

        answer = ask(page, QUESTION)
        assert FACT in answer.locator(".body").inner_text()
        assert "mode full" in answer.locator(".meta").inner_text()
        marks = page.locator("#view mark.quote")
        assert marks.count() >= 1
        assert any(FACT in marks.nth(i).inner_text() for i in range(marks.count()))
        assert FACT in page.locator("#view mark.holds-answer").first.inner_text()
        assert page.input_value("#message") == ""

        page.reload()  # the key is kept for the tab; the document is listed and opens warm
        page.wait_for_selector(".doc-button:has-text('kestrel.md')")
        assert not page.locator("#key-dialog").evaluate("d => d.open")
        page.click(".doc-button:has-text('kestrel.md')")
        page.wait_for_selector("#view-meta:has-text('warm')", timeout=LOAD_MS)
        assert origins == {server.url}  # nothing fetched from anywhere else

    with serve(home) as server, browser_page() as page:  # a new server: warm from the disk store
        page.goto(server.url)
        enter_key(page)
        item = page.locator(".doc-item", has_text="kestrel.md")
        item.wait_for()
        assert "opens warm" in item.inner_text()
        item.locator("button").click()
        page.wait_for_selector("#view-meta:has-text('warm from the store')", timeout=LOAD_MS)
        assert FACT in ask(page, QUESTION).locator(".body").inner_text()


def test_errors_are_shown_and_nothing_typed_is_lost(home, tmp_path, essays_file):
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\nnot a PDF at all\n")
    long_text = essays_file.read_text()[:30000]
    with serve(home) as server, browser_page() as page:
        page.goto(server.url)
        enter_key(page)
        page.set_input_files("input[type=file]", str(broken))
        page.wait_for_selector("#error:has-text('broken.pdf: not a readable PDF')")

        page.select_option("#mode", "full")  # a document past the context, in full mode
        page.fill("#message", long_text)
        page.click("#as-doc")
        page.wait_for_selector("#error:has-text('more than full mode can hold')", timeout=LOAD_MS)
        assert page.input_value("#message") == long_text.replace("\r\n", "\n")

        page.select_option("#mode", "auto")  # then a question that cannot fit the context
        page.fill("#message", FACT_DOC)
        page.click("#as-doc")
        page.wait_for_selector("#view-meta:has-text('tokens')", timeout=LOAD_MS)
        question = "Who keeps the lighthouse? " + long_text[:20000]
        answer = ask(page, question)
        assert "failed" in answer.get_attribute("class")
        assert page.locator("#error").is_visible() and "context" in page.inner_text("#error")
        assert page.input_value("#message") == question.replace("\r\n", "\n")


def test_the_page_fits_a_phone_and_the_keyboard(home):
    with serve(home) as server, browser_page(width=390, height=844) as page:
        page.goto(server.url)
        enter_key(page)
        page.wait_for_selector("#doc-list li")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.locator("#message").bounding_box()["width"] > 300
        page.click("#message")
        page.keyboard.type("first line")
        page.keyboard.press("Shift+Enter")  # a new line, nothing sent
        page.keyboard.type("second line")
        assert page.input_value("#message") == "first line\nsecond line" and page.locator(".msg").count() == 0
        for control in ("#file", "#mode", "#message", "#key"):
            assert page.locator(f"label[for={control[1:]}]").count() == 1


def test_answers_markdown_is_rendered_and_escaped(home):
    with serve(home) as server, browser_page() as page:
        page.goto(server.url)
        enter_key(page)
        html = page.evaluate("""window.tightkvMarkdown.renderMarkdown(
            "**Yes**, see `f`:\\n\\n```python\\ndef f(x):\\n    return 'a' # note\\n```\\n- one\\n- <script>x</script>")""")
        assert "<strong>Yes</strong>" in html and "<code>f</code>" in html
        assert '<span class="tok-kw">def</span>' in html and '<span class="tok-str">&#39;a&#39;</span>' in html
        assert '<span class="tok-com"># note</span>' in html and "<li>one</li>" in html
        assert "<script>" not in html and "&lt;script&gt;" in html


def test_a_base_model_continues_text_and_says_when_it_wrote_nothing(home):
    """The embedded model has no chat template: the page says so, its plain chat continues the
    text (no '(no reply)'), and a reply with no text is a line saying why."""
    with serve(home) as server, browser_page() as page:
        page.goto(server.url)
        enter_key(page)
        page.wait_for_selector("#target:has-text('base model (no chat template)')")
        answer = ask(page, "The capital of France is")
        body = answer.locator(".body").inner_text()
        assert "Paris" in body and "(no reply)" not in body  # asked as "Question: ...\nAnswer:", greedy
        assert "continued as plain text" in answer.locator(".meta").inner_text()

        empty = "data: " + '{"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}' + "\n\ndata: [DONE]\n\n"
        page.route(
            "**/v1/completions",
            lambda route: route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=empty),
        )
        answer = ask(page, "What is gravity?")
        note = answer.locator(".body").inner_text()
        assert answer.locator(".body .empty-reply").count() == 1
        assert note.startswith("The model wrote nothing.") and "base model without a chat template" in note
        assert "(no reply)" not in page.inner_text("#log")


RAGGED = """# Field notes

The survey team walked the eastern ridge
at dawn, counting nests along the cliff
edge, and returned to camp by noon.

    count = nests(ridge="east")
    print(count)

- the first item
  goes on here
- the second item
"""


def test_the_document_pane_reflows_hard_wrapped_paragraphs(home, tmp_path):
    """A file's hard line breaks inside a paragraph read as spaces (one running paragraph),
    blank lines still part paragraphs, and code and list items keep their lines."""
    path = tmp_path / "notes.txt"
    path.write_text(RAGGED)
    with serve(home) as server, browser_page() as page:
        page.goto(server.url)
        enter_key(page)
        page.set_input_files("input[type=file]", str(path))
        page.wait_for_selector("#view-meta:has-text('tokens')", timeout=LOAD_MS)
        paras = page.locator("#view p.doc-para")
        assert [paras.nth(i).inner_text() for i in range(paras.count())] == [
            "# Field notes",
            "The survey team walked the eastern ridge at dawn, counting nests along the cliff edge, and returned to "
            "camp by noon.",
            "- the first item goes on here",
            "- the second item",
        ]
        assert page.locator("#view pre.doc-pre").inner_text() == '    count = nests(ridge="east")\n    print(count)'
        # laid out as running text: the words either side of a hard break share a line
        tops = page.evaluate("""() => {
            const node = document.querySelector("#view p.doc-para:nth-of-type(2)").firstChild;
            const at = node.data.indexOf("ridge\\nat");
            const top = (i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
                                 return r.getBoundingClientRect().top; };
            return [top(at), top(at + 6)];
        }""")
        assert tops[0] == tops[1]
        assert page.locator("#view").inner_text().count("\n") < RAGGED.count("\n")
