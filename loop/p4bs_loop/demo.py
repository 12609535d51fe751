"""`p4bs demo`: the whole system on this machine, live, then torn down.

A Kafka broker and InfluxDB of the demo's own (free ports), the testbed (a Linux router at
100 Mbit/s, 20 ms, Cubic flows joining in groups), the software data plane on its taps, the
metrics job, the optimizer with the chosen policy (P4BS by default) driving the router agent
over gNMI. While the traffic runs, a line a second shows the link as p4bs measures it and
what the optimizer decided; at the end a report compares the link before the first change
with the last third of the run, from p4bs's metrics and from the router's own counters, and
a plot shows the run (report.md and run.png in the output folder).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

from p4bs import paths
from p4bs.bus import RecordConsumer
from p4bs.config import FlowGroup, load_config
from p4bs.retention import retention_policy_of
from p4bs_infra.services import InfluxDB, StackError
from p4bs_infra.testbed import Testbed
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop, own_stack, own_testbed_plan
from p4bs_optimizer.changelog import buffer_in_force

RATE_BPS = 100_000_000


@dataclasses.dataclass
class DemoSettings:
    config: Path
    out: Path
    policy: str = "p4bs"
    groups: tuple[int, ...] = (10, 20, 20)  # Cubic flows per group
    every_s: float = 60.0  # a new group joins this often
    duration_s: float = 180.0
    initial_buffer_ms: float = 200.0


class LiveView:
    """Reads the loop's link metrics and decisions as they come and prints a line a
    second; keeps everything it read for the report."""

    def __init__(self, loop: ClosedLoop) -> None:
        self.consumer = RecordConsumer(
            loop.config.kafka,
            f"demo-view-{uuid.uuid4().hex[:6]}",
            ["link_metrics", "buffer_decisions"],
            loop.topics,
        )
        self.windows: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            received = self.consumer.poll(left)
            if received is None:
                break
            target = self.windows if received.stream == "link_metrics" else self.decisions
            target.append(received.record)

    def buffer_at(self, end_ns: int) -> int | None:
        """The buffer in force for a window ending at `end_ns`, from the applied changes of
        queue 0, as the optimizer counts it; None before the first."""
        changes = sorted(
            ((d["ts_ns"], d["buffer_bytes"]) for d in self.decisions
             if d["outcome"] == "applied" and d["queue"] == 0),
            key=lambda change: change[0],
        )  # fmt: skip
        return buffer_in_force(changes, end_ns)

    def line(self, elapsed_s: float) -> str:
        if not self.windows:
            return f"{elapsed_s:5.0f} s  waiting for link metrics"
        w = self.windows[-1]
        lag = (time.time_ns() - w["window_end_ns"]) / 1e9
        srtt = f"{w['srtt_ns'] / 1e6:6.1f}" if w["srtt_ns"] else "     -"
        delay = f"{w['queue_delay_ns'] / 1e6:6.1f}" if w["queue_delay_ns"] is not None else "     -"
        in_force = self.buffer_at(w["window_end_ns"])
        buffer = f"{in_force / 1000:7.1f}" if in_force else "      -"
        # Utilisation is what the link carried; the offered load beside it (null from a
        # metrics job older than LinkMetrics v2) is above it while the queue fills or drops.
        offered = w.get("offered_utilisation")
        offered_text = f"{offered * 100:5.1f}%" if offered is not None else "    -"
        decided = ""
        if self.decisions:
            d = self.decisions[-1]
            trial = f" trial {d['trial']}" if d["trial"] is not None else ""
            decided = f" | {d['phase']}{trial}: {d['buffer_bytes'] / 1000:.1f} kB {d['outcome']}"
        return (
            f"{elapsed_s:5.0f} s  SRTT {srtt} ms  N {w['long_flows']:3d}  loss "
            f"{w['loss_rate'] * 100:5.2f}%  qdelay {delay} ms  util {w['utilisation'] * 100:5.1f}%"
            f" (offered {offered_text})  f {w['f']:7.3f}  buffer {buffer} kB"
            f"  (metrics {lag:.1f} s old){decided}"
        )

    def close(self) -> None:
        self.consumer.close()


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def link_figures(windows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean SRTT (ms), loss (%), queueing delay (ms), utilisation (%: what the link carried),
    offered load (%: what arrived at the router) and f of windows."""
    return {
        "SRTT, ms": _mean([w["srtt_ns"] / 1e6 for w in windows if w["srtt_ns"]]),
        "loss, %": _mean([w["loss_rate"] * 100 for w in windows]),
        "queueing delay, ms": _mean(
            [w["queue_delay_ns"] / 1e6 for w in windows if w["queue_delay_ns"] is not None]
        ),
        "utilisation, %": _mean([w["utilisation"] * 100 for w in windows]),
        "offered load, %": _mean(
            [
                w["offered_utilisation"] * 100
                for w in windows
                if w.get("offered_utilisation") is not None
            ]
        ),
        "f": _mean([w["f"] for w in windows]),
    }


