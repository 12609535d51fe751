"""The command line as an installed package runs it: `p4bs --version` without the project's
dependencies, a host with one extra runs that part's commands and is told which extra
another needs, and the config a command reads when not given --config ($P4BS_CONFIG,
/etc/p4bs/p4bs.toml, a checkout's example), or an error naming every place looked."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import tomli_w
from test_dependencies import DISTRIBUTION_OF, declared, normalised

from p4bs import paths
from p4bs_cli import main as cli

# Every third-party import name the parts use, by distribution.
IMPORT_NAMES = {
    "confluent-kafka": "confluent_kafka",
    "prometheus-client": "prometheus_client",
    "tomli-w": "tomli_w",
    "pyyaml": "yaml",
    **{normalised(dist): name for name, dist in DISTRIBUTION_OF.items()},
}


def run_python(
    code: str, blocked: set[str] = frozenset(), *argv: str
) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter where importing a module of `blocked` fails as it does
    on a host without it."""
    prelude = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {sorted(blocked)!r}
        class Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Absent())
    """)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def modules_outside(extra: str) -> set[str]:
    """The import names of what the dev extra installs and `extra` (with the base) does not."""
    _, extras, _ = declared()
    return {IMPORT_NAMES.get(d, d.replace("-", "_")) for d in extras["dev"] - extras[extra]}


def test_version_imports_none_of_the_dependencies() -> None:
    _, extras, _ = declared()
    third_party = sorted(IMPORT_NAMES.get(d, d.replace("-", "_")) for d in extras["dev"])
    done = run_python(f"""
        from p4bs_cli.main import main
        try:
            main(["--version"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({third_party!r}))
        print("loaded:", loaded)
    """)
    assert done.returncode == 0, done.stderr
    version, loaded = done.stdout.splitlines()
    assert re.fullmatch(r"p4bs \S+( \(git [0-9a-f]{12}\))?", version), version
    assert loaded == "loaded: []"


def test_a_host_with_the_optimizer_extra_runs_its_commands_only() -> None:
    blocked = modules_outside("optimizer")
    assert {"pyflink", "starlette", "matplotlib", "pytest"} <= blocked
    done = run_python(
        """
        from p4bs_cli.main import main
        try:
            main(["optimizer", "run", "--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("dashboard exit", main(["dashboard"]))
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        """,
        blocked,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: p4bs optimizer run" in done.stdout and "--log-format" in done.stdout
    assert "dashboard exit 2" in done.stdout
    assert re.search(
        r"p4bs status/dashboard needs the Python package '(uvicorn|starlette)'", done.stderr
    )
    assert "pip install 'p4bs[ops]'" in done.stderr
    # --help lists a part whose command-line module cannot load with the extra it needs
    assert re.search(r"stack\s+\(not installed: needs the \[testbed\] extra\)", done.stdout)
    assert re.search(r"optimizer\s+decide and apply buffer sizes", done.stdout)


def test_without_the_extra_the_part_s_command_names_it() -> None:
    """The optimizer's policies need jenkspy: the command stops before it starts anything."""
    done = run_python(
        """
        from p4bs_cli.main import main
        print("exit", main(["optimizer", "run", "--config", sys.argv[1]]))
        """,
        {"jenkspy"},
        str(paths.example_config()),
    )
    assert "exit 2" in done.stdout, done.stderr
    assert "install the optimizer dependencies (pip install 'p4bs[optimizer]'" in done.stderr


def test_the_config_comes_from_the_environment_then_etc_then_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "etc" / "p4bs.toml"
    monkeypatch.setattr(paths, "SYSTEM_CONFIG", system)
    monkeypatch.delenv(paths.CONFIG_ENV, raising=False)
    assert paths.deployment_config() == paths.example_config()  # inside this checkout
    system.parent.mkdir()
    system.write_text(paths.example_config().read_text())
    assert paths.deployment_config() == system
    named = tmp_path / "named.toml"
    named.write_text(paths.example_config().read_text())
    monkeypatch.setenv(paths.CONFIG_ENV, str(named))
    assert paths.deployment_config() == named
    monkeypatch.setenv(paths.CONFIG_ENV, str(tmp_path / "gone.toml"))
    with pytest.raises(paths.NoConfigFile, match=r"\$P4BS_CONFIG names .*gone.toml"):
        paths.deployment_config()


def test_no_config_anywhere_is_an_error_naming_each_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(paths, "SYSTEM_CONFIG", tmp_path / "etc" / "p4bs.toml")
    monkeypatch.setenv("P4BS_HOME", str(tmp_path / "installed"))  # no checkout around
    monkeypatch.delenv(paths.CONFIG_ENV, raising=False)
    assert cli.main(["optimizer", "unfreeze"]) == 2
    err = capsys.readouterr().err
    for place in ("--config", "$P4BS_CONFIG", f"{tmp_path}/etc/p4bs.toml", "installed/config"):
        assert place in err, err


def test_a_command_reads_the_config_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`optimizer unfreeze` removes the freeze file of the config `$P4BS_CONFIG` names."""
    frozen = tmp_path / "frozen"
    frozen.write_text("change window\n")
    data = tomllib.loads(paths.example_config().read_text())
    data["optimizer"] = {**data.get("optimizer", {}), "freeze_file": str(frozen)}
    config = tmp_path / "p4bs.toml"
    config.write_text(tomli_w.dumps(data))
    monkeypatch.setenv(paths.CONFIG_ENV, str(config))
    assert cli.main(["optimizer", "unfreeze"]) == 0
    assert not frozen.exists()
    assert f"{frozen}: removed" in capsys.readouterr().out
