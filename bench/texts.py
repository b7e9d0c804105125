"""The held-out texts of `make_benchmarks.py --only ppl-texts`, each from a fixed local source.

essays-late  the essays from character 300,000 on (English prose)
shared-docs  the project brief's docs/*.md (technical Markdown with tables and code; needs --brief DIR)
python-code  CPython 3.11's own standard-library sources (argparse, dataclasses, ...), read from disk
korean       the Korean constitution and ten Korean bills, the corpus shipped in the PyPI wheel
             konlpy 0.6.0 (fetched with `pip download --no-deps` into the cache, never installed)
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from sections import DOC_FILES, LATE_ESSAYS

STDLIB_MODULES = ["argparse", "dataclasses", "functools", "typing", "pathlib", "textwrap", "shutil", "tempfile"]
KONLPY = "konlpy==0.6.0"


def python_code() -> str:
    """Source of some standard-library modules, as a user's code base would read."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return "".join((lib / f"{m}.py").read_text(encoding="utf-8") for m in STDLIB_MODULES)


def korean() -> str:
    """The kolaw and kobill corpora of konlpy's wheel (about 50,000 Hangul-heavy characters)."""
    from tightkv.store import home

    cache = home() / "bench" / "konlpy"
    wheel = next(iter(cache.glob("konlpy-0.6.0-*.whl")), None)
    if wheel is None:
        cache.mkdir(parents=True, exist_ok=True)
        print(f"fetching {KONLPY} from PyPI for its Korean corpus (19 MB)...", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), KONLPY], check=True
        )
        wheel = next(cache.glob("konlpy-0.6.0-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if "/data/corpus/" in n and n.endswith(".txt"))
        return "\n\n".join(z.read(n).decode("utf-8") for n in names)


def held_out_texts(essays: Path, brief: Path | None) -> dict[str, str]:
    """Name -> text; `shared-docs` only when the brief's docs folder is given."""
    texts = {"essays-late": essays.read_text(encoding="utf-8")[LATE_ESSAYS:]}
    if brief:
        texts["shared-docs"] = "".join((brief / f"{n}.md").read_text(encoding="utf-8") for n in DOC_FILES)
    else:
        print("ppl-texts: no --brief DIR, so the shared-docs rows are kept as committed", file=sys.stderr)
    texts["python-code"] = python_code()
    texts["korean"] = korean()
    return texts
