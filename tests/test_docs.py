"""The docs stay true to the repository: their links and anchors resolve, the bench scripts
and JSON files they name exist (or are named at the commit that still has them), every
JSON under docs/bench/ is cited, every bench script is run by a section of
`bench/make_benchmarks.py`, and the generated pages equal what their renderers write."""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
AT_COMMIT = re.compile(r"\bat\s+[0-9a-f]{7}\b")
# bench modules that other scripts or tests import, not benchmarks themselves
HELPERS = {"make_benchmarks.py", "render_benchmarks.py", "sections.py", "texts.py", "qwen_model.py", "live_server.py"}


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    return "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def bench_module(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_anchors_resolve(doc):
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            bad.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{target}: no heading #{anchor} in {path.name}")
    assert not bad, f"{doc.name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_bench_scripts_and_jsons_exist(doc):
    """A script or JSON that is gone may be named only with the commit that has it ("at abc1234")."""
    text, bad = doc.read_text(encoding="utf-8"), []
    for m in re.finditer(r"bench/([\w*]+\.(?:py|sh|json))", text):
        base = ROOT / ("docs/bench" if m.group(1).endswith(".json") else "bench")
        if not list(base.glob(m.group(1))) and not AT_COMMIT.search(text[m.end() : m.end() + 250]):
            bad.append(m.group(0))
    assert not bad, f"{doc.name} names what is not in the repository: {sorted(set(bad))}"


def test_every_bench_json_is_cited():
    """By its file name in a doc or in code, by the renderer's `_load("name")`, or by its glob."""
    code = "".join(
        p.read_text(encoding="utf-8") for p in [*(ROOT / "bench").glob("*.py"), *(ROOT / "src").rglob("*.py")]
    )
    cited = code + "".join(p.read_text(encoding="utf-8") for p in DOCS)
    globs = re.findall(r'OUT\.glob\("([^"]+\.json)"\)', code)  # the renderer's globs over docs/bench/
    uncited = [
        p.name
        for p in (ROOT / "docs" / "bench").glob("*.json")
        if p.name not in cited and f'_load("{p.stem}")' not in code and not any(p.match(g) for g in globs)
    ]
    assert not uncited, f"JSON under docs/bench/ that no doc or script names: {uncited}"


def test_every_bench_script_backs_a_section():
    sections = bench_module("sections")
    run = (ROOT / "bench" / "make_benchmarks.py").read_text(encoding="utf-8")
    run += " ".join(argv[0] for _, runs in sections.EXTRA.values() for argv in runs)
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")} - HELPERS
    assert scripts, "no bench scripts found"
    assert not [s for s in sorted(scripts) if s not in run], "bench scripts no section of make_benchmarks.py runs"
    for _, runs in sections.EXTRA.values():
        for argv in runs:
            assert argv[0] == "tightkv" or (ROOT / "bench" / argv[0]).exists(), argv


def test_benchmarks_page_is_rendered_from_the_json():
    render = bench_module("render_benchmarks").render
    assert (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8") == render(), (
        "docs/benchmarks.md differs from its JSON: python bench/make_benchmarks.py --render"
    )


def test_weight_types_tables_are_rendered_from_the_json(tmp_path):
    weight_types = bench_module("weight_types")
    doc = ROOT / "docs" / "weight-types.md"
    copy = tmp_path / "weight-types.md"
    shutil.copy(doc, copy)
    jsons = re.findall(r"<!-- (docs/bench/[\w]+\.json): written by", doc.read_text(encoding="utf-8"))
    assert len(jsons) >= 3, jsons  # one section per machine
    for rel in jsons:
        import json

        weight_types.write_md(copy, str(ROOT / rel), json.loads((ROOT / rel).read_text()))
    assert copy.read_text(encoding="utf-8") == doc.read_text(encoding="utf-8"), (
        "docs/weight-types.md differs from its JSON: python bench/weight_types.py --render --json J --md docs/weight-types.md"
    )
