"""The README's promises: the first screen's two commands, and the three-line
Python example, run exactly as written."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MAIN_JOB = 'tightkv run "The capital of France is" -n 64'
# as ruff format (tests/test_style.py) writes it in the README: a blank line after the import
THREE_LINES = """from tightkv import Model

m = Model.from_pretrained("gemma3:270m")
print(m.ask("What is gravity?"))
"""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"  # PyTorch's CPU index
TEST_COMMAND = f"pip install -e '.[test]' {CPU_INDEX} && python3 -m pytest -q"


def test_first_screen_commands_are_unchanged():
    """Exactly two commands: the main job and the tests, both installing torch's
    CPU build; the first screen says to make a venv first."""
    text = README.read_text()
    first = text[: text.index("## ")]
    (block,) = re.findall(r"```bash\n(.*?)```", first, re.S)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == [f"pip install -e . {CPU_INDEX} && {MAIN_JOB}", TEST_COMMAND]
    assert "python3 -m venv .venv && . .venv/bin/activate" in first


def test_first_screen_says_what_the_first_run_does_and_how_to_run_a_real_model():
    first = README.read_text()[: README.read_text().index("## ")]
    flowed = " ".join(first.split())
    assert "compiles the C++ kernels" in flowed and "quick build first" in flowed  # at first run (#53 point 3)
    assert "*base* model" in first and "no chat template" in first
    assert "tightkv run qwen3:4b" in first and "bench/qwen_model.py" in first  # an instruct model, hub or PyPI


def test_readme_is_short_with_contents_and_a_doc_per_face():
    """A newcomer's page: at most about 250 lines, a table of contents on the first screen
    linking every section, each face linking its own doc, and no dated changelog prose
    (figures live in docs/ with the commands that made them)."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250, len(lines)
    first = text[: text.index("## ")]
    for heading in [line[3:] for line in lines if line.startswith("## ")]:
        anchor = "".join(c for c in heading.lower() if c.isalnum() or c in " -_").replace(" ", "-")
        assert f"](#{anchor})" in first, f"the contents miss {heading!r}"
    for doc in ("cli", "server", "documents", "kv-cache", "benchmarks", "weight-types", "speed", "scale-out"):
        assert f"(docs/{doc}.md" in text, doc
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated changelog line in the README"


def test_what_you_gain_names_machines_and_docs():
    """Each figure of the table names the machine it was measured on and links its doc."""
    text = README.read_text()
    section = text[text.index("## What you gain") : text.index("## ", text.index("## What you gain") + 3)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    assert len(rows) >= 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and cells[2] and "](docs/" in cells[3], row
        assert re.search(r"EPYC|computed", cells[2]), row


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == TEST_COMMAND


@pytest.mark.slow
def test_first_screen_main_job_finishes(tmp_path):
    """The main job, as written after the install, ends on its own (a base model
    left without -n would write on to the end of its 32K context)."""
    proc = subprocess.run(MAIN_JOB, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_three_line_python_example_runs_as_written(tmp_path):
    text = README.read_text()
    section = text[text.index("## Python") :]
    code = python_blocks(section)[0]
    assert code == THREE_LINES
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the README example timed out; stderr: {err[-2000:]}")
    assert proc.returncode == 0, err
    assert out.strip() and "Traceback" not in err
