"""The optimizer feed ([metrics] optimizer_feed, streaming-jobs/README.md): the metrics job's
rule for which windows of a thinned link can matter (OptimizerFeed, from the functions jar `make
build` makes, against its Python twin tests/feedrule.py), the optimizer's side (which policies
may be thinned, and a link of another refused), and GLOBECOM deciding on the thinned windows as
on every window, at most a heartbeat late."""

from __future__ import annotations

import base64
import dataclasses
import random
import tomllib
from pathlib import Path
from typing import Any

from feedrule import heartbeat_offset_ns, passes, thinned
from jarharness import run_harness
from test_policies import T0, WINDOW_NS, window

from p4bs import paths
from p4bs.config import FEED_POLICIES, Config, LinkConfig, load_config
from p4bs.links import spec_record
from p4bs_jobs.metrics import link_metrics_parameter
from p4bs_optimizer.cli import check_policies
from p4bs_optimizer.policies import POLICIES
from p4bs_optimizer.policies.base import Decision, Window
from p4bs_optimizer.policies.baselines import AdtPolicy, BsclPolicy, StepPolicy, _TargetPolicy
from p4bs_optimizer.policies.globecom import GlobecomPolicy
from p4bs_optimizer.service import OptimizerService
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.feed import WINDOW_IN_HAND_POLICIES
from p4bs_optimizer.service.links_follower import LinksFollower
from p4bs_optimizer.service.stats import ServiceStats

HARNESS = Path(__file__).parents[1] / "java" / "OptimizerFeedRule.java"
MS = 1_000_000
SECOND = 1_000_000_000
DEADBAND, HEARTBEAT_NS = 0.02, SECOND
# test_policies's windows are r1:eth1's: its id's CRC-32 modulo 1 s is 641,434,235 ns, so its
# heartbeats fall in window 6 of each second from T0 (a whole second), (T0 + 600 ms, T0 + 700 ms].
BEAT_OFFSET_NS, BEAT_WINDOW = 641_434_235, 6


def record(index: int, **fields: Any) -> dict[str, Any]:
    """LinkMetrics record `index` of 100 ms windows from T0 (test_policies's window: SRTT 20
    ms, RTT_min 18 ms, N = 50), fields overridden."""
    return dataclasses.asdict(window(index)) | fields


def _java_rule(
    cases: list[tuple[dict[str, Any] | None, dict[str, Any], bool]], tmp_path: Path, policies: str
) -> tuple[list[bool], str]:
    """OptimizerFeed's answer for each (previous, window, alert), thinning `policies`, and
    whether each of GLOBECOM, p4bs and jenks is thinned."""

    def text(value: int | None) -> str:
        return "-" if value is None else str(value)

    lines = []
    for previous, now, alert in cases:
        before = previous or now  # a first window's previous values are not read
        fields = (
            now["link_id"],
            int(previous is None),
            before["long_flows"],
            now["long_flows"],
            text(before["srtt_ns"]),
            text(now["srtt_ns"]),
            text(before["rtt_min_ns"]),
            text(now["rtt_min_ns"]),
            int(now["change"]),
            int(alert),
            now["window_start_ns"],
            now["window_end_ns"],
        )
        lines.append(" ".join(map(str, fields)))
    args = [repr(DEADBAND), str(HEARTBEAT_NS), policies, "globecom,p4bs,jenks"]
    out = run_harness(HARNESS, "OptimizerFeedRule", args, lines, tmp_path).split()
    return [v == "1" for v in out[:-1]], out[-1]


