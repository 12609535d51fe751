"""The Grafana dashboards (ops/grafana) without Grafana or InfluxDB: the provisioning files,
every panel on the provisioned data source, every query's macros known and rendered as
Grafana renders them, and every measurement, retention policy, tag and field a query names
one that the InfluxDB sink writes (so a typo fails here, before the testbed test)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from p4bs import retention
from p4bs_ops import grafana
from p4bs_schemas.registry import STREAMS, current_schema
from p4bs_sinks.influx_sink import line_of

GRAFANA = Path(__file__).resolve().parents[2] / "ops" / "grafana"
DASHBOARDS = ("alerts", "decisions", "fleet", "link")
DATASOURCE = {"type": "influxdb", "uid": grafana.DATASOURCE_UID}
LINK_VARIABLE_QUERY = 'SHOW TAG VALUES FROM "link_metrics" WITH KEY = "link"'
# Queries that show the state now, whenever it was reached, so they take no $timeFilter:
# the buffer in force (the last applied decision) and the open alerts (the last of each).
TIMELESS = {
    ("p4bs · fleet", "Links now", "B"),
    ("p4bs · fleet", "Out of SLA now (open alerts)", "A"),
    ("p4bs · SLA alerts", "Open alerts", "A"),
}


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return grafana.load_dashboards()


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def test_the_datasource_is_influxql_on_the_deployments_url_and_database() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning/datasources/p4bs.yaml").read_text())
    assert provisioned["apiVersion"] == 1
    (source,) = provisioned["datasources"]
    assert (source["type"], source["uid"]) == (DATASOURCE["type"], DATASOURCE["uid"])
    assert source["url"] == "${P4BS_INFLUXDB_URL}"
    assert source["jsonData"]["dbName"] == "${P4BS_INFLUXDB_DATABASE}"
    assert source["jsonData"]["version"] == "InfluxQL"


def test_the_dashboard_provider_loads_the_json_files_from_a_folder() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning/dashboards/p4bs.yaml").read_text())
    assert provisioned["apiVersion"] == 1
    (provider,) = provisioned["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_every_panel_queries_the_provisioned_datasource_in_raw_influxql(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    assert sorted(dashboards) == list(DASHBOARDS)
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, dashboard in dashboards.items():
        assert dashboard["schemaVersion"] >= 36, name
        panels = _panels(dashboard)
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids), (name, ids)
        for panel in panels:
            assert "gridPos" in panel, (name, panel["title"])
            if panel["type"] == "row":
                continue
            assert panel["type"] in {"timeseries", "table", "stat", "state-timeline"}
            assert panel["datasource"] == DATASOURCE, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            refs = [t["refId"] for t in panel["targets"]]
            assert len(set(refs)) == len(refs), (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"] == DATASOURCE, (name, panel["title"])
                assert target["rawQuery"] is True and target["query"].strip(), panel["title"]
        for annotation in dashboard["annotations"]["list"]:
            if annotation.get("builtIn"):
                continue
            assert annotation["datasource"] == DATASOURCE, (name, annotation["name"])
            assert annotation["target"]["rawQuery"] is True and annotation["target"]["query"]
        for variable in dashboard["templating"]["list"]:
            assert variable["datasource"] == DATASOURCE, (name, variable["name"])


def test_every_query_uses_only_known_macros_in_grafanas_forms(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    found = list(grafana.all_queries())
    assert len(found) >= 40  # every panel's, annotation's and variable's query is read
    for query in found:
        grafana.check(query)  # each macro Grafana's or a variable of its dashboard
        text = query.text
        # The link variable only as a multi-value regex match, as Grafana expands it.
        assert text.count("$link") == text.count('"link" =~ /^$link$/'), query.where
        # Every series over time in Grafana's interval, and every range in the dashboard's.
        assert text.count("GROUP BY time(") == text.count("GROUP BY time($__interval)")
        timeless = (query.dashboard, query.title, query.ref_id) in TIMELESS
        if query.kind != "variable":
            assert ("$timeFilter" in text) != timeless, query.where


def test_the_link_dashboard_has_the_link_variable_its_annotations_and_the_buffer_as_a_step(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    link = dashboards["link"]
    (variable,) = link["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "link",
        "query",
        LINK_VARIABLE_QUERY,
    )
    assert variable["multi"] and variable["includeAll"]
    names = {a["name"] for a in link["annotations"]["list"] if not a.get("builtIn")}
    assert names == {"Buffer decisions", "SLA alerts"}
    texts = " ".join(q.text for q in grafana.queries(link) if q.kind == "panel")
    for field in ("srtt_ns", "rtt_min_ns", "long_flows", "loss_rate", "queue_delay_ns"):
        assert f'"{field}"' in texts, field
    for field in ("utilisation", "offered_utilisation", "f"):
        assert f'mean("{field}")' in texts, field
    (buffer,) = [p for p in _panels(link) if p["title"] == "Buffer in force"]
    (target,) = buffer["targets"]
    assert "\"outcome\" = 'applied' AND \"queue\" = '0'" in target["query"]
    assert target["query"].endswith('GROUP BY time($__interval), "link" fill(previous)')
    assert buffer["fieldConfig"]["defaults"]["custom"]["lineInterpolation"] == "stepAfter"
    # Long ranges: panels on each rollup the stack keeps.
    for rollup in retention.ROLLUPS:
        assert f'"{rollup.policy}"."{retention.DOWNSAMPLED}"' in texts, rollup.policy


def _dummy(kind: Any) -> Any:
    if isinstance(kind, list):  # a union: its non-null branch
        return _dummy(next(k for k in kind if k != "null"))
    return {"long": 1, "int": 1, "double": 0.5, "boolean": True, "string": "x"}[kind]


def _written(stream: str) -> tuple[set[str], set[str]]:
    """The tags and fields of a point the InfluxDB sink writes for a record of `stream` with
    every field set."""
    record = {f["name"]: _dummy(f["type"]) for f in current_schema(STREAMS[stream])["fields"]}
    record["link_id"] = "r1:eth1"
    key, fields, _ = line_of(stream, record).rsplit(" ", 2)
    tags = {pair.split("=")[0] for pair in key.split(",")[1:]}
    values = dict(pair.split("=") for pair in fields.split(","))
    return tags, set(values)


def _known() -> dict[tuple[str, str], set[str]]:
    """(retention policy, measurement) -> the identifiers a query of it may name."""
    known = {}
    for stream in ("link_metrics", "sla_alerts", "buffer_decisions"):
        tags, fields = _written(stream)
        known[(retention.retention_policy_of(stream), stream)] = tags | fields
    tags, fields = _written(retention.DOWNSAMPLED)
    numbers = {f for f in fields if f != "change"}  # the summaries are of numbers
    for rollup in retention.ROLLUPS:
        summaries = {s.split("(")[0] for s in rollup.summaries}  # "mean(*)" -> "mean"
        named = {f"{s}_{f}" for s in summaries for f in numbers}
        known[(rollup.policy, retention.DOWNSAMPLED)] = tags | named
    return known


def test_every_measurement_policy_tag_and_field_a_query_names_is_written_by_the_sink() -> None:
    known = _known()
    for query in grafana.all_queries():
        if query.kind == "variable":
            continue
        source = re.search(r'FROM "(\w+)"\."(\w+)"', query.text)
        assert source, f"{query.where}: FROM names no retention policy: {query.text}"
        allowed = known.get((source[1], source[2]))
        assert allowed is not None, f"{query.where}: no {source[1]}.{source[2]} is written"
        aliases = set(re.findall(r'\bAS "([^"]+)"', query.text))
        named = set(re.findall(r'"([^"]+)"', query.text)) - aliases - {source[1], source[2]}
        assert named <= allowed, f"{query.where}: not written: {sorted(named - allowed)}"


def test_the_names_check_would_catch_a_typo() -> None:
    known = _known()
    assert "srtt_ns" in known[("autogen", "link_metrics")]
    assert "srt_ns" not in known[("autogen", "link_metrics")]
    assert "percentile_f" in known[("rollup_1m", "link_metrics")]
    assert "percentile_f" not in known[("rollup_1s", "link_metrics")]
    assert {"outcome", "queue", "buffer_bytes"} <= known[("events", "buffer_decisions")]


MULTI = (grafana.Variable("link", multi=True, include_all=True, all_value=".*"),)


def _query(text: str, variables: tuple[grafana.Variable, ...] = MULTI, **kw: Any) -> grafana.Query:
    return grafana.Query("d", "p", "panel", "A", text, variables=variables, **kw)


def test_macros_render_as_grafana_renders_them() -> None:
    context = grafana.Context(
        start_ns=1_700_000_000_123_456_789,
        end_ns=1_700_000_060_000_000_001,
        interval_ns=200_000_000,
        values={"link": ["r1:eth1"]},
    )
    text = (
        'SELECT mean("f") FROM "autogen"."link_metrics" WHERE "link" =~ /^$link$/ AND '
        '$timeFilter GROUP BY time($__interval), "link" fill(null)'
    )
    assert grafana.render(_query(text), context) == (
        'SELECT mean("f") FROM "autogen"."link_metrics" WHERE "link" =~ /^r1:eth1$/ AND '
        'time >= 1700000000123ms and time <= 1700000060001ms GROUP BY time(200ms), "link" '
        "fill(null)"
    )
    # A panel's minimum interval holds $__interval up; ${name} and [[name]] are the variable.
    braced = _query("${link} [[link]] $__interval $__interval_ms", min_interval_ns=60 * 10**9)
    assert grafana.render(braced, context) == "r1:eth1 r1:eth1 1m 60000"
    several = grafana.Context(0, 10**9, 10**6, {"link": ["r1:xe-0/0/0.5", "r2:eth1"]})
    assert grafana.render(_query("=~ /^$link$/"), several) == r"=~ /^(r1:xe-0\/0\/0\.5|r2:eth1)$/"
    everything = grafana.Context(0, 10**9, 10**6, {"link": [grafana.ALL]})
    assert grafana.render(_query("=~ /^$link$/"), everything) == "=~ /^.*$/"
    single = (grafana.Variable("link"),)
    assert (
        grafana.render(
            _query("=~ /^$link$/ '$link'", single),
            several.__class__(0, 10**9, 10**6, {"link": ["r1:a.b"]}),
        )
        == r"=~ /^r1:a\.b$/ 'r1:a.b'"
    )


def test_an_unknown_macro_or_a_formatted_variable_is_refused() -> None:
    context = grafana.Context(0, 10**9, 10**6, {"link": ["r1:eth1"]})
    with pytest.raises(grafana.MacroError, match="timefilter"):
        grafana.render(_query("WHERE $timefilter"), context)
    with pytest.raises(grafana.MacroError, match="links"):
        grafana.check(_query('"link" =~ /^$links$/'))
    with pytest.raises(grafana.MacroError, match="formatted"):
        grafana.check(_query("${link:csv}"))
    with pytest.raises(grafana.MacroError, match="no value"):
        grafana.render(_query("$link"), grafana.Context(0, 10**9, 10**6))


def test_intervals_are_grafanas() -> None:
    assert retention.influxql_duration_ns("100ms") == 100_000_000
    assert retention.influxql_duration_ns("1m") == 60 * 10**9
    assert [grafana.interval_text(ns) for ns in (2 * 10**8, 10**9, 120 * 10**9, 3600 * 10**9)] == [
        "200ms",
        "1s",
        "2m",
        "1h",
    ]
    # Two minutes over 1000 points: 120 ms, which Grafana rounds to 100 ms.
    assert grafana.auto_interval_ns(0, 120 * 10**9) == 100_000_000
    assert grafana.auto_interval_ns(0, 7 * 86_400 * 10**9) == 10 * 60 * 10**9
