"""The import rule of docs/ARCHITECTURE.md, checked on the source itself.

The graph holds every import of the project's own modules, those inside functions too (a
lazy import still ties two modules together), read with `ast` without importing anything.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "trainer", "tokshard")
CONTRACT = "pipeline.format"
#: what the format contract may import from outside the project
CONTRACT_THIRD_PARTY = {"numpy", "xxhash"}
STORAGE = "pipeline.storage"
#: what the storage package may import from outside the project: xxhash at load, and fsspec
#: inside functions only (when a location is a URL), so a node reading local shards never loads it
STORAGE_THIRD_PARTY = {"xxhash"}
#: (and s3fs's retry hooks, with the botocore error they name, where s3:// is installed)
STORAGE_LAZY = {"pipeline.storage.object_store": {"fsspec", "s3fs", "botocore"}}


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported_names(path: Path, top_level: bool = False) -> set[str]:
    """Every module name an import statement in this file names (at any depth of the file, or
    with ``top_level`` only those that run when the module loads: not inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in _loading(tree) if top_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _loading(node: ast.AST):
    """The nodes of ``node`` outside function bodies."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _loading(child)


def third_party(names: set[str]) -> set[str]:
    tops = {n.split(".")[0] for n in names}
    return tops - set(PACKAGES) - set(sys.stdlib_module_names)


def import_graph() -> dict[str, set[str]]:
    """Edges between the project's modules (an import inside a function counts too)."""
    modules = module_files()
    return {
        name: {n for n in imported_names(path) if n in modules and n != name}
        for name, path in modules.items()
    }


def parents(name: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``name`` itself."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the list of modules along it (None: there is none)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def closure(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    """Every project module that loads when ``start`` loads (parent packages included)."""
    seen: set[str] = set()
    todo = [*start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [*graph[name], *(p for p in parents(name) if p in graph)]
    return seen


def test_the_project_has_no_import_circle():
    inside = import_graph()
    cycle = find_cycle(inside)
    assert cycle is None, " -> ".join(cycle or [])


def edges(graph: dict[str, set[str]], source: str, target: Callable[[str], bool]) -> set[tuple[str, str]]:
    """The imports from modules of package ``source`` to modules ``target`` accepts."""
    return {(a, b) for a, targets in graph.items() if a.split(".")[0] == source for b in targets if target(b)}


def test_no_pipeline_module_imports_the_trainer_or_the_application():
    inside = import_graph()
    assert not edges(inside, "pipeline", lambda b: b.startswith(("trainer", "tokshard")))


def test_the_trainer_imports_only_the_format_contract_and_storage_from_the_pipeline():
    """...and nothing of the application layer, not even a door for launchers: they start
    ``python -m tokshard train``."""
    inside = import_graph()

    def forbidden(b: str) -> bool:
        shared = b.startswith((CONTRACT, STORAGE)) or b == "pipeline"
        return (b.startswith("pipeline") and not shared) or b.startswith("tokshard")

    assert not edges(inside, "trainer", forbidden)


def test_the_trainer_parses_no_command_line():
    """Options and their parsing are the application layer's (``tokshard/commands/``): the
    trainer library takes typed settings."""
    files = module_files()
    parsing = sorted(
        name
        for name, path in files.items()
        if name.split(".")[0] == "trainer" and "argparse" in imported_names(path)
    )
    assert not parsing


COMMANDS = "tokshard.commands"
COMMAND_RECORD = "tokshard.commands.command"


def test_each_command_module_stands_alone_under_the_cli():
    """``tokshard/cli.py`` lists the command modules; a command imports neither the list nor
    another command (only the `Command` record and the pieces they share)."""
    inside = import_graph()
    for name in [n for n in inside if n.startswith(COMMANDS + ".") and n != COMMAND_RECORD]:
        others = {b for b in inside[name] if b.startswith(COMMANDS + ".") and b != COMMAND_RECORD}
        assert not others and "tokshard.cli" not in inside[name], (name, sorted(others))


#: pipeline's stages, each allowed to import only those before it
STAGES = ("format", "storage", "sources", "encoding", "recipe", "inspection", "run")


def stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 else None


def test_each_pipeline_stage_imports_only_earlier_stages():
    inside = import_graph()
    wrong = {
        (a, b)
        for a, targets in inside.items()
        for b in targets
        if stage(a) and stage(b) and stage(a) != stage(b) and STAGES.index(stage(b)) > STAGES.index(stage(a))
    }
    assert not wrong


def test_the_format_contract_needs_only_numpy_xxhash_and_the_standard_library():
    inside = import_graph()
    files = module_files()
    contract = closure(inside, {name for name in inside if name.startswith(CONTRACT)})
    assert all(name == "pipeline" or name.startswith(CONTRACT) for name in contract), sorted(contract)
    for name in contract:
        assert third_party(imported_names(files[name])) <= CONTRACT_THIRD_PARTY, name


def test_storage_needs_only_the_contract_xxhash_and_fsspec_inside_functions():
    inside = import_graph()
    files = module_files()
    storage = closure(inside, {name for name in inside if name.startswith(STORAGE)})
    assert all(name == "pipeline" or name.startswith((CONTRACT, STORAGE)) for name in storage), sorted(
        storage
    )
    for name in storage:
        allowed = STORAGE_THIRD_PARTY | (CONTRACT_THIRD_PARTY if name.startswith(CONTRACT) else set())
        assert third_party(imported_names(files[name], top_level=True)) <= allowed, name
        assert third_party(imported_names(files[name])) <= allowed | STORAGE_LAZY.get(name, set()), name


#: the modules that know which kind of place a run lives in (a folder or an object store)
PLACE_KINDS = {
    "pipeline.run.folder_state",
    "pipeline.run.folder_layout",
    "pipeline.run.store_state",
    "pipeline.storage.local_folder",
    "pipeline.storage.object_store",
}


def test_the_driver_status_and_commands_reach_a_run_only_through_the_run_state_seam():
    """One driver over one interface: which implementation a run gets is chosen once
    (`pipeline.run.open_state`), and nothing that drives or reports a run names one."""
    inside = import_graph()
    users = {"pipeline.run.driver", "pipeline.run.status"} | {n for n in inside if n.startswith("tokshard")}
    for user in sorted(users):
        assert not inside[user] & PLACE_KINDS, (user, sorted(inside[user] & PLACE_KINDS))


def test_the_graph_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "lazy.py"
    path.write_text(
        "import numpy\n\ndef f():\n    from pipeline.format import manifest\n    import trainer.loop\n"
    )
    assert {"pipeline.format", "pipeline.format.manifest", "trainer.loop"} <= imported_names(path)
    assert imported_names(path, top_level=True) == {"numpy"}


def test_the_cycle_finder_finds_a_circle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