def test_the_jobs_rule_passes_exactly_the_windows_that_can_matter(tmp_path: Path) -> None:
    assert heartbeat_offset_ns("r1:eth1", HEARTBEAT_NS) == BEAT_OFFSET_NS
    base = record(1)  # (T0 + 100 ms, T0 + 200 ms]: no heartbeat
    srtt = base["srtt_ns"]
    cases: list[tuple[dict[str, Any] | None, dict[str, Any], bool, bool, str]] = [
        (None, base, False, True, "a link's first window"),
        (base, base, False, False, "nothing moved"),
        (base, base | {"long_flows": 11}, False, True, "N changed"),
        (base, base | {"long_flows": 0}, False, True, "N fell to 0"),
        (base, base | {"srtt_ns": srtt + srtt // 50}, False, False, "SRTT moved 2%: the deadband"),
        (base, base | {"srtt_ns": srtt + srtt // 50 + 1}, False, True, "SRTT moved past 2%"),
        (base, base | {"srtt_ns": srtt - srtt // 40}, False, True, "SRTT fell 2.5%"),
        (base | {"srtt_ns": None}, base, False, True, "the first SRTT"),
        (base, base | {"srtt_ns": None}, False, True, "SRTT gone"),
        (base | {"srtt_ns": None}, base | {"srtt_ns": None}, False, False, "no SRTT in either"),
        (base, base | {"rtt_min_ns": 17 * MS}, False, True, "RTT_min fell 5.6%"),
        (base, base | {"rtt_min_ns": 18 * MS + 1}, False, False, "RTT_min moved 1 ns"),
        (base, base | {"rtt_min_ns": None}, False, True, "RTT_min gone"),
        (base, base | {"change": True}, False, True, "the change flag"),
        (base, base, True, True, "an SLA alert raised or resolved"),
        (base, record(BEAT_WINDOW), False, True, "the window holding the link's heartbeat"),
        (base, record(BEAT_WINDOW + 1), False, False, "the window after it"),
        (base, record(9), False, False, "the window ending on a whole second"),
        (
            base | {"link_id": "r1:eth2"},
            record(1, link_id="r1:eth2"),
            False,
            True,
            "another link's heartbeat, elsewhere in the second (175 ms)",
        ),
        (
            base | {"link_id": "r1:eth2"},
            record(BEAT_WINDOW, link_id="r1:eth2"),
            False,
            False,
            "another link in the first link's heartbeat window",
        ),
        (base, record(10, window_end_ns=T0 + 2 * SECOND + 1), False, True, "a long window"),
        (
            base,
            base | {"rtt_hmean_ns": 40 * MS, "f": -5.0, "loss_rate": 0.5},
            False,
            False,
            "what the thinned policies do not read",
        ),
    ]
    got, thins = _java_rule([(p, w, a) for p, w, a, _, _ in cases], tmp_path, "globecom,bdp")
    want = [expected for *_, expected, _ in cases]
    assert [why for (*_, why), g, w in zip(cases, got, want, strict=True) if g != w] == [], got
    # The Python twin the system test recomputes the job's feed with agrees on each.
    twin = [
        passes(p, w, alert=a, deadband=DEADBAND, heartbeat_ns=HEARTBEAT_NS) for p, w, a, *_ in cases
    ]
    assert twin == want
    assert thins == "100"  # globecom thinned; p4bs and jenks get every window

    # And on random windows near the deadband and the heartbeat.
    rng = random.Random(41)
    drawn = []
    for i in range(2000):

        def values() -> dict[str, Any]:
            rtt = rng.choice([None, rng.randrange(10 * MS, 11 * MS)])
            return {
                "srtt_ns": rtt,
                "rtt_min_ns": rng.choice([None, 9 * MS, 9 * MS + rng.randrange(400_000)]),
                "long_flows": rng.choice([3, 3, 4]),
                "change": rng.random() < 0.05,
            }

        link = {"link_id": rng.choice(["r1:eth1", "r2:eth7", "r9:xe-0/0/3"])}
        window = record(i) | values() | link
        previous = None if i == 0 else record(i - 1) | values() | link
        drawn.append((previous, window, rng.random() < 0.05))
    got, _ = _java_rule(drawn, tmp_path, "globecom")
    twin = [
        passes(p, w, alert=a, deadband=DEADBAND, heartbeat_ns=HEARTBEAT_NS) for p, w, a in drawn
    ]
    assert got == twin
    assert 0.2 < sum(got) / len(got) < 0.95  # both kinds well represented


def test_the_policies_thinned_by_default_decide_on_the_window_in_hand() -> None:
    """Each is a policy whose decision depends on the window in hand and its own last
    decision only: GLOBECOM (SRTT and N against those it last computed with) or a target rule
    (`_TargetPolicy`) other than BSCL (the queueing delay, which the feed does not watch), ADT
    (pools windows' utilisation) and step (the traffic's start)."""
    assert frozenset(FEED_POLICIES) == WINDOW_IN_HAND_POLICIES
    for name in WINDOW_IN_HAND_POLICIES:
        cls = POLICIES[name]
        target_rule = issubclass(cls, _TargetPolicy) and not issubclass(
            cls, BsclPolicy | AdtPolicy | StepPolicy
        )
        assert cls is GlobecomPolicy or target_rule, name
    assert {"p4bs", "loss-delay-fit", "jenks", "bscl", "adt", "step"}.isdisjoint(
        WINDOW_IN_HAND_POLICIES
    )


def _config(**metrics: Any) -> Config:
    config = load_config(paths.example_config())
    return dataclasses.replace(config, metrics=dataclasses.replace(config.metrics, **metrics))


def _with_policy(config: Config, policy: str) -> Config:
    (link,) = config.links
    return dataclasses.replace(config, links=(dataclasses.replace(link, policy=policy),))


def test_a_link_whose_policy_needs_every_window_is_refused_in_a_thinned_feed() -> None:
    thinning_p4bs = _config(optimizer_feed=True, feed_policies=("globecom", "p4bs"))
    (problem,) = check_policies(thinning_p4bs)  # the example's link is a p4bs link
    assert problem.startswith("link r1:eth1: policy 'p4bs' needs every window")
    # Thinned but a policy of the window in hand, not thinned, or no feed: no problem.
    assert check_policies(_with_policy(thinning_p4bs, "globecom")) == []
    assert check_policies(_config(optimizer_feed=True)) == []
    assert check_policies(_config(feed_policies=("p4bs",))) == []


def test_the_service_reads_its_windows_from_the_feed_when_it_is_on() -> None:
    """Its consumer's stream, and the topic whose partitions it holds (and whose numbers
    its changelog's follow)."""
    for on, stream in ((False, "link_metrics"), (True, "optimizer_feed")):
        config = _config(optimizer_feed=on)
        service = OptimizerService(config, dry_run=True)
        assert service._streams() == [stream]
        assert service.owned.metrics_topic == config.kafka.topics[stream]


class _Holder:
    def __init__(self) -> None:
        self.links: dict[str, LinkConfig] = {}
        self.controllers: dict[str, LinkController] = {}

    def controller(self, link_id: str, partition: int, saved: Any = None) -> None:
        raise AssertionError("no controller to make again")


def test_a_links_topic_link_whose_policy_needs_every_window_is_passed_over() -> None:
    config = _config(optimizer_feed=True, feed_policies=("globecom", "p4bs"))
    table = tomllib.loads(paths.example_config().read_text())["links"][0]
    stats, holder = ServiceStats(), _Holder()
    follower = LinksFollower(config, stats, holder)
    (link,) = config.links
    follower.changed(spec_record(link, table | {"policy": "p4bs"}, T0))
    assert (stats.bad_links, holder.links) == (1, {})
    follower.changed(spec_record(link, table | {"policy": "globecom", "policy_options": {}}, T0))
    assert stats.bad_links == 1 and holder.links[link.id].policy == "globecom"


def test_the_jobs_parameter_carries_the_feed_and_each_links_policy() -> None:
    config = _config(optimizer_feed=True, feed_policies=("globecom", "bdp"), feed_deadband=0.05)
    lines = base64.b64decode(link_metrics_parameter(config)).decode().split("\n")
    assert lines[1] == "feed\t0.05\t1000000000\tglobecom,bdp"
    assert lines[2].startswith("link\tr1:eth1\t") and lines[2].endswith("\tp4bs")


def _decisions(policy: GlobecomPolicy, windows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(window index, buffer) of each decision the policy makes on `windows`."""
    out = []
    for r in windows:
        decided: list[Decision] = policy.decide(Window.from_record(r, None))
        index = (r["window_end_ns"] - T0) // WINDOW_NS - 1
        out += [(index, d.buffer_bytes) for d in decided]
    return out


def test_globecom_on_the_thinned_windows_decides_as_on_every_window_a_heartbeat_late_at_most() -> (
    None
):
    """Steps of SRTT and of N pass the rule in their own window: the same decision there. A
    slow drift (0.5% a window, under the deadband) crosses gamma in a window the feed holds
    back: decided at the next heartbeat, on that window's SRTT."""
    rng = random.Random(7)
    # Phases of (windows, SRTT at the start, SRTT change per window, N).
    phases = [
        (83, 20 * MS, 1.0, 10),  # (not a whole number of seconds: the drifts cross gamma
        # between heartbeats)
        (80, 30 * MS, 1.0, 10),  # a step of SRTT
        (80, 30 * MS, 1.0, 14),  # N changes
        (30, 30 * MS, 1.005, 14),  # a drift up, across gamma once
        (80, None, 1.0, 14),  # held where the drift ended
        (80, 15 * MS, 1.0, 5),  # a step of both
        (30, 15 * MS, 0.995, 5),  # a drift down
        (80, None, 1.0, 5),
    ]
    windows: list[dict[str, Any]] = []
    srtt = 0.0
    for count, start, rate, flows in phases:
        srtt = start if start is not None else srtt
        for _ in range(count):
            srtt *= rate
            wobble = 1 + rng.uniform(-0.002, 0.002)  # well within the deadband
            windows.append(record(len(windows), srtt_ns=round(srtt * wobble), long_flows=flows))
    feed = thinned(windows, (), deadband=DEADBAND, heartbeat_ns=HEARTBEAT_NS)
    assert len(feed) < len(windows) / 5  # about the heartbeats: one window in ten
    example = load_config(paths.example_config()).links[0]
    link = dataclasses.replace(example, policy="globecom", policy_options={})
    every = _decisions(GlobecomPolicy(link, {}), windows)
    fed = _decisions(GlobecomPolicy(link, {}), feed)
    passed = {(r["window_end_ns"] - T0) // WINDOW_NS - 1 for r in feed}
    assert len(fed) == len(every) == 6  # the first, 2 steps, N, 2 drifts
    late = 0
    for (index, buffer), (fed_index, fed_buffer) in zip(every, fed, strict=True):
        if index in passed:
            assert (fed_index, fed_buffer) == (index, buffer)
        else:
            late += 1
            assert index < fed_index <= index + HEARTBEAT_NS // WINDOW_NS
            assert abs(fed_buffer - buffer) <= 0.06 * buffer  # the drift over <= 1 s
    assert late == 2
