"""`tightkv create NAME -f Modelfile`: a named model over a GGUF with its own defaults
(Ollama's Modelfile: FROM, PARAMETER, SYSTEM; see `tightkv.modelfile`)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "create"
HELP = "create a named model from a Modelfile (FROM a .gguf or a model; PARAMETER, SYSTEM)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .flags import one_line_errors

    p.add_argument("model", metavar="NAME", help="the new model's name (e.g. mymodel or mymodel:v1)")
    p.add_argument("-f", "--file", default="Modelfile", help="the Modelfile (default: ./Modelfile)")
    one_line_errors(p)


def run(ns: argparse.Namespace) -> int:
    import sys

    from ..errors import TightKVError
    from ..modelfile import parse
    from ..registry import create_model

    path = Path(ns.file).expanduser()
    try:
        text = path.read_text()
    except OSError as err:
        raise TightKVError(f"{ns.file}: {err.strerror or err}") from None
    modelfile = parse(text)
    if not Path(modelfile.base).is_absolute() and Path(path.parent, modelfile.base).is_file():
        modelfile.base = str(
            Path(path.parent, modelfile.base).resolve()
        )  # relative to the Modelfile, as Ollama reads it
    create_model(ns.model, modelfile, report=lambda status: print(status["status"], file=sys.stderr, flush=True))
    return 0
