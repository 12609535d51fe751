"""The systemd units of ops/systemd and their environment file, read without starting anything.

Every unit has its sections, a restart policy, the p4bs user and the environment file; every
ExecStart is the installed p4bs command with the deployment's config, and its arguments parse
with the real command line (a unit naming a subcommand or option that does not exist fails
here, not on a production host). The variables the environment file template sets are exactly
those the example configs name by reference ({ env = "VAR" }) and the units use. The example
config of ops/DEPLOYING.md passes the config check, and every p4bs command the page shows
parses. Where systemd-analyze is installed, `systemd-analyze verify` checks the units as
systemd reads them.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from p4bs import paths
from p4bs.config import Config, SecretRef, load_config
from p4bs_cli.main import build_parser
from p4bs_optimizer.cli import check_policies

ROOT = paths.home()
UNITS_DIR = ROOT / "ops" / "systemd"
ENV_EXAMPLE = UNITS_DIR / "p4bs.env.example"
DEPLOYING = ROOT / "ops" / "DEPLOYING.md"

INSTALLED_P4BS = "/opt/p4bs/.venv/bin/p4bs"
CONFIG = "/etc/p4bs/p4bs.toml"
ENV_FILE = "-/etc/p4bs/p4bs.env"
EXPECTED_UNITS = {
    "p4bs-exporter@.service",
    "p4bs-metrics-job.service",
    "p4bs-influx-sink.service",
    "p4bs-alerts.service",
    "p4bs-optimizer@.service",
    "p4bs-dashboard.service",
}
SAMPLE_INSTANCE = "sw1"

# A variable set in the env file: `NAME=value`, or commented out as `#NAME=value` (prose
# comments start with "# ").
ENV_ASSIGNMENT = re.compile(r"^#?([A-Za-z_][A-Za-z0-9_]*)=")
# A credential named by reference in a config's TOML (`password = { env = "VAR" }`),
# commented-out examples included.
ENV_REFERENCE = re.compile(r"\b\w+\s*=\s*\{\s*env\s*=\s*\"([A-Za-z_][A-Za-z0-9_]*)\"\s*\}")
# A variable a unit's command line expands: $NAME or ${NAME}.
UNIT_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# systemd's prefixes of an Exec line: ignore failure, argv[0], full privileges, ...
EXEC_PREFIXES = "-@:+!"


@dataclass
class Unit:
    path: Path
    # section -> key -> values in order (a key may repeat; an empty value resets the list)
    sections: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def value(self, section: str, key: str) -> str | None:
        found = self.values(section, key)
        return found[-1] if found else None

    @property
    def template(self) -> bool:
        return self.path.name.endswith("@.service")


def parse_unit(path: Path) -> Unit:
    """A unit file as systemd reads it: `[Section]` headers, `Key=Value` lines, comments
    starting with # or ;, a trailing backslash continuing a line, repeated keys adding to a
    list and an empty assignment resetting it."""
    unit = Unit(path)
    section: dict[str, list[str]] | None = None
    logical: list[tuple[int, str]] = []
    pending = ""
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((number, pending + line))
        pending = ""
    assert not pending, f"{path.name}: the last line ends with a continuation backslash"
    for number, line in logical:
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}:{number}: a bad section header {line!r}"
            name = line[1:-1]
            assert name not in unit.sections, f"{path.name}:{number}: [{name}] given twice"
            section = unit.sections[name] = {}
            continue
        assert section is not None, f"{path.name}:{number}: a setting before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not Key=Value: {line!r}"
        key, value = key.strip(), value.strip()
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key), f"{path.name}:{number}: key {key!r}"
        if value:
            section.setdefault(key, []).append(value)
        else:
            section[key] = []
    return unit


def unit_paths() -> list[Path]:
    return sorted(UNITS_DIR.glob("*.service"))


def units() -> list[Unit]:
    return [parse_unit(path) for path in unit_paths()]


def expand_specifiers(text: str, unit: Unit) -> str:
    """A command line with its specifiers replaced: %i by a sample instance name, %% by %.
    Any other specifier is refused, so a unit cannot lean on one this test does not know."""

    def one(match: re.Match[str]) -> str:
        spec = match.group(1)
        if spec == "%":
            return "%"
        if spec == "i":
            assert unit.template, f"{unit.path.name}: %i in a unit that is not a template"
            return SAMPLE_INSTANCE
        raise AssertionError(f"{unit.path.name}: specifier %{spec} in {text!r}")

    return re.sub(r"%(.)", one, text)


def exec_argv(unit: Unit, line: str) -> list[str]:
    command = line.lstrip(EXEC_PREFIXES)
    return shlex.split(expand_specifiers(command, unit))


def test_the_units_are_the_ones_the_deployment_page_describes() -> None:
    found = {path.name for path in unit_paths()}
    assert found == EXPECTED_UNITS
    page = DEPLOYING.read_text()
    for name in found | {ENV_EXAMPLE.name}:
        assert name in page, f"ops/DEPLOYING.md does not mention {name}"


@pytest.mark.parametrize("path", unit_paths(), ids=lambda p: p.name)
def test_a_unit_has_its_sections_user_environment_and_restart_policy(path: Path) -> None:
    unit = parse_unit(path)
    assert {"Unit", "Service", "Install"} <= set(unit.sections), path.name
    assert unit.value("Unit", "Description")
    assert unit.value("Install", "WantedBy") == "multi-user.target"
    assert "network-online.target" in " ".join(unit.values("Unit", "After"))
    assert "network-online.target" in " ".join(unit.values("Unit", "Wants"))
    assert unit.value("Service", "User") == "p4bs"
    assert unit.values("Service", "EnvironmentFile") == [ENV_FILE]
    assert unit.value("Service", "Restart") == "on-failure"
    restart_sec = unit.value("Service", "RestartSec")
    assert restart_sec is not None and re.fullmatch(r"[1-9][0-9]*s", restart_sec), restart_sec
    # Exit code 2 is a bad config in every p4bs service: restarting cannot mend it.
    assert unit.value("Service", "RestartPreventExitStatus") == "2"
    assert unit.value("Service", "NoNewPrivileges") == "yes"
    assert unit.value("Service", "ProtectSystem") == "strict"
    assert unit.value("Service", "PrivateTmp") == "yes"
    # Only the exporter (AF_PACKET sockets on a model switch's taps) keeps a capability.
    wanted = "CAP_NET_RAW" if path.name == "p4bs-exporter@.service" else None
    assert unit.value("Service", "CapabilityBoundingSet") == wanted
    assert unit.value("Service", "AmbientCapabilities") == wanted
    starts = unit.values("Service", "ExecStart")
    assert len(starts) == 1, f"{path.name}: one ExecStart, got {starts}"
    if unit.template:
        assert "%i" in starts[0], f"{path.name}: a template whose command ignores its instance"


@pytest.mark.parametrize("path", unit_paths(), ids=lambda p: p.name)
def test_exec_start_is_a_p4bs_command_the_real_parser_takes(path: Path) -> None:
    unit = parse_unit(path)
    for line in unit.values("Service", "ExecStart"):
        argv = exec_argv(unit, line)
        assert argv[0] == INSTALLED_P4BS, f"{path.name}: runs {argv[0]}"
        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit as exc:  # argparse has printed why on stderr
            raise AssertionError(f"{path.name}: p4bs refuses {argv[1:]}") from exc
        # The config from the environment the unit sets (p4bs.env may name another).
        assert args.config is None, f"{path.name}: --config {args.config}"
        assert f"P4BS_CONFIG={CONFIG}" in unit.values("Service", "Environment"), path.name
        assert callable(args.func)


def test_each_service_runs_the_subcommand_it_is_named_for() -> None:
    expected = {
        "p4bs-exporter@.service": ["exporter", "run", "--switch", SAMPLE_INSTANCE],
        "p4bs-metrics-job.service": ["jobs", "submit", "--resume"],
        "p4bs-influx-sink.service": ["sinks", "influx"],
        "p4bs-alerts.service": ["sinks", "alerts"],
        "p4bs-optimizer@.service": ["optimizer", "run", "--instance", SAMPLE_INSTANCE],
        "p4bs-dashboard.service": ["dashboard", "--bind", "127.0.0.1"],
    }
    for unit in units():
        argv = exec_argv(unit, unit.values("Service", "ExecStart")[0])
        want = expected[unit.path.name]
        assert argv[1:3] == want[:2], unit.path.name
        rest = argv[3:]
        for option in want[2:]:
            assert option in rest, f"{unit.path.name}: {option} not in {rest}"


def test_the_metrics_job_is_submitted_once_and_stays_active() -> None:
    """`p4bs jobs submit` returns once the cluster has the job: a oneshot that stays active."""
    unit = parse_unit(UNITS_DIR / "p4bs-metrics-job.service")
    assert unit.value("Service", "Type") == "oneshot"
    assert unit.value("Service", "RemainAfterExit") == "yes"
    argv = exec_argv(unit, unit.values("Service", "ExecStart")[0])
    args = build_parser().parse_args(argv[1:])
    assert args.resume and not args.bounded
    assert args.checkpoints is not None, "the checkpoints must not default into /opt/p4bs"


def test_what_a_service_writes_is_outside_the_read_only_install() -> None:
    """ProtectSystem=strict leaves /opt/p4bs read-only: the exporter's stats go to its state
    directory, and the job's checkpoint folder is given, not the default under the install."""
    for unit in units():
        argv = exec_argv(unit, unit.values("Service", "ExecStart")[0])
        args = build_parser().parse_args(argv[1:])
        for name in ("stats", "checkpoints"):
            where = getattr(args, name, None)
            if where is None:
                continue
            assert not str(where).startswith("/opt/"), f"{unit.path.name}: --{name} {where}"
        if getattr(args, "stats", None) is not None:
            state = [d.split() for d in unit.values("Service", "StateDirectory")]
            assert any(str(args.stats).startswith(f"/var/lib/{d}/") for s in state for d in s)


