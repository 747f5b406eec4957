"""The engine's modules form no import circle: steps take the context, only the facade knows them all.

Every import counts, also those under TYPE_CHECKING and inside functions: a circle hidden in a
function is still one a newcomer trips over.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import find_cycle  # tests/ is on the path, as for fakes/

import bot.engine

ENGINE_DIR = Path(bot.engine.__file__).parent
PACKAGE = "bot.engine"


def engine_imports() -> dict[str, set[str]]:
    modules = {p.stem for p in ENGINE_DIR.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((ENGINE_DIR / f"{name}.py").read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == PACKAGE:  # from bot.engine import finish
                    deps |= {a.name for a in node.names if a.name in modules}
                elif node.module.startswith(PACKAGE + "."):
                    deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith(PACKAGE + ".")}
        graph[name] = deps - {name}
    return graph


def test_no_import_circle_among_engine_modules() -> None:
    graph = engine_imports()
    assert {"service", "context", "supervise", "finish", "launch"} <= set(graph)  # the walk sees the package
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_only_the_facade_imports_the_facade() -> None:
    graph = engine_imports()
    assert sorted(name for name, deps in graph.items() if "service" in deps) == []
