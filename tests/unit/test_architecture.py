"""The layout keeps its layers: read from the sources' imports (ast, nothing is imported), each
package imports only packages of the layers below it, and no module takes part in an import
circle. A new package must be given its layer here."""

from __future__ import annotations

import ast
import functools
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from p4bs import paths

# Bottom to top. A package may import the packages of lower layers, never one of its own
# layer or above: the parts of one layer are independent of each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"p4bs_schemas", "p4bs_linux_tc"}),  # pure: records and codecs; Linux tc
    frozenset({"p4bs"}),  # core: config, the record bus, units, paths
    frozenset({"p4bs_exporter", "p4bs_jobs", "p4bs_sinks", "p4bs_infra"}),  # the parts
    frozenset({"p4bs_optimizer"}),
    # orchestration: the closed loop and the demo; the operator's view of a deployment
    frozenset({"p4bs_loop", "p4bs_ops"}),
    frozenset({"p4bs_eval"}),
    frozenset({"p4bs_cli"}),  # the command line, wiring every part's subcommands
)
# The optimizer drives real routers: it imports nothing of the emulation (the testbed and its
# router agent), though that sits below it.
FORBIDDEN = {"p4bs_optimizer": {"p4bs_infra"}}


@dataclass(frozen=True)
class Import:
    source: str  # file:line
    module: str  # the importing module
    target: str  # the imported module (a submodule where the name is one)


def package_dirs() -> dict[str, Path]:
    """Each top-level package and its folder, as pyproject.toml installs them."""
    project = tomllib.loads((paths.home() / "pyproject.toml").read_text())
    dirs = project["tool"]["setuptools"]["package-dir"]
    return {name: paths.home() / folder for name, folder in dirs.items()}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in package_dirs().items():
        for file in folder.rglob("*.py"):
            parts = [package, *file.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


@functools.cache
def imports() -> tuple[Import, ...]:
    """Every import of a project module, at module level or inside a function."""
    known = modules()
    known_top = set(package_dirs())
    found: list[Import] = []
    for module, file in known.items():
        package = module if file.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from package import submodule` imports the submodule.
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
            else:
                continue
            where = f"{file.relative_to(paths.home())}:{node.lineno}"
            found += [Import(where, module, t) for t in targets if t.split(".")[0] in known_top]
    return tuple(found)


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert set(package_dirs()) == placed, "give each package its layer in LAYERS"


def test_every_subpackage_is_installed() -> None:
    """A folder of modules that pyproject.toml does not list is missing from an installed
    (not editable) copy, though the editable one used here finds it."""
    project = tomllib.loads((paths.home() / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {
        ".".join([package, *init.parent.relative_to(folder).parts])
        for package, folder in package_dirs().items()
        for init in folder.rglob("__init__.py")
    }
    assert found - listed == set(), "list these in [tool.setuptools] packages"


def test_packages_import_only_lower_layers() -> None:
    wrong = []
    for i in imports():
        mine, theirs = i.module.split(".")[0], i.target.split(".")[0]
        if mine == theirs:
            continue
        if layer_of(theirs) >= layer_of(mine) or theirs in FORBIDDEN.get(mine, set()):
            wrong.append(f"{i.source}: {mine} imports {i.target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_core_imports_no_part_of_the_project() -> None:
    core = {i.target.split(".")[0] for i in imports() if i.module.split(".")[0] == "p4bs"}
    assert core <= {"p4bs", "p4bs_schemas"}, core


def test_no_module_takes_part_in_an_import_circle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for i in imports():
        if i.target != i.module:
            graph[i.module].add(i.target)
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_reader_sees_a_known_import() -> None:
    """The walk finds what it must (so an empty result above is not a broken reader)."""
    found = {(i.module, i.target) for i in imports()}
    assert ("p4bs_optimizer.drivers.linux_tc", "p4bs_linux_tc.queues") in found
    assert ("p4bs_exporter.model_target", "p4bs_exporter.dataplane_spec") in found
    assert ("p4bs_loop.cli", "p4bs_infra.testbed") in found
