"""lm-evaluation-harness driving a live `tightkv serve` through `local-completions`.

    pip install "lm_eval[api]==0.4.13"
    python bench/lm_eval_server.py [--batch-size 8] [--json docs/bench/lm_eval_server.json]

Starts the embedded Gemma 3 270M on loopback and runs `lm_eval --model local-completions`
on our own 20-question task (bench/lm_eval_task/), with the server's remote tokenizer
(/tokenizer_info, /tokenize); with --batch-size N the harness sends N prompts per request
(a list `prompt`). Every choice is scored by its loglikelihood from the
server's echo + logprobs. The same loglikelihoods are then computed in this process
(`Model.logits`, the same token split as the harness makes), and the script checks that
the harness's per-choice numbers and accuracy match ours. Exits 1 when they do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from live_server import serve

import numpy as np

TASK = Path(__file__).resolve().parent / "lm_eval_task"
TOLERANCE = 0.02  # nats per choice: the server scores in 64-token chunks, Model.logits in 512


def run_harness(port: int, out: Path, batch_size: int) -> tuple[float, list[dict]]:
    """The harness's accuracy and its logged samples."""
    include = out / "tasks"
    include.mkdir()
    yaml = (TASK / "tightkv_facts.yaml").read_text().replace("DATA_FILE", str(TASK / "capitals.jsonl"))
    (include / "tightkv_facts.yaml").write_text(yaml)
    cmd = [
        "lm_eval",
        "--model",
        "local-completions",
        "--tasks",
        "tightkv_facts",
        "--include_path",
        str(include),
        "--model_args",
        f"model=gemma3:270m,base_url=http://127.0.0.1:{port}/v1/completions,"
        "tokenizer_backend=remote,num_concurrent=1,max_retries=1,tokenized_requests=True",
        "--output_path",
        str(out / "results"),
        "--log_samples",
        "--batch_size",
        str(batch_size),
    ]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    results = next((out / "results").rglob("results_*.json"))
    acc = json.loads(results.read_text())["results"]["tightkv_facts"]["acc,none"]
    samples = [
        json.loads(line)
        for p in (out / "results").rglob("samples_tightkv_facts_*.jsonl")
        for line in p.read_text().splitlines()
    ]
    return acc, sorted(samples, key=lambda s: s["doc_id"])


def our_loglikelihoods(doc: dict, model) -> list[float]:
    """Each choice's loglikelihood after the question, split into tokens as the harness
    splits them (context alone, then what the whole adds), no BOS (the remote tokenizer's)."""
    out = []
    for choice in doc["choices"]:
        context = model.tokenize(doc["question"], add_bos=False)
        whole = model.tokenize(doc["question"] + " " + choice, add_bos=False)
        cont = whole[len(context) :]
        ids = context + cont
        logits = model.logits(ids)
        lsm = logits - logits.max(-1, keepdims=True)
        lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
        out.append(float(sum(lsm[len(context) - 1 + k, t] for k, t in enumerate(cont))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8094)
    ap.add_argument("--batch-size", type=int, default=1, help="prompts per request (a list prompt above 1)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    proc = serve(ns.port, ctx=512)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            acc, samples = run_harness(ns.port, Path(tmp), ns.batch_size)
    finally:
        proc.terminate()
        proc.wait(10)
    from tightkv import Model

    model = Model()
    worst, ours_right = 0.0, 0
    for s in samples:
        theirs = [float(r[0][0]) for r in s["resps"]]
        ours = our_loglikelihoods(s["doc"], model)
        worst = max(worst, max(abs(a - b) for a, b in zip(theirs, ours)))
        ours_right += int(np.argmax(ours) == s["doc"]["answer"])
    ours_acc = ours_right / len(samples)
    ok = worst <= TOLERANCE and abs(ours_acc - acc) < 1e-9
    print(
        f"lm_eval acc {acc:.3f} over {len(samples)} questions; ours {ours_acc:.3f}; "
        f"largest loglikelihood difference {worst:.4f} nats ({'ok' if ok else 'MISMATCH'})"
    )
    if ns.json:
        Path(ns.json).write_text(
            json.dumps(
                {
                    "task": "tightkv_facts",
                    "batch_size": ns.batch_size,
                    "questions": len(samples),
                    "lm_eval_acc": acc,
                    "our_acc": ours_acc,
                    "max_loglikelihood_diff": worst,
                    "tolerance": TOLERANCE,
                    "ok": ok,
                },
                indent=1,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
