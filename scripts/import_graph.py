"""Draw reflectrl's import graph by layer (the table of docs/architecture.md, held by tests/test_structure.py):
one Mermaid edge per pair of layers that import each other's modules, labelled with the number of module
imports. ``python scripts/import_graph.py`` prints the block docs/architecture.md shows (a test keeps them equal);
``--write`` puts it there."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def structure():
    spec = importlib.util.spec_from_file_location("test_structure", ROOT / "tests" / "test_structure.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mermaid() -> str:
    """The layer graph as a Mermaid block: edges point from the importing layer to the imported one."""
    s = structure()
    graph = s.import_graph()
    names = [name for name, _ in s.LAYERS]
    edges = Counter((s.layer_of(m), s.layer_of(d)) for m, deps in graph.items() for d in deps
                    if s.layer_of(m) != s.layer_of(d))
    ident = {i: f"L{i}" for i in range(len(names))}
    lines = ["```mermaid", "flowchart BT"]
    lines += [f'  {ident[i]}["{name}"]' for i, name in enumerate(names)]
    lines += [f"  {ident[a]} -->|{n}| {ident[b]}" for (a, b), n in sorted(edges.items())]
    lines.append("```")
    return "\n".join(lines)


def write() -> None:
    """Replace the drawing between docs/architecture.md's ``<!-- import-graph -->`` markers."""
    import re

    doc = ROOT / "docs" / "architecture.md"
    text = re.sub(r"(<!-- import-graph -->\n).*?(\n<!-- /import-graph -->)", lambda m: m.group(1) + mermaid() + m.group(2),
                  doc.read_text(), flags=re.S)
    doc.write_text(text)


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv:
        write()
    else:
        print(mermaid())
