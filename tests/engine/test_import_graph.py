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
    """Each engine module (by name: names are unique across the rooms) and the engine modules it imports."""
    paths = {p.stem: p for p in ENGINE_DIR.rglob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                last = node.module.split(".")[-1]
                if last in paths:  # from bot.engine.record.states import transition
                    deps.add(last)
                else:  # from bot.engine.record import states
                    deps |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[-1] for a in node.names if a.name.startswith(PACKAGE + ".")}
        graph[name] = (deps & set(paths)) - {name}
    return graph


def test_no_import_circle_among_engine_modules() -> None:
    graph = engine_imports()
    assert {"service", "context", "supervise", "finish", "launch"} <= set(graph)  # the walk sees the package
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_only_the_facade_imports_the_facade() -> None:
    graph = engine_imports()
    assert sorted(name for name, deps in graph.items() if "service" in deps) == []


def test_every_room_is_a_layer_small_and_says_what_it_owns() -> None:
    """Each folder of the engine is a layer of tests/test_layers.py, holds at most 12 files, and its __init__
    says in a line what it owns and in another what it may import."""
    from test_layers import LAYERS

    named = {prefix for _, prefixes in LAYERS for prefix in prefixes}
    rooms = sorted(p.parent for p in ENGINE_DIR.glob("*/__init__.py"))
    assert len(rooms) >= 5  # the walk sees the rooms
    assert len(list(ENGINE_DIR.glob("*.py"))) <= 12
    for room in rooms:
        assert f"{PACKAGE}.{room.name}" in named, f"{room.name}/ is not a layer in tests/test_layers.py"
        assert len(list(room.glob("*.py"))) <= 12, f"{room.name}/ holds more than 12 files"
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        owns, _, imports = doc.partition("\n\n")
        assert owns and "\n" not in owns, f"{room.name}/__init__.py: what it owns, in a line"
        assert imports.startswith("May import "), f"{room.name}/__init__.py: what it may import"
