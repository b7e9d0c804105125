"""Shared fixtures. The embedded model is opened once per test session."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
REFERENCE = SHARED / "reference" / "gemma3-270m-llamacpp.json"
ESSAYS = SHARED / "data" / "essays.txt"


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def embedded():
    """The embedded Gemma 3 270M, loaded once."""
    from tightkv import Model

    return Model()
