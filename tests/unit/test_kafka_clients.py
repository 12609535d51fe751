"""How every part's Kafka client is configured from the config's [kafka]: plaintext, or TLS
+ SASL/SCRAM with the credentials resolved only in the client (Python), named by reference
in the exporter's spec file (Rust), and in the Flink tables' JAAS login (Java)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from p4bs.bus import client_settings, credentials, security_settings
from p4bs.config import Config, SecretRef, parse_config
from p4bs_exporter import run_spec

PASSWORD = 'it\'s a "quoted" \\ secret'


@pytest.fixture
def secured(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    data: dict[str, Any] = tomllib.loads((repo / "config" / "testbed.toml").read_text())
    (tmp_path / "password").write_text(PASSWORD + "\n")
    data["kafka"] |= {
        "security": "sasl_ssl",
        "ca_file": "/etc/p4bs/kafka-ca.pem",
        "username": {"env": "P4BS_TEST_KAFKA_USER"},
        "password": {"file": str(tmp_path / "password")},
    }
    monkeypatch.setenv("P4BS_TEST_KAFKA_USER", "scram-user-7")
    return parse_config(data)


def test_a_secured_client_gets_tls_scram_and_its_credentials_when_it_is_made(
    secured: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka = secured.kafka
    assert kafka.sasl_mechanism == "SCRAM-SHA-512"  # the default
    tls = {
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/p4bs/kafka-ca.pem",
    }
    assert security_settings(kafka) == tls
    assert credentials(kafka) == {"sasl.username": kafka.username, "sasl.password": kafka.password}
    assert client_settings(kafka) == {
        "bootstrap.servers": "127.0.0.1:9092",
        **tls,
        "sasl.username": "scram-user-7",
        "sasl.password": PASSWORD,
    }
    monkeypatch.delenv("P4BS_TEST_KAFKA_USER")
    with pytest.raises(LookupError, match=r"\$P4BS_TEST_KAFKA_USER is not set"):
        client_settings(kafka)


def test_a_plaintext_client_gets_the_bootstrap_only(repo: Path) -> None:
    data = tomllib.loads((repo / "config" / "testbed.toml").read_text())
    kafka = parse_config(data).kafka
    assert client_settings(kafka) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "plaintext",
    }
    assert credentials(kafka) == {}
    assert client_settings("127.0.0.1:9") == {"bootstrap.servers": "127.0.0.1:9"}


def test_the_exporters_spec_names_the_credentials_and_holds_none(
    secured: Config, tmp_path: Path
) -> None:
    spec = run_spec(secured, stats_path=tmp_path / "stats.json", pcaps=[("before", tmp_path)])
    assert spec["kafka"]["properties"] == security_settings(secured.kafka)
    assert spec["kafka"]["secret_properties"] == {
        "sasl.username": {"env": "P4BS_TEST_KAFKA_USER"},
        "sasl.password": {"file": str(tmp_path / "password")},
    }
    text = json.dumps(spec)
    assert PASSWORD not in text and "scram-user-7" not in text
    assert secured.kafka.password == SecretRef(file=str(tmp_path / "password"))


def test_flink_tables_log_in_with_the_connectors_shaded_scram_module(secured: Config) -> None:
    from p4bs_jobs.flink_env import kafka_properties, kafka_table_ddl

    props = kafka_properties(secured.kafka)
    jaas = props.pop("properties.sasl.jaas.config")
    assert props == {
        "properties.bootstrap.servers": "127.0.0.1:9092",
        "properties.security.protocol": "SASL_SSL",
        "properties.sasl.mechanism": "SCRAM-SHA-512",
        "properties.ssl.truststore.type": "PEM",
        "properties.ssl.truststore.location": "/etc/p4bs/kafka-ca.pem",
    }
    # The JAAS option quotes its values: a quote or a backslash inside is escaped.
    assert jaas == (
        "org.apache.flink.kafka.shaded.org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="scram-user-7" password="it\'s a \\"quoted\\" \\\\ secret";'
    )
    ddl = kafka_table_ddl("t", "link_counters", "topic", secured.kafka)
    # A SQL string literal doubles a single quote.
    assert "password=\"it''s a" in ddl and "'properties.sasl.mechanism' = 'SCRAM-SHA-512'" in ddl
    assert kafka_properties("127.0.0.1:9") == {"properties.bootstrap.servers": "127.0.0.1:9"}
