"""The `model` target: the Rust binary `p4bs-exporter` runs the software data plane and
produces its records; this side writes its run spec, starts it as a child process, reads its
stats file and stops it (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from p4bs import paths
from p4bs.bus import credentials, security_settings
from p4bs.config import Config, ConfigError, LinkConfig, SwitchConfig
from p4bs_exporter import dataplane_spec
from p4bs_exporter.target import (
    EXPORTED_STREAMS,
    ExporterError,
    ExporterStats,
    SpecError,
    stream_spec,
)

BINARY = "p4bs-exporter"
PACES = ("max", "realtime")


def choose_switch(config: Config, name: str | None = None) -> SwitchConfig:
    """The named switch, or the first one."""
    if not config.switches:
        raise ConfigError("config", ["switches: no switch is configured"])
    if name is None:
        return config.switches[0]
    for switch in config.switches:
        if switch.name == name:
            return switch
    known = ", ".join(s.name for s in config.switches)
    raise ConfigError("--switch", [f"no switch {name!r} (switches: {known})"])


def switch_links(config: Config, switch: SwitchConfig) -> list[LinkConfig]:
    links = [link for link in config.links if link.switch == switch.name]
    if not links:
        raise ConfigError("config", [f"switch {switch.name!r} serves no link"])
    return links


def run_spec(
    config: Config,
    *,
    stats_path: Path,
    switch: str | None = None,
    link: str | None = None,
    pcaps: Sequence[tuple[str, Path]] = (),
    pace: str = "max",
    netns: str | None = None,
    stats_interval_s: float = 1.0,
    flush_timeout_s: float = 60.0,
    topics: Mapping[str, str] | None = None,
    kafka_properties: Mapping[str, str] | None = None,
    metrics_address: str | None = None,
) -> dict[str, Any]:
    """The run spec of `p4bs-exporter` for one switch of the deployment config.

    With `pcaps` ((port, file) pairs; ports `before` and `after`) the records come from
    capture files of one link (`link`, default the switch's first); without, from the
    switch's tap interfaces, captured live in network namespace `netns` (None: this one).
    `topics` overrides the config's [kafka.topics] (tests use their own). The Kafka
    credentials go in by reference (`secret_properties`, an environment variable or a file
    the binary reads at start): the spec file never holds a secret. The Prometheus endpoint
    is the switch's `metrics_address` unless `metrics_address` is given ("": none).
    """
    chosen = choose_switch(config, switch)
    links = switch_links(config, chosen)
    if pace not in PACES:
        raise ConfigError("--pace", [f"must be one of {', '.join(PACES)}, got {pace!r}"])
    source: dict[str, Any]
    if pcaps:
        try:
            captured = config.link(link) if link else links[0]
        except KeyError:
            known = ", ".join(x.id for x in links)
            raise ConfigError("--link", [f"no link {link!r} (links: {known})"]) from None
        pipeline = dataplane_spec.capture_spec(
            captured.id, captured.output_prefixes, config.dataplane
        )
        source = {"pcap": [[port, str(file)] for port, file in pcaps], "pace": pace}
    else:
        pipeline = dataplane_spec.live_spec(config, links)
        source = {"live": True, "netns": netns}
    names = dict(config.kafka.topics)
    names.update(topics or {})
    return {
        "pipeline": pipeline,
        "kafka": {
            "bootstrap": config.kafka.bootstrap,
            "client_id": f"p4bs-exporter-{chosen.name}",
            "properties": {**security_settings(config.kafka), **(kafka_properties or {})},
            "secret_properties": {
                name: {"env": ref.env} if ref.env is not None else {"file": ref.file}
                for name, ref in credentials(config.kafka).items()
            },
        },
        "streams": {s: stream_spec(s, names[s]) for s in EXPORTED_STREAMS},
        "max_rtt_samples_per_record": config.dataplane.max_rtt_samples_per_record,
        "source": source,
        "stats": {"path": str(stats_path), "interval_s": stats_interval_s},
        "flush_timeout_s": flush_timeout_s,
        "metrics_address": socket_address(
            chosen.metrics_address if metrics_address is None else metrics_address
        ),
    }


def socket_address(host_port: str) -> str:
    """A config's host:port as the binary parses it (IP:PORT, IPv6 in brackets); "" stays."""
    if not host_port:
        return ""
    host, _, port = host_port.rpartition(":")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ModelTarget:
    """Supervises one `p4bs-exporter` process: its spec, log and stats files sit beside the
    stats file (`<stats>.spec.json`, `<stats>.log`)."""

    name = "model"

    def __init__(self, spec: Mapping[str, Any], binary: Path | None = None) -> None:
        self.spec = dict(spec)
        self.binary = binary or paths.built(BINARY)
        self.stats_path = Path(self.spec["stats"]["path"])
        self.spec_path = self.stats_path.with_suffix(".spec.json")
        self.log_path = self.stats_path.with_suffix(".log")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def check(self) -> None:
        """Lets the binary validate the spec; raises SpecError listing every problem."""
        self._write_spec()
        result = subprocess.run(
            [str(self.binary), "--spec", str(self.spec_path), "--check"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode == 2:
            lines = result.stderr.splitlines()
            problems = [x.strip() for x in lines[1:]] if len(lines) > 1 else lines
            raise SpecError(problems)
        if result.returncode != 0:
            raise ExporterError(f"{self.binary} --check: {result.stderr.strip()}")

    def _write_spec(self) -> None:
        if not self.binary.exists():
            raise ExporterError(f"{self.binary} is missing: run `make setup`")
        self.stats_path.parent.mkdir(parents=True, exist_ok=True)
        self.spec_path.write_text(json.dumps(self.spec, indent=2) + "\n")

    def start(self) -> None:
        if self._proc is not None:
            raise ExporterError("already started")
        self.check()
        self.stats_path.unlink(missing_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), "--spec", str(self.spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the supervisor, which stops it
            )

    def stats(self) -> ExporterStats:
        stats = ExporterStats.read(self.stats_path)
        if stats is None or stats.pid != self.pid:
            stats = ExporterStats(target=self.name, pid=self.pid)
        code = self.returncode
        if code is not None and not stats.finished:
            stats.state = "failed"  # exited before writing its final stats
        return stats

    def wait(self, timeout_s: float) -> bool:
        """True once the process has exited (its input ended, or it failed)."""
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, timeout_s: float = 30.0) -> ExporterStats:
        """SIGTERM (it finishes the pipeline and flushes Kafka), SIGKILL after `timeout_s`."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return self.stats()

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
