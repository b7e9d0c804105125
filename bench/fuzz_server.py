"""Schemathesis over every route of a live `tightkv serve`, the model pinned.

    python bench/fuzz_server.py [--examples 30] [--report docs/bench/fuzz_server.json]

Starts the embedded Gemma 3 270M on loopback (context 256, so no generation runs long),
takes the server's own OpenAPI document, pins every `model` field to the served id (a
random name would only ever test the 404), and runs schemathesis with its checks
`not_a_server_error` and `response_schema_conformance` (plus the status-code and
content-type checks), `--examples` cases per operation. Prints schemathesis's output and
writes a JSON report of the run: operations, cases, failures (each with its operation and
message). Exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from live_server import serve

ROOT = Path(__file__).resolve().parents[1]
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


def pinned_schema(port: int) -> dict:
    """The server's OpenAPI document with every `model` property a constant."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json") as r:
        doc = json.load(r)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models") as r:
        served = json.load(r)["data"][0]["id"]
    for schema in doc["components"]["schemas"].values():
        props = schema.get("properties", {})
        for name in ("model", "name"):
            if name in props and schema.get("title", "").endswith("Request"):
                props[name] = {"const": served, "type": "string"}
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=30)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--report", default=None, help="write the run's summary as JSON here")
    ns = ap.parse_args()
    if shutil.which("schemathesis") is None:
        sys.exit("error: schemathesis is not installed (pip install schemathesis)")
    proc = serve(ns.port, ctx=256)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            schema = Path(tmp) / "openapi.json"
            schema.write_text(json.dumps(pinned_schema(ns.port)))
            junit = Path(tmp) / "junit.xml"
            cmd = [
                "schemathesis",
                "run",
                str(schema),
                "--url",
                f"http://127.0.0.1:{ns.port}",
                "-c",
                CHECKS,
                "-n",
                str(ns.examples),
                "--seed",
                "7",
                "--request-timeout",
                "120",
                "-w",
                "1",
                "--phases",
                "examples,fuzzing",  # the coverage phase's hundreds of cases per body take hours here
                "--report",
                "junit",
                "--report-junit-path",
                str(junit),
            ]
            print("$ " + " ".join(cmd), flush=True)
            run = subprocess.run(cmd, capture_output=True, text=True)
            print(run.stdout[-20000:], run.stderr[-2000:], sep="\n")
            rc = run.returncode
            summary = summarize(junit, run.stdout)
    finally:
        proc.terminate()
        proc.wait(10)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    if ns.report:
        Path(ns.report).write_text(
            json.dumps({"examples_per_operation": ns.examples, "checks": CHECKS, "exit_code": rc, **summary}, indent=1)
        )
    return 1 if rc else 0


def summarize(junit: Path, output: str) -> dict:
    """Operations and failures from schemathesis's JUnit report, the case count from its summary."""
    import re
    import xml.etree.ElementTree as ET

    operations, failures = [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        operations.append(case.get("name"))
        for f in list(case.iter("failure")) + list(case.iter("error")):
            failures.append({"operation": case.get("name"), "message": (f.get("message") or f.text or "")[:500]})
    m = re.search(r"(\d+) generated", output)
    return {"operations": sorted(operations), "cases": int(m.group(1)) if m else None, "failures": failures}


if __name__ == "__main__":
    sys.exit(main())
