"""cli/README.md's subcommand table against the real command line: it names every subcommand
`p4bs` has, and none that it lacks (a part that adds, moves or drops a command without its row
fails here)."""

from __future__ import annotations

import argparse
import re

from test_systemd_units import subcommands

from p4bs import paths
from p4bs_cli.main import build_parser

README = paths.home() / "cli" / "README.md"
TABLE_HEADER = "| subcommand | owned by |"


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[str]:
    """Each runnable command as its words: `eval offline`, `demo`."""
    children = subcommands(parser)
    if not children:
        return {" ".join(prefix)}
    return set().union(*(command_paths(p, (*prefix, name)) for name, p in children.items()))


def table_commands(text: str) -> set[str]:
    """The commands of the table's first column: `stack up\\|down` is `stack up` and `stack
    down`, options in brackets are dropped. A row is split at its last cell only, so a `|`
    left unescaped inside the first column still reads."""
    lines = text.splitlines()
    start = lines.index(TABLE_HEADER) + 2  # after the header and its |---| line
    commands = set()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first_column = line.rstrip(" |").rsplit(" | ", 1)[0]
        for span in re.findall(r"`([^`]+)`", first_column):
            words = re.sub(r"\[[^]]*\]", "", span.replace("\\|", "|")).split()
            group, actions = words[0], "".join(words[1:])
            commands |= {f"{group} {a}" for a in actions.split("|")} if actions else {group}
    return commands


def test_the_table_reads_alternatives_and_drops_options() -> None:
    text = f"{TABLE_HEADER}\n|---|---|\n| `links apply [--prune]\\|list [--all]`, `demo` | here |\n"
    assert table_commands(text) == {"links apply", "links list", "demo"}


def test_every_subcommand_is_in_the_table_and_only_those() -> None:
    real = command_paths(build_parser())
    assert {"config check", "demo", "eval offline"} <= real  # the walk reaches every level
    table = table_commands(README.read_text())
    assert not real - table, f"cli/README.md lacks {sorted(real - table)}"
    assert not table - real, f"cli/README.md names commands p4bs lacks: {sorted(table - real)}"
