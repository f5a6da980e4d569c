"""The shape of the source tree: no import cycles among reflectrl's modules (imports inside functions
count too), no import up a layer of docs/architecture.md's table but the exceptions it names, and no source
file over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The reflectrl modules ``path`` imports (``from .x import y`` resolves to ``pkg.x.y`` when that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [p for p in SRC.rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    cycles = all_cycles(import_graph())
    assert cycles == [], f"import cycles: {cycles}"


def test_no_source_file_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"files over {MAX_LINES} lines: {long}"


def test_cycle_finder_finds_a_cycle():
    assert all_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# docs/architecture.md, "The layers", top to bottom: a module may import its own layer and the layers above it.
LAYERS = [
    ("core", ["reflectrl.core"]),
    ("statistics", ["reflectrl.eval"]),
    ("plumbing", ["reflectrl.errors", "reflectrl.checkpoint", "reflectrl.runlog", "reflectrl.progress",
                  "reflectrl.trainer"]),
    ("tasks and sandbox", ["reflectrl.tasks", "reflectrl.sandbox"]),
    ("the method contract", ["reflectrl.contract"]),
    ("front ends", ["reflectrl.control", "reflectrl.llm"]),
    ("method families", ["reflectrl.methods"]),
    ("composition root", ["reflectrl.algos"]),
    ("integrations", ["reflectrl.integrations"]),
    ("experiments", ["reflectrl.experiments"]),
    ("command line", ["reflectrl", "reflectrl.cli", "reflectrl.__main__"]),
]
EXCEPTIONS: set[tuple[str, str]] = set()
"""Imports up a layer that the table's text allows: none."""


def layer_of(module: str) -> int:
    """The row of LAYERS whose longest prefix names ``module``."""
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is in no layer of docs/architecture.md's table"
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a module in a lower layer (a later row) by one in a higher layer."""
    return {(m, d) for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m)}


def test_no_import_runs_up_a_layer_but_the_named_exceptions():
    extra = sorted(upward_imports(import_graph()) - EXCEPTIONS)
    assert extra == [], f"imports up a layer (docs/architecture.md, 'The layers'): {extra}"


def test_every_named_exception_is_still_an_import():
    """An exception the code no longer needs leaves the list (and the table's text)."""
    assert upward_imports(import_graph()) >= EXCEPTIONS


def test_the_layer_rule_can_fail():
    graph = {"reflectrl.core.losses": {"reflectrl.llm.grpo"}, "reflectrl.llm.grpo": {"reflectrl.core.losses"}}
    assert upward_imports(graph) == {("reflectrl.core.losses", "reflectrl.llm.grpo")}


def test_the_drawn_import_graph_is_the_code_s():
    """docs/architecture.md's drawing of the layer graph is what ``scripts/import_graph.py`` draws from the code."""
    import importlib.util
    import re

    root = SRC.parent
    spec = importlib.util.spec_from_file_location("import_graph", root / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (root / "docs" / "architecture.md").read_text()
    drawn = re.search(r"<!-- import-graph -->\n(.*?)\n<!-- /import-graph -->", doc, re.S)
    assert drawn, "docs/architecture.md has no <!-- import-graph --> block"
    assert drawn.group(1) == mod.mermaid(), "redraw it: python scripts/import_graph.py --write"
    # every arrow points down the table: from a later layer to an earlier one
    assert all(int(a) > int(b) for a, b in re.findall(r"L(\d+) -->\|\d+\| L(\d+)", drawn.group(1)))
