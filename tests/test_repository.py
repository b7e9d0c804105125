"""The repository stands on its own: no code in it reads a path outside it (a sibling
checkout's docs, a file beside the clone), so a bare clone runs its tests and benchmarks.
A path outside is fine only where a user passes it (`--brief DIR`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|shared/docs")
FILE_PARENT = re.compile(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")


def code_files() -> list[Path]:
    files = [ROOT / ".ci" / "run"]
    for folder in ("src", "tests", "bench"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts]
    return files


def test_no_code_reads_outside_the_repository():
    found = []
    for path in code_files():
        rel = path.relative_to(ROOT)
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in FILE_PARENT.finditer(line):  # parents[k] of a file k+1 folders deep is the root
                if int(m.group(1)) >= len(rel.parts):
                    found.append(f"{rel}:{n}: {line.strip()}")
            if OUTSIDE.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "code that reads outside the repository:\n" + "\n".join(found)


def test_the_scan_sees_the_code():
    names = {p.relative_to(ROOT).as_posix() for p in code_files()}
    assert {"tests/test_kv_auto.py", "bench/kv_auto.py", "bench/make_benchmarks.py", ".ci/run"} <= names
