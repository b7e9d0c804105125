"""Print how much resident memory loading a model adds, against the bound
1.3 x GGUF size + 100 MB over the RSS just after `import torch`.

    python bench/load_memory.py [MODEL] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

import psutil


def rss() -> int:
    return psutil.Process().memory_info().rss


def measure(name: str | None) -> dict:
    import torch  # noqa: F401  (the baseline is taken after importing torch)

    base = rss()
    from tightkv import Model

    m = Model(name)
    size = m.path.stat().st_size
    m.generate("Hello", max_tokens=4)  # touch every weight once
    loaded = rss()
    rise = loaded - base
    bound = 1.3 * size + 100e6
    return {
        "model": str(m.path),
        "gguf_bytes": size,
        "rss_after_torch": base,
        "rss_loaded": loaded,
        "rise_bytes": rise,
        "bound_bytes": int(bound),
        "ok": rise <= bound,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    r = measure(ns.model)
    mb = 1e6
    print(f"model            {r['model']}")
    print(f"GGUF size        {r['gguf_bytes'] / mb:8.1f} MB")
    print(f"RSS after torch  {r['rss_after_torch'] / mb:8.1f} MB")
    print(f"RSS loaded       {r['rss_loaded'] / mb:8.1f} MB (after a 4-token generation)")
    print(
        f"rise             {r['rise_bytes'] / mb:8.1f} MB   bound {r['bound_bytes'] / mb:.1f} MB   "
        f"{'OK' if r['ok'] else 'OVER'}"
    )
    if ns.json:
        json.dump(r, open(ns.json, "w"), indent=1)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
