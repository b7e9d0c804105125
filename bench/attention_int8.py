"""Quality cost of the int8 attention paths: perplexity and KLD against f16 with the
fused kernel's integer paths on (tq4 dots in int8 with AVX-512 VNNI; 4-bit KVarN keys and
values with AVX2's maddubs) and off, through decode-sized steps (`--step 1`: every scored
position a decode step, as in generation; the AVX2 paths serve decode steps only).

    python bench/attention_int8.py [--model GGUF] [--chunks 3] [--kv progressive] [--step 16] [--json PATH]

Each chunk of the llama-perplexity protocol (essays, ctx 2048) is fed `--step` tokens
at a time (16 by default: the decode kernel's row counts, as in speculative steps; 1:
every position a decode step). Prints one row per mode.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tightkv.eval.bench import machine
from tightkv.eval.corpus import essays


def measure(model, text: str, kv: str, chunks: int, step: int) -> dict:
    from tightkv.eval import ppl

    return ppl.perplexity(model, text, 2048, chunks, [kv], progress=True, batch=step)[kv]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path (default: the embedded Gemma 3 270M)")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--kv", default="progressive")
    ap.add_argument("--step", type=int, default=16, help="tokens per forward call")
    ap.add_argument("--file", default=None, help="text file (default: the essays corpus)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()

    from tightkv.api import Model
    from tightkv.kernels import attention

    model = Model(ns.model)
    text = Path(ns.file).read_text() if ns.file else essays()
    rows = []
    for mode in ("int8", "float"):
        if not attention.set_int8(mode == "int8", mode == "int8") and mode == "int8":
            print("the kernel was built without integer attention paths (neither AVX-512 VNNI nor AVX2)")
            continue
        r = measure(model, text, ns.kv, ns.chunks, ns.step)
        rows.append({"mode": mode, "kv": ns.kv, **r})
    attention.set_int8()
    print(
        f"| mode | kv | ppl | KLD mean | KLD p99 | same top-1 |  (essays, ctx 2048, {ns.chunks} chunks, "
        f"{ns.step} tokens per step)"
    )
    for r in rows:
        print(
            f"| {r['mode']} | {r['kv']} | {r['ppl']:.4f} | {r['kld_mean']:.5f} | {r['kld_p99']:.4f} | "
            f"{r['same_top1']:.4f} |"
        )
    if ns.json:
        Path(ns.json).write_text(
            json.dumps(
                {
                    "command": "python " + " ".join(sys.argv),
                    "model": model.path.name,
                    "machine": machine(),
                    "chunks": ns.chunks,
                    "step": ns.step,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