def report(view: LiveView, summary: dict[str, Any], settings: DemoSettings) -> str:
    """The markdown report: before the first applied change against the last third."""
    windows = [w for w in view.windows if w["rtt_samples"] or w["data_packets"]]
    applied = [d for d in view.decisions if d["outcome"] == "applied"]
    first_change = applied[0]["ts_ns"] if applied else None
    before = [w for w in windows if first_change is None or w["window_end_ns"] <= first_change]
    tail_from = (
        windows[0]["window_end_ns"]
        + (windows[-1]["window_end_ns"] - windows[0]["window_end_ns"]) * 2 // 3
        if windows
        else 0
    )
    after = [w for w in windows if w["window_end_ns"] >= tail_from]
    b, a = link_figures(before), link_figures(after)
    final_buffer = view.buffer_at(windows[-1]["window_end_ns"]) if windows else None

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"

    lines = [
        f"# p4bs demo: policy {settings.policy}",
        "",
        f"Groups of {', '.join(map(str, settings.groups))} Cubic flows joining every "
        f"{settings.every_s:g} s, {settings.duration_s:g} s, 100 Mbit/s, 20 ms; buffer "
        f"{settings.initial_buffer_ms:g} ms of line rate at start.",
        "",
        f"| p4bs's metrics | before the first change ({len(before)} windows) | last third "
        f"({len(after)} windows) |",
        "|---|---|---|",
        *(f"| {k} | {cell(b[k])} | {cell(a[k])} |" for k in b),
        "",
        f"Decisions: {len(view.decisions)} ({len(applied)} applied); phases "
        f"{', '.join(dict.fromkeys(d['phase'] for d in view.decisions)) or '-'}; buffer in force "
        f"at the end of the traffic {final_buffer if final_buffer is not None else '-'} B.",
    ]
    router, probe = summary.get("router"), summary.get("probe")
    if router and probe:
        lines += [
            "",
            "The router and a ping probe over the run after its 10 s warm-up: throughput "
            f"{router['throughput_bps'] / 1e6:.1f} Mbit/s, drops {router['drops']}, mean "
            f"queueing delay {router['queue_delay_mean_ns'] / 1e6:.1f} ms; probe RTT "
            f"{probe['loaded_rtt_p50_ns'] / 1e6:.1f} ms loaded (median) against "
            f"{probe['idle_rtt_ns'] / 1e6:.1f} ms idle.",
        ]
    return "\n".join(lines) + "\n"


