"""Optimizer processes of one consumer group share the links and hand them over through
Kafka: `p4bs optimizer run` processes (dry run: they decide and record, no router) on
synthetic windows of twelve links, while one is killed, one added, one stalled past its
session timeout (a zombie) and one stopped."""

from __future__ import annotations

import signal
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from manylinks import Windows, many_links_config
from optimizerproc import Decisions, optimizer

from p4bs.bus import ensure_topics, read_partitions
from p4bs.config import Config, load_config
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_optimizer.policies import policy_for
from p4bs_optimizer.policies.base import Window
from p4bs_schemas.registry import STREAMS

LINKS = 12
PARTITIONS = 4
START_BUFFER = 500_000  # the buffer the windows' metrics follow (ADT, in a dry run, starts
# from the link's safe buffer: it applies nothing, so no buffer is known in force)
# ADT deciding on every window: each one steps its buffer by 1% (a window decided twice or
# not at all leaves a different buffer, and a different list of decisions).
ADT = '{ tolerance = 0.0, sample_period_ns = "100ms" }'


def expected_decisions(
    config: Config, windows: dict[str, list[dict[str, Any]]]
) -> dict[str, list[int]]:
    """Each link's buffers as one ADT deciding every window once, in order, decides them."""
    expected = {}
    for link in config.links:
        policy = policy_for(link)
        decided = (policy.decide(Window.from_record(w, None)) for w in windows[link.id])
        expected[link.id] = [d.buffer_bytes for decisions in decided for d in decisions]
    return expected


def changelog(config: Config) -> list[dict[str, Any]]:
    """Every state record written, in each partition's order."""
    received, malformed = read_partitions(
        config.kafka.bootstrap,
        "optimizer_state",
        config.kafka.topics,
        range(PARTITIONS),
        timeout_s=30,
    )
    assert not malformed
    return [r.record for r in received]


def owners(config: Config) -> dict[str, str]:
    """Each link's owner, as its newest state record says."""
    return {r["link_id"]: r["owner"] for r in changelog(config)}


def test_processes_share_links_and_hand_them_over_when_killed_added_stalled_and_stopped(
    stack: Stack, tmp_path: Path
) -> None:
    """Three processes take the twelve links (four partitions). Then, with windows flowing
    all along: A is killed (SIGKILL), D added, C stalled (SIGSTOP) for longer than its
    session timeout and let go on (SIGCONT), B stopped (SIGTERM). Afterwards every link's
    decision records are exactly the decisions one ADT makes on its windows, each once, in
    order: no window lost or decided twice across four handovers; each link's state
    records show one owner at a time (an owner's epoch never comes back once the next one
    began), and each decision names the owner and epoch of its link then; no process fell
    back to the safe buffer (the stalled one, once let go on, finds its links gone and
    writes nothing for them); and A's links are decided again by others within seconds."""
    run = uuid.uuid4().hex[:6]
    topics = {stream: f"group-{run}.{stream}" for stream in STREAMS}
    ensure_topics(stack.kafka.bootstrap, topics, partitions=PARTITIONS, replication_factor=1)
    path = many_links_config(
        tmp_path / "config.toml", stack.kafka.bootstrap, topics, list(range(LINKS)), "adt", ADT
    )
    config = load_config(path)
    group = config.optimizer.group
    names = {x: f"{group}-{x}" for x in "ABCD"}
    decisions = Decisions(config)

    def instance(x: str) -> Any:
        return optimizer(path, "--dry-run", "--instance", names[x], log=tmp_path / f"{x}.log")

    def all_owned_by(allowed: set[str]) -> bool:
        current = owners(config)
        return len(current) == LINKS and set(current.values()) <= {names[x] for x in allowed}

    with (
        Windows(config.kafka.bootstrap, topics, config.links, START_BUFFER, PARTITIONS) as windows,
        instance("A") as a,
        instance("B") as b,
        instance("C") as c,
    ):
        # Three owners can show before every link has a state: a link's first is saved
        # within a second of its first window, by whoever holds its partition then.
        assert wait_until(
            lambda: len(set(owners(config).values())) == 3 and all_owned_by({"A", "B", "C"}), 90
        ), owners(config)
        a_links = {link for link, owner in owners(config).items() if owner == names["A"]}
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed = time.monotonic()
        assert wait_until(lambda: all_owned_by({"B", "C"}), 60), owners(config)
        handed_over_s = time.monotonic() - killed
        with instance("D"):
            assert wait_until(lambda: names["D"] in owners(config).values(), 60)
            c.send_signal(signal.SIGSTOP)
            try:
                assert wait_until(lambda: all_owned_by({"B", "D"}), 60), owners(config)
            finally:
                c.send_signal(signal.SIGCONT)
            assert wait_until(lambda: len(set(owners(config).values())) == 3, 60)
            b.send_signal(signal.SIGTERM)
            assert b.wait(30) == 0
            assert wait_until(lambda: all_owned_by({"C", "D"}), 60), owners(config)
            windows.stop()
            last_end = {link: w[-1]["window_end_ns"] for link, w in windows.sent.items()}
            assert wait_until(
                lambda: all(
                    r["last_window_end_ns"] == last_end[r["link_id"]]
                    for r in {r["link_id"]: r for r in changelog(config)}.values()
                ),
                60,
            )
    expected = expected_decisions(config, windows.sent)
    total = sum(len(e) for e in expected.values())
    wait_until(lambda: len(decisions.read()) >= total, 30)
    decisions.read()  # and any more (the processes have stopped: all is written)
    decisions.close()
    got: dict[str, list[int]] = defaultdict(list)
    for record in decisions.records:
        got[record["link_id"]].append(record["buffer_bytes"])
    differ = {
        link: (
            len(got[link]),
            len(e),
            next((i for i, (g, x) in enumerate(zip(got[link], e, strict=False)) if g != x), None),
        )
        for link, e in expected.items()
        if got[link] != e
    }
    assert not differ, f"link: (decisions, expected, first difference at) {differ}"
    assert {r["outcome"] for r in decisions.records} <= {"dry_run", "skipped"}
    assert not any(r["phase"] == "fallback" for r in decisions.records)

    history: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for record in changelog(config):
        history[record["link_id"]].append((record["epoch"], record["owner"]))
    for link, states in history.items():
        epochs = [e for e, _ in states]
        assert epochs == sorted(epochs), (link, states)
        assert len({e for e, _ in states}) == len(set(states)), (link, states)  # one owner each
    # Each decision names the owner and epoch it was made in: the link's owner then.
    owner_of = {(link, e): o for link, states in history.items() for e, o in states}
    epochs_seen: dict[str, list[int]] = defaultdict(list)
    for record in decisions.records:
        assert owner_of[(record["link_id"], record["epoch"])] == record["owner"], record
        assert record["window_end_ns"] is not None
        epochs_seen[record["link_id"]].append(record["epoch"])
    assert all(e == sorted(e) for e in epochs_seen.values())
    moved = {link for link in a_links if len({o for _, o in history[link]}) > 1}
    assert moved == a_links
    print(f"A's {len(a_links)} links owned by B and C {handed_over_s:.1f} s after the kill")
    assert handed_over_s < 30
