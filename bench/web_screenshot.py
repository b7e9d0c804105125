"""The screenshot of the web page in use (docs/web.png, shown in docs/server.md): `tightkv serve` of the
embedded model on loopback with a fresh TIGHTKV_HOME, Debian's headless Chromium (as
tests/test_web.py drives it), a PDF and a Markdown document added through the page's
file input, two questions about the second asked with Enter.

    python bench/web_screenshot.py [--out docs/web.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cli_helpers import private_home, seed_embedded  # noqa: E402
from test_server_helpers import running  # noqa: E402
from web_helpers import FACT_DOC, browser_page, tiny_pdf  # noqa: E402

QUESTIONS = ["Who is the keeper of the Kestrel Point lighthouse?", "When was the lighthouse first lit?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "web.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tightkv-web-") as tmp:
        tmp = Path(tmp)
        home = private_home(tmp)
        seed_embedded(home)
        pdf = tmp / "ferry-timetable.pdf"
        pdf.write_bytes(
            tiny_pdf(
                [
                    "Ferry timetable, summer season.",
                    "The ferry to the outer islands leaves at nine and at four.",
                    "Tickets are sold at the harbour office.",
                ]
            )
        )
        md = tmp / "kestrel-point.md"
        md.write_text(FACT_DOC)
        with (
            running("--ctx", "4096", env={"TIGHTKV_HOME": str(home)}) as server,
            browser_page(width=1400, height=960) as page,
        ):
            page.goto(server.url)
            for path in (pdf, md):
                page.set_input_files("input[type=file]", str(path))
                page.wait_for_selector(f"#view-meta:has-text('{path.name}')", timeout=240_000)
            for i, question in enumerate(QUESTIONS):
                page.fill("#message", question)
                page.press("#message", "Enter")
                page.wait_for_function(
                    "n => { const m = document.querySelectorAll('.msg.assistant')[n];"
                    " return m && !m.classList.contains('pending'); }",
                    arg=i,
                    timeout=240_000,
                )
            page.locator("#view mark.holds-answer").first.scroll_into_view_if_needed()
            page.screenshot(path=args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
