"""Layers of bot/, runner/ and store/: no module imports a layer above its own; the bot imports of the runner
only its contract (runner/contract/); no migration imports bot/ or runner/; and no folder (scripts/, bench/
and tests/ too) has an import circle.

A lower layer is handed what it needs (clouds, offers, settings, a database URL) instead of reaching up for
it. Every import counts, also those under TYPE_CHECKING and inside functions: an upward import or a circle
hidden in a function is still one a newcomer trips over. docs/ARCHITECTURE.md ("Layers") says the same.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "runner", "store")
# Every folder of code: none may hold an import circle (scripts, benchmarks and tests too).
FOLDERS = (*PACKAGES, "scripts", "bench", "tests")

# The layers of bot/, top first. A module may import its own layer and any layer below it, never one above.
# Entry points wire the rest together; the chat renders what the engine reports; the engine runs jobs with
# object storage, the clouds and the planner; providers describe the clouds' offers in the planner's own
# types (bot.planner.offer, bot.planner.gpus), so the planner sits below them and never asks a cloud itself:
# whoever calls it hands it the offers. settings.py and money.py are at the bottom and import nothing of bot.
# A module is in the layer of its longest matching prefix; a new module outside every prefix fails the test.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("bot.cli", "bot.commands", "bot.demo", "bot.scheduler", "bot.web")),
    ("chat", ("bot.chat",)),
    # The engine's rooms (bot/engine/__init__.py), top first: the facade, then each room may import
    # the rooms below it and the ground (bot/engine/*.py but service.py), never a room above it.
    ("engine/service.py", ("bot.engine.service",)),
    ("engine/watching", ("bot.engine.watching",)),
    ("engine/control", ("bot.engine.control",)),
    ("engine/outcome", ("bot.engine.outcome",)),
    ("engine/launching", ("bot.engine.launching",)),
    ("engine/money", ("bot.engine.money",)),
    ("engine/record", ("bot.engine.record",)),
    ("engine ground", ("bot.engine",)),
    ("object storage", ("bot.storage",)),
    ("providers", ("bot.providers",)),
    ("planner", ("bot.planner",)),
    ("money", ("bot.money",)),
    ("settings", ("bot.settings",)),
    ("package", ("bot",)),  # bot/__init__.py: empty
)

# Packages besides bot/ and what of bot/ they may import: nothing. The runner is the GPU host's side; the
# store is handed its URL.
NO_BOT = ("runner", "store")

# What the bot and the runner agree on: the one part of the runner the bot imports, and it imports nothing of
# the runner outside itself (so the bot never pulls in training code, nor torch).
CONTRACT = "runner.contract"

# Migrations do the same thing in two years as today: each carries its own copy of what it needs.
MIGRATIONS = ROOT / "store" / "migrations"
LIVE_CODE = ("bot", "runner")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def all_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for folder in FOLDERS
        for p in sorted((ROOT / folder).rglob("*.py"))
        if not {"migrations", "__pycache__"} & set(p.relative_to(ROOT).parts)
    }


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of ours that ``path`` imports (the module named, and a submodule named in ``from X import
    sub``), each with the line of its first import. Outside the packages a name may also be found where the
    script runs (its own folder, or its top folder: tests/ is on pytest's path, so ``fakes.x`` is
    tests/fakes/x.py)."""
    top = name.split(".")[0]
    here = name.rpartition(".")[0]
    bases = [""] if top in PACKAGES else ["", f"{here}.", f"{top}."]

    def ours(dotted: str) -> str | None:
        for base in bases:
            # Up to the name's first part at most: ``re`` in tests/engine is not the tests.engine package.
            candidate, floor = base + dotted, len(base) + len(dotted.split(".")[0])
            while len(candidate) >= floor and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if len(candidate) >= floor:
                return candidate
        return None

    found: dict[str, int] = {}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [ours(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .y import z
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [ours(base)] + [ours(f"{base}.{a.name}") for a in node.names]
        for target in targets:
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


@cache
def import_graph() -> dict[str, dict[str, int]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    """The index of the module's layer in LAYERS (0 is the top), None outside bot/."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), index)
    return best[1] if best else None


def where(module: str, line: int) -> str:
    return f"{all_modules()[module].relative_to(ROOT)}:{line}"


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a higher layer, and every import of bot/ from runner/ or store/, as readable lines."""
    found = []
    for module, deps in sorted(graph.items()):
        for dep, line in sorted(deps.items()):
            if module.split(".")[0] in NO_BOT and dep.split(".")[0] == "bot":
                found.append(
                    f"{where(module, line)}: {module} imports {dep} "
                    f"({module.split('.')[0]}/ imports nothing of bot)"
                )
                continue
            mine, theirs = layer_of(module), layer_of(dep)
            if mine is not None and theirs is not None and theirs < mine:
                found.append(
                    f"{where(module, line)}: {module} imports {dep} "
                    f"({LAYERS[mine][0]} is below {LAYERS[theirs][0]})"
                )
    return found


def contract_breaches(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of the runner by the bot outside runner.contract, and of the runner's other modules by
    the contract, as readable lines."""
    found = []
    for module, deps in sorted(graph.items()):
        side = module.split(".")[0]
        if side != "bot" and not in_contract(module):
            continue
        for dep, line in sorted(deps.items()):
            if dep.split(".")[0] == "runner" and not in_contract(dep):
                who = "the bot" if side == "bot" else "the contract"
                found.append(f"{where(module, line)}: {module} imports {dep} ({who} imports only {CONTRACT})")
    return found


def in_contract(module: str) -> bool:
    return module == CONTRACT or module.startswith(CONTRACT + ".")


def migration_imports(where: str, source: str) -> list[str]:
    """The imports of live code (bot/, runner/) in one migration file (``where``: its path), as readable
    lines."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for dotted in names:
            if dotted.split(".")[0] in LIVE_CODE:
                found.append(f"{where}:{node.lineno}: imports {dotted} (a migration is frozen)")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_of_bot_has_a_layer() -> None:
    graph = import_graph()
    assert {"bot.settings", "bot.chat.slack.app", "bot.engine.service", "runner.train", "store.db"} <= set(
        graph
    )
    assert [m for m in graph if m.startswith("bot") and layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    problems = upward_imports(import_graph())
    assert problems == [], "upward imports:\n" + "\n".join(problems)


def test_settings_imports_nothing_of_bot() -> None:
    deps = sorted(import_graph()["bot.settings"].items())
    found = [f"{where('bot.settings', n)}: imports {d}" for d, n in deps if d.startswith("bot")]
    assert found == [], "settings.py imports nothing of bot:\n" + "\n".join(found)


def test_the_bot_imports_of_the_runner_only_its_contract() -> None:
    graph = import_graph()
    # the walk sees the contract's imports
    assert any(in_contract(d) for d in graph["bot.engine.launching.integrity"])
    problems = contract_breaches(graph)
    assert problems == [], "outside the contract:\n" + "\n".join(problems)


def test_no_migration_imports_live_code() -> None:
    files = sorted(MIGRATIONS.rglob("*.py"))
    assert any(p.name.startswith("0012_") for p in files)  # the walk sees the versions
    problems = [line for p in files for line in migration_imports(str(p.relative_to(ROOT)), p.read_text())]
    assert problems == [], "migrations import live code:\n" + "\n".join(problems)


def test_a_migration_that_imports_live_code_is_named() -> None:
    body = (
        "import sqlalchemy\nfrom store import models\ndef upgrade():\n"
        "    from bot.engine.launching.jobspec import spec_fields\n    import runner.contract\n"
    )
    found = migration_imports("store/migrations/versions/9999_test.py", body)
    assert found == [
        "store/migrations/versions/9999_test.py:4: imports bot.engine.launching.jobspec"
        " (a migration is frozen)",
        "store/migrations/versions/9999_test.py:5: imports runner.contract (a migration is frozen)",
    ]


@pytest.mark.parametrize("top", FOLDERS)
def test_no_import_circle(top: str) -> None:
    graph = import_graph()
    part = {
        m: {d for d in deps if d.split(".")[0] == top} for m, deps in graph.items() if m.split(".")[0] == top
    }
    assert len(part) > 1  # the walk sees the folder
    cycle = find_cycle(part)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("module", "dep", "message"),
    [
        (
            "bot.planner.rank",
            "bot.providers.snapshot",
            "bot/planner/rank.py:7: bot.planner.rank imports "
            "bot.providers.snapshot (planner is below providers)",
        ),
        (
            "store.models",
            "bot.settings",
            "store/models.py:7: store.models imports bot.settings (store/ imports nothing of bot)",
        ),
        (
            "runner.train",
            "bot.planner.gpus",
            "runner/train.py:7: runner.train imports bot.planner.gpus (runner/ imports nothing of bot)",
        ),
        (
            "bot.settings",
            "bot.money",
            "bot/settings.py:7: bot.settings imports bot.money (settings is below money)",
        ),
    ],
)
def test_an_upward_import_is_named_with_its_file_and_line(module: str, dep: str, message: str) -> None:
    graph = {module: {dep: 7}}
    assert upward_imports(graph) == [message]


@pytest.mark.parametrize(
    ("module", "dep", "message"),
    [
        (
            "bot.engine.launching.launch",
            "runner.tiny",
            "bot/engine/launching/launch.py:7: bot.engine.launching.launch imports runner.tiny "
            "(the bot imports only runner.contract)",
        ),
        (
            "bot.demo",
            "runner",
            "bot/demo.py:7: bot.demo imports runner (the bot imports only runner.contract)",
        ),
        (
            "runner.contract.spec",
            "runner.train",
            "runner/contract/spec.py:7: runner.contract.spec imports runner.train "
            "(the contract imports only runner.contract)",
        ),
    ],
)
def test_an_import_outside_the_contract_is_named(module: str, dep: str, message: str) -> None:
    assert contract_breaches({module: {dep: 7}}) == [message]
    assert contract_breaches({module: {"runner.contract.spec": 7}}) == []
    assert contract_breaches({"runner.train": {dep: 7}}) == []  # the runner's own modules import anything


def test_the_walk_finds_a_circle_where_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_walk_reads_every_kind_of_import(tmp_path: Path) -> None:
    """Imports in functions, under TYPE_CHECKING and relative ones count; a package named in ``from`` too."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bot.engine.context import EngineContext\n"
        "def f():\n    import bot.providers.snapshot\n"
        "from . import cards\n"
        "from bot.chat.slack import actions\n"
    )
    modules = all_modules()
    found = imports_of("bot.chat.x", src, modules)
    assert set(found) == {
        "bot.engine.context",
        "bot.providers.snapshot",
        "bot.chat",
        "bot.chat.cards",
        "bot.chat.slack",
        "bot.chat.slack.actions",
    }
