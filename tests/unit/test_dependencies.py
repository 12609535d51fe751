"""pyproject.toml declares what each part imports, where a host installs it: every third-party
module a part's code imports (at module level or inside a function, its own or through the
project's modules it imports) is a distribution of the base install or of the part's extra
(`p4bs_cli.main.PARTS` names each part's extra), the tests' of the dev extra; and each extra
declares only what its part imports. Read from the sources with `ast`, nothing imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

from test_architecture import imports, modules, package_dirs

from p4bs import paths
from p4bs_cli.main import PARTS

# Import names whose distribution is named otherwise (PEP 503 normalised); any other module
# is its own distribution's name.
DISTRIBUTION_OF = {
    "ax": "ax-platform",
    "grpc": "grpcio",
    "pyflink": "apache-flink",
    "yaml": "pyyaml",
}
BASE_PACKAGES = {"p4bs", "p4bs_schemas", "p4bs_linux_tc", "p4bs_cli"}
DEV_TOOLS = {"mypy", "pytest-timeout", "pytest-xdist", "ruff"}  # run, never imported


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalised(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


def declared() -> tuple[set[str], dict[str, set[str]], dict[str, set[str]]]:
    """The base distributions, each extra's with what its `p4bs[...]` brings in, and each
    extra's own lines."""
    project = tomllib.loads((paths.home() / "pyproject.toml").read_text())["project"]
    base = {requirement_name(r) for r in project["dependencies"]}
    extras: dict[str, list[str]] = project["optional-dependencies"]

    def resolved(extra: str) -> set[str]:
        found = set(base)
        for requirement in extras[extra]:
            if requirement.startswith("p4bs["):
                for other in requirement[5:].rstrip("]").split(","):
                    found |= resolved(other.strip())
            else:
                found.add(requirement_name(requirement))
        return found

    own = {
        extra: {requirement_name(r) for r in lines if not r.startswith("p4bs[")}
        for extra, lines in extras.items()
    }
    return base, {extra: resolved(extra) for extra in extras}, own


def third_party(file: Path, local: set[str]) -> set[str]:
    """The distributions of the third-party modules `file` imports."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in local or top == "__future__":
                continue
            found.add(normalised(DISTRIBUTION_OF.get(top, top)))
    return found


def imported_by_package() -> dict[str, set[str]]:
    """Each project package's third-party distributions, through the project modules it
    imports too (an import inside a function counts: its command runs it)."""
    known = modules()
    local = set(package_dirs())
    direct = {module: third_party(file, local) for module, file in known.items()}
    graph: dict[str, set[str]] = defaultdict(set)
    for i in imports():
        graph[i.module].add(i.target if i.target in known else i.target.rpartition(".")[0])
    found: dict[str, set[str]] = defaultdict(set)
    for module in known:
        seen, todo = {module}, [module]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        found[module.split(".")[0]] |= set().union(*(direct.get(m, set()) for m in seen))
    return found


def extra_of(package: str) -> str | None:
    if package in BASE_PACKAGES:
        return None
    return next(part.extra for part in PARTS if part.module.split(".")[0] == package)


def test_every_import_is_declared_where_its_part_installs() -> None:
    base, extras, _ = declared()
    missing = []
    for package, used in sorted(imported_by_package().items()):
        extra = extra_of(package)
        allowed = base if extra is None else extras[extra]
        where = "the base dependencies" if extra is None else f"the [{extra}] extra"
        missing += [f"{package} imports {d}: not in {where}" for d in sorted(used - allowed)]
    assert not missing, "declare in pyproject.toml:\n" + "\n".join(missing)


def test_the_tests_imports_are_in_the_dev_extra() -> None:
    tests = paths.home() / "tests"
    local = (
        set(package_dirs())
        | {f.stem for f in tests.rglob("*.py") if ".deps" not in f.parts}
        | {d.name for d in tests.rglob("*") if d.is_dir()}
    )
    used = set().union(*(third_party(f, local) for f in tests.rglob("*.py")))
    _, extras, _ = declared()
    assert used - extras["dev"] == set(), "declare in pyproject.toml's dev extra"


def test_each_extra_declares_only_what_its_part_imports() -> None:
    base, _, own = declared()
    used = imported_by_package()
    core = set().union(*(used[p] for p in BASE_PACKAGES))
    assert base - core == set(), "base dependencies nothing in core, cli or schemas imports"
    for extra, lines in own.items():
        if extra == "dev":
            continue
        packages = [p for p in used if extra_of(p) == extra]
        imported = set().union(*(used[p] for p in packages))
        assert lines - imported == set(), f"[{extra}] declares what {packages} never import"
    assert own["dev"] >= DEV_TOOLS


def test_every_part_with_commands_has_an_extra_that_exists() -> None:
    _, extras, _ = declared()
    assert {part.extra for part in PARTS} - {None} <= set(extras)


def test_the_reader_finds_known_imports() -> None:
    """So an empty difference above is not a broken reader."""
    used = imported_by_package()
    assert {"ax-platform", "torch", "jenkspy"} <= used["p4bs_optimizer"]
    assert "ax-platform" in used["p4bs_ops"]  # through the optimizer's Bayesian search
    assert {"apache-flink", "pyyaml", "grpcio"} <= used["p4bs_infra"]
    assert used["p4bs_cli"] <= used["p4bs"]  # the command line loads the parts lazily