def env_example_variables() -> set[str]:
    found = set()
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = ENV_ASSIGNMENT.match(line)
        if match:
            found.add(match.group(1))
    return found


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown text: (info string, body), indented ones too."""
    blocks = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if info is None:
            if stripped.startswith("```"):
                info, body = stripped[3:].strip(), []
        elif stripped == "```":
            blocks.append((info, "\n".join(body) + "\n"))
            info = None
        else:
            body.append(stripped)
    assert info is None, "an unclosed code block"
    return blocks


def deploying_toml_blocks() -> list[str]:
    return [body for info, body in fenced_blocks(DEPLOYING.read_text()) if info == "toml"]


def example_config(tmp_path: Path) -> Config:
    """The complete example config of ops/DEPLOYING.md (the block with [kafka])."""
    blocks = [b for b in deploying_toml_blocks() if "[kafka]" in b and "[[links]]" in b]
    assert len(blocks) == 1, "ops/DEPLOYING.md should hold one complete example config"
    path = tmp_path / "p4bs.toml"
    path.write_text(blocks[0])
    return load_config(path)


def secret_env_names(config: Config) -> set[str]:
    refs: list[SecretRef | None] = [
        config.kafka.username,
        config.kafka.password,
        config.influxdb.username,
        config.influxdb.password,
    ]
    for router in config.routers:
        refs += [router.username, router.password]
    return {ref.env for ref in refs if ref is not None and ref.env is not None}


def test_the_deploying_example_config_passes_the_config_check(tmp_path: Path) -> None:
    config = example_config(tmp_path)
    assert check_policies(config) == []
    assert config.flink.mode == "remote"
    assert {s.target for s in config.switches} == {"tofino", "model"}
    for block in deploying_toml_blocks():
        tomllib.loads(block)  # every fragment the page shows is TOML


def test_the_env_example_sets_exactly_the_variables_configs_and_units_name(
    tmp_path: Path,
) -> None:
    named: dict[str, str] = {}
    for toml in sorted((ROOT / "config").glob("*.toml")):
        for name in ENV_REFERENCE.findall(toml.read_text()):
            named.setdefault(name, f"config/{toml.name}")
    for block in deploying_toml_blocks():
        for name in ENV_REFERENCE.findall(block):
            named.setdefault(name, "ops/DEPLOYING.md")
    for name in secret_env_names(example_config(tmp_path)):
        named.setdefault(name, "ops/DEPLOYING.md")
    for unit in units():
        own = {
            assignment.split("=", 1)[0]
            for line in unit.values("Service", "Environment")
            for assignment in shlex.split(line)
        }
        for values in unit.sections.get("Service", {}).values():
            for value in values:
                for braced, bare in UNIT_VARIABLE.findall(value):
                    name = braced or bare
                    if name not in own:
                        named.setdefault(name, unit.path.name)
    defined = env_example_variables()
    assert defined, "the env example defines no variable"
    missing = {name: where for name, where in named.items() if name not in defined}
    assert not missing, f"named but not in {ENV_EXAMPLE.name}: {missing}"
    unused = defined - set(named)
    assert not unused, f"{ENV_EXAMPLE.name} sets variables nothing names: {sorted(unused)}"


def test_the_env_example_holds_no_value() -> None:
    """A template: every assignment is commented out and empty or a user name placeholder,
    so that copying it unchanged leaves every credential unset (a clear error at start)."""
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = ENV_ASSIGNMENT.match(line)
        if not match:
            assert not line or line.startswith("# ") or line == "#", line
            continue
        assert line.startswith("#"), f"an active assignment in the template: {line!r}"
        if "PASSWORD" in match.group(1):
            assert line.endswith("="), f"a password value in the template: {line!r}"


def page_commands() -> list[list[str]]:
    """Every p4bs command in the page's shell blocks, as its arguments after the program."""
    commands = []
    shell = [b for info, b in fenced_blocks(DEPLOYING.read_text()) if info in {"sh", "", "bash"}]
    for block in shell:
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for i, word in enumerate(words):
                if (i == 0 and word == "p4bs") or word.endswith("/bin/p4bs"):
                    argv = []
                    for arg in words[i + 1 :]:
                        if arg in {"|", "||", "&&", ";", ">", ">>", "2>&1"}:
                            break
                        argv.append(arg)
                    commands.append(argv)
                    break
    return commands


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_p4bs_command_the_page_shows_exists() -> None:
    """The commands of its shell blocks parse whole; a command named in the text (`p4bs jobs
    submit --resume`) names an existing subcommand and options it has."""
    known = set(subcommands(build_parser()))
    commands = page_commands()
    assert len(commands) >= 5
    for argv in commands:
        if argv and argv[0] == "status" and "status" not in known:
            continue  # `p4bs status` (ops/) may not be wired into this checkout yet
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"ops/DEPLOYING.md: p4bs refuses {argv}") from exc
    mentions = re.findall(r"`(?:p4bs|/opt/p4bs/\.venv/bin/p4bs) ([^`]+)`", DEPLOYING.read_text())
    assert len(mentions) >= 10
    for mention in mentions:
        words = shlex.split(mention)
        if words[0] == "status" and "status" not in known:
            continue
        parser, path = build_parser(), []
        for word in words:
            choices = subcommands(parser)
            if word.startswith("-") or word not in choices:
                break
            parser = choices[word]
            path.append(word)
        assert path and not subcommands(parser), f"ops/DEPLOYING.md: `p4bs {mention}`"
        for word in words:
            option = word.split("=", 1)[0]
            if option.startswith("--"):
                assert option in parser._option_string_actions, f"`p4bs {mention}`: {option}"


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here; the units were only parsed")
    # The units as installed, but running this checkout's p4bs (verify checks that the
    # command exists and is executable); each template verified through an instance.
    here = str(Path(sys.executable).parent / "p4bs")
    names = []
    for path in unit_paths():
        (tmp_path / path.name).write_text(path.read_text().replace(INSTALLED_P4BS, here))
        names.append(path.name.replace("@.", f"@{SAMPLE_INSTANCE}."))
    result = subprocess.run(
        [analyze, "verify", "--man=no", *(str(tmp_path / name) for name in names)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    # Warnings (an unknown key, a value systemd ignores) do not change the exit code.
    ours = [line for line in output.splitlines() if "p4bs" in line]
    assert result.returncode == 0 and not ours, output
