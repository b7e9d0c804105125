"""The mean and largest top-20 logit distance of the embedded model from llama.cpp's outputs
(tests/reference, as tests/test_reference.py measures it), for the loaded kernel build.

    TIGHTKV_SIMD=avx2 python tests/arm/reference_distance.py [--reference-attention]

Run on each build (and under qemu by tests/arm/end_to_end.sh), it shows how far the builds
that round activations to int8 spread around the test's bound (docs/arm.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tightkv import Model
from tightkv.kernels import attention, build

REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "gemma3-270m-llamacpp.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference-attention", action="store_true", help="attention by torch, not the kernel")
    args = ap.parse_args()
    if args.reference_attention:
        attention.set_backend("reference")
    model = Model()
    diffs = []
    for case in json.loads(REFERENCE.read_text())["logits"]:
        logits = model.logits(case["ids"])[case["position"]]
        diffs.append(np.abs(logits[np.array(case["top20_ids"])] - np.array(case["top20_logits"])))
    d = np.concatenate(diffs)
    attn = "reference" if args.reference_attention else "kernel"
    print(f"{build.status()}, {attn} attention: mean {d.mean():.3f}, max {d.max():.3f}")


if __name__ == "__main__":
    main()
