"""`p4bs links apply|list`: the links topic made to say what a config's [[links]] say, new and
changed links published, unchanged ones left, others removed only with --prune, and a config
with a problem refused with nothing published."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from manylinks import many_links_config

from p4bs.bus import read_stream
from p4bs_infra.stack import Stack


def links(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "p4bs_cli", "links", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_apply_publishes_what_changed_and_prunes_only_when_asked(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    bootstrap = stack.kafka.bootstrap
    first = many_links_config(tmp_path / "a.toml", bootstrap, topics, [0, 1, 2], "globecom")
    done = links("apply", "--config", str(first))
    assert done.returncode == 0, done.stderr
    assert "3 added, 0 changed, 0 removed, 0 unchanged" in done.stdout

    # eth0 at another rate, eth1 as it was, eth2 left out, eth3 new.
    second = many_links_config(
        tmp_path / "b.toml", bootstrap, topics, [0, 1, 3], "globecom", capacities={0: "1Gbit"}
    )
    done = links("apply", "--config", str(second))
    assert done.returncode == 0, done.stderr
    assert "1 added, 1 changed, 0 removed, 1 unchanged" in done.stdout
    listed = links("list", "--config", str(second))
    assert "r1:eth2: 100 Mbit/s" in listed.stdout and "4 links (0 removed)" in listed.stdout
    assert "r1:eth0: 1000 Mbit/s, policy globecom" in listed.stdout

    done = links("apply", "--config", str(second), "--prune")
    assert "0 added, 0 changed, 1 removed, 3 unchanged" in done.stdout
    listed = links("list", "--config", str(second), "--all")
    assert "r1:eth2: 100 Mbit/s, policy globecom, d-hat 10 ms, p-hat 0.01 (removed)" in (
        listed.stdout
    )
    assert "3 links (1 removed)" in listed.stdout

    records = read_stream(bootstrap, "links", topics)
    broken = tmp_path / "broken.toml"
    broken.write_text(first.read_text().replace('capacity = "100Mbit"', 'capacity = "fast"', 1))
    done = links("apply", "--config", str(broken))
    assert done.returncode == 1 and "links[0].capacity" in done.stderr
    assert len(read_stream(bootstrap, "links", topics)) == len(records)  # nothing published
