"""`p4bs dashboard`'s server against the real Kafka and InfluxDB, as a process (no browser:
tests/testbed/test_dashboard.py drives the pages): the token (401 without it, 200 with it as
basic auth or bearer), TLS, a bind beyond this machine refused without both, an unknown
link's 404, the fleet's rows shaped, filtered, sorted and paged from the topics, a malformed
record counted and shown, a link's history from InfluxDB through the Grafana link
dashboard's queries, a decision pushed on the link's event stream, a P4BS search's GP."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from confluent_kafka import Producer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from dashboard import Dashboard, running_dashboard

from p4bs import paths
from p4bs.bus import RecordProducer
from p4bs.config import load_config
from p4bs.links import spec_record
from p4bs_infra.procs import wait_until
from p4bs_infra.services import InfluxDB
from p4bs_infra.stack import Stack
from p4bs_ops.dashboard.feed import TAIL_RECORDS
from p4bs_ops.dashboard.server import SetupError, check_assets
from p4bs_optimizer.changelog import LinkState, to_record
from p4bs_optimizer.policies.bayes import Observation
from p4bs_optimizer.policies.p4bs import OPTIMISE, P4bsPolicy

TOKEN = "s3cret-token"
SECOND = 10**9
EXTRA_LINKS = 30  # beside the example config's link, published on the links topic


def _window(link_id: str, end_ns: int, f: float) -> dict[str, Any]:
    return {
        "link_id": link_id,
        "window_start_ns": end_ns - 100_000_000,
        "window_end_ns": end_ns,
        "rtt_samples": 100,
        "rtt_flows": 10,
        "rtt_hmean_ns": 30_000_000,
        "srtt_ns": 31_000_000,
        "rtt_min_ns": 20_000_000,
        "long_flows": 10,
        "data_packets": 1000,
        "retransmissions": 2,
        "loss_rate": 0.002,
        "loss_rate_ewma": 0.0021,
        "queue_delay_samples": 50,
        "queue_delay_ns": 11_000_000,
        "queue_delay_ewma_ns": 10_000_000,
        "throughput_bps": 97_000_000,
        "utilisation": 0.97,
        "offered_bps": 120_000_000,
        "offered_utilisation": 1.2,
        "f": f,
        "zscore": 0.0,
        "change": False,
    }


def _decision(link_id: str, ts_ns: int, buffer: int, outcome: str = "applied") -> dict[str, Any]:
    return {
        "link_id": link_id,
        "ts_ns": ts_ns,
        "queue": 0,
        "policy": "p4bs",
        "phase": OPTIMISE,
        "buffer_bytes": buffer,
        "previous_buffer_bytes": 2_500_000,
        "reason": "trial 2 at the EI's maximum",
        "trial": 2,
        "outcome": outcome,
        "f": -0.4,
        "window_end_ns": ts_ns - SECOND,
        "owner": "optimizer",
        "epoch": 1,
    }


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made here."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p4bs dashboard test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclasses.dataclass
class Deployment:
    config: Path
    link: str  # the example config's link: a P4BS search, an alert, decisions
    topics: dict[str, str]
    influx: InfluxDB
    producer: RecordProducer
    now_ns: int


@pytest.fixture
def deployment(
    stack: Stack, topics: dict[str, str], influx_database: InfluxDB, tmp_path: Path
) -> Deployment:
    """A config on the session's broker and a database of the test's own, and the topics
    filled: 31 links (one from the config, 30 from the links topic), windows, decisions, an
    open alert (then more than a tail of alerts raised and resolved), a P4BS optimizer state
    with three trials, and one malformed record."""
    influx = influx_database
    data = tomllib.loads(paths.example_config().read_text())
    data["kafka"] = {**data["kafka"], "bootstrap": stack.kafka.bootstrap, "topics": topics}
    data["influxdb"] = {**data["influxdb"], "url": influx.url, "database": influx.database}
    # The router lets p4bs manage the links topic's xe<i> too (p4bs.config.authority).
    (router,) = data["routers"]
    router["interfaces"] = [*router.get("interfaces", []), "xe*"]
    config_path = tmp_path / "config.toml"
    config_path.write_text(tomli_w.dumps(data))
    config = load_config(config_path)
    link = config.links[0]
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    now = time.time_ns()
    table = next(t for t in data["links"] if f"{t['router']}:{t['interface']}" == link.id)
    for i in range(EXTRA_LINKS):
        other = dataclasses.replace(link, interface=f"xe{i:02d}")
        taps = {"before": f"tap-x{i}-in", "after": f"tap-x{i}-out"}
        entry = {**table, "interface": other.interface, "taps": taps}
        producer.produce("links", spec_record(other, entry, now))
        producer.produce("link_metrics", _window(other.id, now - SECOND, -0.01 * i))
    for k in range(5):
        producer.produce("link_metrics", _window(link.id, now - (5 - k) * SECOND, -0.5))
    producer.produce("buffer_decisions", _decision(link.id, now - 3 * SECOND, 400_000))
    alert = {
        "link_id": link.id,
        "ts_ns": now - 2 * SECOND,
        "alert_id": "a1",
        "state": "raise",
        "kind": "queue_delay",
        "value": 12e6,
        "bound": 10e6,
        "windows": 5,
    }
    producer.produce("sla_alerts", alert)
    # More than a tail of alerts raised and resolved after it: the open one is still read.
    for i in range(TAIL_RECORDS // 2 + 1):
        for state in ("raise", "resolve"):
            producer.produce("sla_alerts", {**alert, "alert_id": f"flap{i}", "state": state})
    policy = P4bsPolicy(link, link.policy_options)
    policy.phase = OPTIMISE
    policy.low_bytes, policy.high_bytes = 50_000, 1_250_000
    policy.trials = [
        Observation(50_000, -0.9, 0.02),
        Observation(400_000, -0.35, 0.02),
        Observation(1_000_000, -0.6, 0.02),
    ]
    state = LinkState(policy="p4bs", policy_state=policy.snapshot(), in_force={0: 400_000})
    producer.produce("optimizer_state", to_record(link.id, state, "optimizer", now))
    assert producer.flush(30) == 0
    raw = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    raw.produce(topics["link_metrics"], b"\x00not avro", key=link.id.encode())
    assert raw.flush(30) == 0
    return Deployment(config_path, link.id, topics, influx, producer, now)


@pytest.fixture
def dashboard(deployment: Deployment, tmp_path: Path) -> Iterator[Dashboard]:
    with running_dashboard(deployment.config, tmp_path / "dash", token=TOKEN) as running:
        # The feed has read every topic to the end it had at start, so every record of the
        # fixture (the malformed one, and the last alert's resolve, are not read first).
        assert wait_until(lambda: running.get("/api/fleet").json()["feed"]["caught_up"], 60), (
            running.log_text()
        )
        yield running


def test_the_token_is_required_and_accepted_as_basic_auth_or_bearer(dashboard: Dashboard) -> None:
    for path in ("/", "/api/fleet", "/assets/fleet.js", "/vendor/uplot/uPlot.iife.min.js"):
        refused = dashboard.get(path, auth=None)
        assert refused.status == 401, path
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert dashboard.get(path, auth="Bearer wrong").status == 401
        assert dashboard.get(path, auth="Basic !!notbase64").status == 401
        assert dashboard.get(path).status == 200, path
        assert dashboard.get(path, auth="bearer").status == 200, path


def test_an_unknown_link_is_a_404_that_names_it(dashboard: Dashboard) -> None:
    for path in ("/link/nosuch:eth9", "/search/nosuch:eth9"):
        page = dashboard.get(path)
        assert page.status == 404
        assert "no link &#x27;nosuch:eth9&#x27; in this deployment (31 links known)" in (
            page.body.decode()
        )
    for path in ("/api/links/nosuch:eth9", "/api/links/nosuch:eth9/history", "/api/events?link=x"):
        reply = dashboard.get(path)
        assert reply.status == 404
        assert "in this deployment" in reply.json()["error"]


def test_fleet_rows_from_the_topics_filtered_sorted_and_paged(
    dashboard: Dashboard, deployment: Deployment
) -> None:
    assert wait_until(lambda: dashboard.get("/api/fleet").json()["total"] == 31, 30)
    page = dashboard.get("/api/fleet?q=" + urllib.parse.quote(deployment.link)).json()
    assert page["matched"] == 1
    row = page["rows"][0]
    assert row["sla"] == "violated"
    assert [(a["alert_id"], a["kind"]) for a in row["open_alerts"]] == [("a1", "queue_delay")]
    assert row["buffer_bytes"] == 400_000  # as the optimizer's state has it in force
    assert row["buffer_ns"] == 32_000_000  # 400 kB at 100 Mbit/s
    assert (row["policy"], row["phase"]) == ("p4bs", OPTIMISE)
    assert row["last_decision"]["outcome"] == "applied"
    assert row["last_decision"]["id"] == f"{row['last_decision']['ts_ns']}/0"
    assert row["f"] == -0.5
    assert page["feed"]["malformed"] == 1
    assert deployment.topics["link_metrics"] in page["feed"]["malformed_reasons"][0]
    # Sorted by f, highest first: the links topic's xe00 (f 0) ... xe29 (-0.29), then r1.
    by_f = dashboard.get("/api/fleet?sort=f&order=desc&limit=10&offset=25").json()
    assert [r["link_id"].split(":")[1] for r in by_f["rows"]] == [
        "xe25", "xe26", "xe27", "xe28", "xe29", deployment.link.split(":")[1],
    ]  # fmt: skip
    assert by_f["offset"] == 25 and by_f["matched"] == 31
    violated = dashboard.get("/api/fleet?sla=violated").json()
    assert [r["link_id"] for r in violated["rows"]] == [deployment.link]
    assert dashboard.get("/api/fleet?sort=nonsense").status == 400


def test_history_through_the_grafana_link_dashboards_queries(
    dashboard: Dashboard, deployment: Deployment
) -> None:
    now = deployment.now_ns
    lines = [
        f"link_metrics,link={deployment.link} srtt_ns={30_000_000 + i}i,rtt_min_ns=20000000i,"
        f"long_flows=10i,loss_rate=0.001,loss_rate_ewma=0.001,queue_delay_ns=5000000i,"
        f"queue_delay_ewma_ns=5000000i,utilisation=0.9,offered_utilisation=1.1,f=-0.2 "
        f"{now - (20 - i) * SECOND}"
        for i in range(20)
    ]
    decision = (
        f"buffer_decisions,link={deployment.link},outcome=applied,queue=0,policy=p4bs,"
        f'phase=optimise buffer_bytes=400000i,reason="trial 2" {now - 10 * SECOND}'
    )
    _write(deployment.influx, "autogen", lines)
    _write(deployment.influx, "events", [decision])
    link = urllib.parse.quote(deployment.link)
    history = dashboard.get(
        f"/api/links/{link}/history?start_ns={now - 60 * SECOND}&end_ns={now}"
    ).json()
    rtt = history["charts"]["rtt"]
    points = [v for v in rtt["SRTT"] if v is not None]
    assert len(points) == 20 and min(points) >= 30_000_000
    assert len(rtt["time"]) == len(rtt["RTT min"])
    assert next(v for v in history["charts"]["buffer"]["buffer"] if v is not None) == 400_000
    assert history["decisions"][0]["reason"] == "trial 2"
    assert dashboard.get(f"/api/links/{link}/history?start_ns=5&end_ns=4").status == 400


def _write(influx: InfluxDB, policy: str, lines: list[str]) -> None:
    query = urllib.parse.urlencode({"db": influx.database, "rp": policy, "precision": "ns"})
    request = urllib.request.Request(
        f"{influx.url}/write?{query}", data="\n".join(lines).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 204


def test_a_new_decision_is_pushed_on_the_links_event_stream(
    dashboard: Dashboard, deployment: Deployment
) -> None:
    link = urllib.parse.quote(deployment.link)
    request = urllib.request.Request(
        f"{dashboard.url}/api/events?link={link}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as stream:
        assert stream.readline() == b"retry: 2000\n"
        ts = time.time_ns()
        deployment.producer.produce("buffer_decisions", _decision(deployment.link, ts, 123_456))
        deployment.producer.flush(10)
        event = None
        while event is None:
            line = stream.readline().decode()
            if line.startswith("data: "):
                record = json.loads(line[6:])
                if record.get("id") == f"{ts}/0":
                    event = record
        assert event["buffer_bytes"] == 123_456
        assert (time.time_ns() - ts) / 1e9 < 5


def test_the_search_of_a_p4bs_link_is_its_gp_over_the_buffer_range(
    dashboard: Dashboard, deployment: Deployment
) -> None:
    search = dashboard.get(
        f"/api/links/{urllib.parse.quote(deployment.link)}/search", timeout_s=120
    )
    assert search.status == 200, search.body
    view = search.json()
    assert [o["buffer_bytes"] for o in view["observations"]] == [50_000, 400_000, 1_000_000]
    grid = view["grid"]
    assert grid[0] == 50_000 and grid[-1] < 1_250_000  # the policy's own grid
    assert len(view["mean"]) == len(view["std"]) == len(view["ei"]) == len(grid)
    assert all(ei >= 0 for ei in view["ei"]) and all(s >= 0 for s in view["std"])
    assert 50_000 <= view["suggestion_bytes"] <= 1_250_000
    other = dashboard.get("/api/links/" + urllib.parse.quote("r1:xe00") + "/search")
    assert other.status == 404 and "no optimizer state" in other.json()["error"]


def test_tls_is_served_with_the_certificate_given(deployment: Deployment, tmp_path: Path) -> None:
    cert = _self_signed(tmp_path)
    with running_dashboard(deployment.config, tmp_path / "tls", token=TOKEN, tls=cert) as tls:
        assert tls.url.startswith("https://")
        assert tls.get("/api/fleet").status == 200
        assert tls.get("/api/fleet", auth=None).status == 401


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--bind", "0.0.0.0"], "give a token (--token-env or --token-file) and TLS"),
        (["--bind", "10.1.2.3", "--token-env", "P4BS_DASHBOARD_TOKEN"], "and TLS"),
        (["--token-env", "P4BS_NO_SUCH_VARIABLE"], "$P4BS_NO_SUCH_VARIABLE is not set"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
    ],
)
def test_refused_before_starting(options: list[str], message: str) -> None:
    argv = [sys.executable, "-m", "p4bs_cli", "dashboard", "--config", str(paths.example_config())]
    env = {**os.environ, "P4BS_DASHBOARD_TOKEN": TOKEN}
    env.pop("P4BS_NO_SUCH_VARIABLE", None)
    done = subprocess.run(
        [*argv, *options], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_missing_chart_bundle_names_make_setup(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="run make setup"):
        check_assets(tmp_path)
