"""The layering of docs/ARCHITECTURE.md, checked on the source: no module imports one that
imports it back (directly or through others), and no module imports from a layer above its
own. Imports inside functions count: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tightkv"

# bottom up; a module may import from its own layer and the ones below
LAYERS = [
    ["errors", "store", "progress"],
    ["gguf"],
    ["kernels"],
    ["kv"],
    ["models"],
    ["engine"],
    ["registry", "hub", "remote", "modelfile"],
    ["documents"],
    ["eval"],  # measures a model it is given (duck-typed); it decides nothing for the runtime
    ["api", "repl", "autokv"],  # the facade, the REPL, and the one resolver of kv="auto"
    ["server"],
    ["commands"],
    ["cli", "__init__"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" and name.count(".") else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            # `from pkg import sub` depends on pkg.sub; `from pkg import name` on pkg itself
            candidates = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in modules:
                c = c.rpartition(".")[0]
            if c and c != name and c.startswith("tightkv"):
                found.add(c)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def test_every_module_has_a_layer():
    assert {_layer(m) for m in _graph()} <= set(RANK)


def test_no_import_goes_up_the_layers():
    up = [
        f"{m} -> {d}"
        for m, deps in _graph().items()
        for d in deps
        if _layer(m) != "__init__" and RANK[_layer(d)] > RANK[_layer(m)]
    ]
    assert not up, up


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    circles = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(path[path.index(d) :] + [d])
            elif d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, circles


# the verbs that measure: the only faces that may import eval/ (the rest go through api or engine)
MEASUREMENT_VERBS = {"ppl", "niah", "bench", "docqa", "plan"}


def test_faces_import_eval_only_in_the_measurement_verbs():
    bad = [
        f"{m} -> {d}"
        for m, deps in _graph().items()
        for d in deps
        if _layer(m) in ("server", "commands")
        and _layer(d) == "eval"
        and not (_layer(m) == "commands" and m.split(".")[-1] in MEASUREMENT_VERBS)
    ]
    assert not bad, bad


AUTO_RESOLVER = "tightkv.kv.spec"  # `is_auto`: the one place the string "auto" is read as a KV spec


def test_kv_auto_is_special_cased_in_one_place():
    """No comparison of a KV value with "auto" outside the resolver (a `mode == "auto"` of
    the document sessions is another auto)."""
    found = []
    for name, path in _modules().items():
        if name == AUTO_RESOLVER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value == "auto"]
            text = ast.unparse(node).lower()
            if consts and ("kv" in text or "spec" in text):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


# what continuous batching is made of: the engine's (engine.batch), never the scheduler's
RUNTIME_NAMES = {
    "decode_sequences",
    "Sampler",
    "SamplingParams",
    "PrefixStore",
    "PromptCache",
    "chunk_ends",
    "check_context",
    "kernel_rows",
    "new_cache",
    "sequence",
    "sampling_params",
    "cut_points",
    "prefill",
    "step",
}


def test_the_scheduler_holds_no_sampling_or_cache_logic():
    name = "tightkv.server.scheduler"
    path = _modules()[name]
    deps = {d for d in _graph()[name] if _layer(d) != "errors"}
    assert deps <= {"tightkv.engine.batch", "tightkv.engine.requests"}, deps
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    # `batch.step(...)` is the one call into the runtime the scheduler makes
    assert used & RUNTIME_NAMES <= {"step"}, used & RUNTIME_NAMES
