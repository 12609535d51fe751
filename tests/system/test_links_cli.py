"""`p4bs links apply|list`: the links topic made to say what a config's [[links]] say, new and
changed links published, unchanged ones left, others removed only with --prune, and a config
with a problem refused with nothing published; and a running optimizer following it, passing
over a record for an interface its router does not let p4bs manage."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manylinks import Windows, many_links_config
from optimizerproc import Decisions, optimizer

from p4bs.bus import RecordProducer, read_stream
from p4bs.config import load_config
from p4bs.links import spec_record
from p4bs_infra.stack import Stack

ADT = '{ tolerance = 0.0, sample_period_ns = "100ms" }'  # a decision on every window


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


def test_the_optimizer_follows_the_links_topic_without_a_restart(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    """An optimizer started with eth0 and eth1 (ADT deciding on every window), windows flowing
    for eth0-eth2:
    `links apply` adding eth2 and giving eth0 the BDP rule, then removing eth0 (--prune):
    eth2's decisions begin, eth0's come from BDP and then stop, all in the one process."""
    bootstrap = stack.kafka.bootstrap
    started = many_links_config(tmp_path / "a.toml", bootstrap, topics, [0, 1], "adt", ADT)
    every = many_links_config(tmp_path / "all.toml", bootstrap, topics, [0, 1, 2], "adt", ADT)
    config = load_config(started)
    decisions = Decisions(config)

    def by(link: str, policy: str, after_ns: int = 0) -> Callable[[list[dict[str, Any]]], bool]:
        return lambda records: any(
            r["link_id"] == link and r["policy"] == policy and r["ts_ns"] > after_ns
            for r in records
        )

    changed = many_links_config(tmp_path / "b.toml", bootstrap, topics, [0, 1, 2], "adt", ADT)
    adt = f'policy = "adt"\npolicy_options = {ADT}'
    changed.write_text(changed.read_text().replace(adt, 'policy = "bdp"', 1))  # eth0's
    pruned = many_links_config(tmp_path / "c.toml", bootstrap, topics, [1, 2], "adt", ADT)
    links_now = load_config(every).links
    # A links-topic record for an interface the router does not let p4bs manage (the
    # example's r1 lists eth*): passed over, though its windows come.
    intruder = dataclasses.replace(links_now[2], interface="xe9")
    entry = {**tomllib.loads(every.read_text())["links"][2], "interface": "xe9"}
    log = tmp_path / "optimizer.log"
    windows = Windows(bootstrap, topics, [*links_now, intruder], 200_000, 2)
    with windows, optimizer(started, "--dry-run", log=log):
        decisions.until(lambda r: by("r1:eth0", "adt")(r) and by("r1:eth1", "adt")(r), 90)
        assert not any(r["link_id"] == "r1:eth2" for r in decisions.records)
        producer = RecordProducer(bootstrap, topics, client_id="intruder")
        producer.produce("links", spec_record(intruder, entry, time.time_ns()))
        assert producer.flush(10) == 0
        assert links("apply", "--config", str(changed)).returncode == 0
        decisions.until(lambda r: by("r1:eth2", "adt")(r) and by("r1:eth0", "bdp")(r), 60)
        assert links("apply", "--config", str(pruned), "--prune").returncode == 0
        pruned_ns = time.time_ns()
        # eth0's windows keep coming; once the removal is read, nothing is decided for it.
        decisions.until(by("r1:eth2", "adt", pruned_ns + 2_000_000_000), 60)
    assert not any(r["link_id"] == "r1:xe9" for r in decisions.records)
    assert "link r1:xe9 from the links topic passed over" in log.read_text()
    assert "does not let p4bs manage 'xe9'" in log.read_text()
    eth0 = [r for r in decisions.records if r["link_id"] == "r1:eth0"]
    assert max(r["ts_ns"] for r in eth0) < pruned_ns + 2_000_000_000
    switched = next(i for i, r in enumerate(eth0) if r["policy"] == "bdp")
    assert {r["policy"] for r in eth0[:switched]} == {"adt"}
    assert {r["policy"] for r in eth0[switched:]} == {"bdp"}  # BDP from the change on
    decisions.close()