def plot(view: LiveView, path: Path, settings: DemoSettings, traffic_start_ns: int) -> None:
    """Buffer, SRTT and queueing delay, utilisation and f from the traffic's start, decisions
    and group joins marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = [w for w in view.windows if w["window_end_ns"] >= traffic_start_ns]
    if not windows:
        return

    def t(ns: int) -> float:
        return (ns - traffic_start_ns) / 1e9

    initial = RATE_BPS / 8 * settings.initial_buffer_ms / 1000
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(10, 9))
    xs = [t(w["window_end_ns"]) for w in windows]
    buffers = [view.buffer_at(w["window_end_ns"]) or initial for w in windows]
    axes[0].step(xs, [b / 1000 for b in buffers], where="post")
    axes[0].set_ylabel("buffer, kB")
    axes[0].set_yscale("log")
    axes[0].set_title(f"p4bs demo, policy {settings.policy}: decisions (grey), groups join (red)")
    for d in view.decisions:
        if d["outcome"] == "applied":
            axes[0].axvline(t(d["ts_ns"]), color="grey", alpha=0.4, linewidth=0.8)
    for i in range(1, len(settings.groups)):
        for ax in axes:
            ax.axvline(i * settings.every_s, color="red", linestyle="--", linewidth=0.8)
    axes[1].plot(xs, [(w["srtt_ns"] or 0) / 1e6 for w in windows], label="SRTT")
    axes[1].plot(xs, [(w["queue_delay_ns"] or 0) / 1e6 for w in windows], label="queueing delay")
    axes[1].set_ylabel("ms")
    axes[1].legend(loc="upper right")
    axes[2].plot(xs, [w["utilisation"] * 100 for w in windows], label="carried (utilisation)")
    offered = [w.get("offered_utilisation") for w in windows]
    if any(o is not None for o in offered):
        axes[2].plot(
            xs,
            [o * 100 if o is not None else float("nan") for o in offered],
            label="offered",
            alpha=0.6,
        )
        axes[2].legend(loc="lower right")
    axes[2].set_ylabel("load, % of capacity")
    axes[3].plot(xs, [w["f"] for w in windows])
    axes[3].set_ylabel("f")
    axes[3].set_xlabel("s since the traffic started")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_demo(settings: DemoSettings) -> int:
    config = load_config(settings.config)
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"p4bs demo: everything in {out}; Ctrl-C stops it and tears everything down")
    stack = own_stack(config, out / "stack")
    groups = [
        FlowGroup(f"g{i}", flows, "cubic", int(i * settings.every_s * 1e9), None)
        for i, flows in enumerate(settings.groups)
    ]
    plan = own_testbed_plan(config, out / "testbed", "demo", groups, settings.initial_buffer_ms)
    testbed = Testbed(plan)
    loop: ClosedLoop | None = None
    view: LiveView | None = None
    try:
        stack.up(progress=lambda line: print(f"  stack: {line}"))
        took = testbed.up()
        print(f"  testbed {plan.name} up in {took:.1f} s: router {plan.link_id}, 100 Mbit/s")
        base = tomllib.loads(settings.config.read_text())
        loop = ClosedLoop(
            base,
            testbed,
            out / "loop",
            bootstrap=stack.kafka.bootstrap,
            policy=settings.policy,
            influx_url=stack.influxdb.url,
        )
        loop.start(progress=lambda line: print(f"  {line}"))
        view = LiveView(loop)
        result: dict[str, Any] = {}
        scenario = Scenario(duration_s=settings.duration_s, warmup_s=10)
        traffic = threading.Thread(
            target=lambda: result.update(
                TrafficRun(testbed, out / "traffic", scenario).run(progress=lambda _: None)
            ),
            name="traffic",
        )
        began = time.monotonic()
        traffic.start()
        print(f"traffic: groups of {settings.groups} Cubic flows, one every {settings.every_s:g} s")
        while traffic.is_alive():
            view.read(1.0)
            print(view.line(time.monotonic() - began), flush=True)
        traffic.join()
        view.read(3.0)
        text = report(view, result, settings) + history(stack.influxdb)
        (out / "report.md").write_text(text)
        plot(view, out / "run.png", settings, result["timeline"]["traffic_start_ns"])
        print("\n" + text)
        print(f"report: {out / 'report.md'}, plot: {out / 'run.png'}")
        return 0
    except KeyboardInterrupt:
        print("stopped; tearing down")
        return 130
    finally:
        if view is not None:
            view.close()
        if loop is not None:
            loop.stop()
        testbed.down()
        stack.down()


# What the InfluxDB sink stored, counted by a field every point of the measurement has.
HISTORY = (("link_metrics", "rtt_samples"), ("buffer_decisions", "buffer_bytes"))


def history(influxdb: InfluxDB) -> str:
    """A report paragraph: how many points of each measurement the InfluxDB sink stored
    (read back from InfluxDB), and where a query finds them."""
    counts = []
    for measurement, field in HISTORY:
        try:
            series = influxdb.query(
                f'SELECT COUNT("{field}") FROM "{influxdb.database}".'
                f'"{retention_policy_of(measurement)}"."{measurement}"'
            )
            counts.append(f"{series[0].values[0][1] if series else 0} {measurement}")
        except (StackError, IndexError) as exc:
            counts.append(f"{measurement}: not read ({exc})")
    return (
        f"\nHistory in InfluxDB ({influxdb.url}, database {influxdb.database}, kept in "
        f"{influxdb.dir}): {', '.join(counts)} points.\n"
    )


def default_out() -> Path:
    return paths.home() / ".run" / "demo" / time.strftime("%Y%m%d-%H%M%S")
