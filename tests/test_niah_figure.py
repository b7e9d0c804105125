"""The `niah --png` heatmap: sized for its grid, one panel per KV type (wrapped
past four), the model and needle in the title. The figure itself was looked at:
docs/niah_example.png is one, from the embedded model."""

from __future__ import annotations

import matplotlib.image

from tightkv.eval.niah import DEFAULT_NEEDLES, Needle, figure_title, heatmap


def _results(kinds, lengths, depths):
    return {
        kv: {
            "cells": [
                {"length": L, "depth": d, "needle": 0, "passed": (i + j + k) % 3 > 0}
                for i, L in enumerate(lengths)
                for j, d in enumerate(depths)
            ]
        }
        for k, kv in enumerate(kinds)
    }


def _size(tmp_path, kinds, lengths, depths) -> tuple[int, int]:
    path = tmp_path / f"{len(kinds)}x{len(lengths)}x{len(depths)}.png"
    heatmap(_results(kinds, lengths, depths), lengths, depths, str(path), model="gemma3:270m", needles=DEFAULT_NEEDLES)
    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


def test_the_figure_grows_with_its_grid(tmp_path):
    small = _size(tmp_path, ["f16", "progressive"], [192, 256], [0, 50, 100])
    assert 600 <= small[0] <= 900 and 250 <= small[1] <= 400, small  # was 384x216, labels clipped
    wider = _size(tmp_path, ["f16", "progressive"], [192, 256], [0, 25, 50, 75, 100])
    taller = _size(tmp_path, ["f16", "progressive"], [1024, 2048, 4096, 8192, 16384], [0, 50, 100])
    assert wider[0] > small[0] + 100 and taller[1] > small[1] + 100
    wrapped = _size(tmp_path, ["f16", "q8_0", "q4_0", "progressive", "aggressive"], [192, 256], [0, 50, 100])
    assert wrapped[1] > small[1] + 150 and wrapped[0] < 1.6 * small[0]  # 3 + 2 panels, not 5 in a row


def test_the_title_names_the_model_and_the_needle():
    assert figure_title("gemma3:270m", DEFAULT_NEEDLES) == (
        "Needle in a haystack: gemma3:270m\nneedle: \u201cThe secret code for the vault is 4827.\u201d"
    )
    two = [Needle.from_user("A fact " + "x" * 100, "Q?", "fact"), Needle.from_user("B", "Q?", "B")]
    line = figure_title("qwen3:4b", two).splitlines()[1]
    assert line.startswith("2 needles, the first: \u201cA fact x") and line.endswith("...\u201d") and len(line) < 100
