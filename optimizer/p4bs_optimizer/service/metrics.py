"""The optimizer's Prometheus metrics: read at each scrape from the counts the service keeps
anyway (`ServiceStats`, the links it owns), so the progress line and /metrics never
disagree. Served by `p4bs optimizer run` on [optimizer] metrics_address
(p4bs.metrics_endpoint); each process of a group has its own endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from p4bs.metrics_endpoint import dead_letters_family
from p4bs_optimizer.service.stats import CPU_PARTS

if TYPE_CHECKING:
    from p4bs_optimizer.service.service import OptimizerService

GUARD_REFUSALS = ("freeze", "max_step_ratio", "bounds")
GUARD_DELAYS = ("min_change_interval", "router_budget")


class OptimizerCollector(Collector):
    """One optimizer process's metrics (names in optimizer/README.md "Metrics")."""

    def __init__(self, service: OptimizerService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service.stats
        decisions = CounterMetricFamily(
            "p4bs_optimizer_decisions",
            "BufferDecision records, by what became of the decision",
            labels=["outcome"],
        )
        for outcome, count in (
            ("applied", s.applied),
            ("failed", s.failed),
            ("skipped", s.skipped),
            ("dry_run", s.dry_run),
        ):
            decisions.add_metric([outcome], count)
        yield decisions
        fallbacks = CounterMetricFamily(
            "p4bs_optimizer_fallbacks",
            "Links put on their safe buffer: metrics missing too long, or the policy raised",
            labels=["cause"],
        )
        fallbacks.add_metric(["stale_metrics"], s.fallbacks)
        fallbacks.add_metric(["policy_failure"], s.policy_failures)
        yield fallbacks
        yield _by_label(
            "p4bs_optimizer_guard_refusals",
            "Changes a safety guard did not let through as decided, by guard",
            "guard",
            {g: s.guard_refusals[g] for g in GUARD_REFUSALS},
        )
        yield _by_label(
            "p4bs_optimizer_guard_delays",
            "Changes a safety guard made wait, by guard",
            "guard",
            {g: s.guard_delays[g] for g in GUARD_DELAYS},
        )
        yield _by_label(
            "p4bs_optimizer_windows",
            "Link metrics windows taken in: decided, or replays the saved state covered",
            "kind",
            {"decided": s.windows, "replayed": s.replayed},
        )
        yield _by_label(
            "p4bs_optimizer_records_passed_over",
            "Records not acted on, by reason",
            "reason",
            {
                "unknown_link": s.unknown_links,
                "bad_link_record": s.bad_links,
                "partition_not_held": s.not_held,
            },
        )
        yield CounterMetricFamily(
            "p4bs_optimizer_transactions", "Kafka transactions committed", value=s.transactions
        )
        yield CounterMetricFamily(
            "p4bs_optimizer_transaction_aborts",
            "Kafka transactions aborted (the group rejoined; their records go in the next)",
            value=s.aborted,
        )
        yield CounterMetricFamily(
            "p4bs_optimizer_restore_failures",
            "Saved policy states their policy refused (the link started afresh)",
            value=s.restore_failures,
        )
        controllers = list(self.service.controllers.values())
        yield GaugeMetricFamily(
            "p4bs_optimizer_links_owned",
            "Links this process decides for (those on the partitions it holds)",
            value=len(controllers),
        )
        yield GaugeMetricFamily(
            "p4bs_optimizer_partitions_owned",
            "Partitions of the link metrics topic this process holds",
            value=len(self.service.owned.partitions),
        )
        yield GaugeMetricFamily(
            "p4bs_optimizer_searches_in_progress",
            "Links whose policy is deciding in the decide threads now (a search's model fit)",
            value=sum(1 for c in controllers if c.in_thread),
        )
        yield _by_label(
            "p4bs_optimizer_cpu_seconds",
            "CPU of the service's parts (the Kafka client's own threads are in none), by part",
            "part",
            {part: s.cpu_ns[part] / 1e9 for part in CPU_PARTS},
        )
        yield dead_letters_family("p4bs_optimizer_dead_letters", self.service.consumer_stats)
        yield from s.window_lag.collect()


def _by_label(
    name: str, documentation: str, label: str, counts: dict[str, int] | dict[str, float]
) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family
