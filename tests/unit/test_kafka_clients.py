"""How every part's Kafka client is configured from the config's [kafka]: plaintext, or TLS
+ SASL/SCRAM with the credentials resolved only in the client (Python), named by reference
in the exporter's spec file (Rust), and in the Flink tables' JAAS login (Java)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from p4bs.bus import client_settings, credentials, security_settings
from p4bs.config import Config, ConfigError, SecretRef, parse_config
from p4bs.config.model import KafkaUser
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


def test_flink_tables_log_in_by_reference_and_the_job_holds_no_secret(
    secured: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job (embedded, or sent to a remote JobManager over its REST API) names the
    credentials; the Kafka client resolves them in the TaskManagers (config providers)."""
    from p4bs_jobs.flink_env import CONFIG_PROVIDERS, kafka_properties, kafka_table_ddl

    (tmp_path / "password").write_text("s3cret-no-newline")
    props = kafka_properties(secured.kafka)
    jaas = props.pop("properties.sasl.jaas.config")
    shaded = "org.apache.flink.kafka.shaded.org.apache.kafka.common"
    providers = f"{shaded}.config.provider"
    assert props == {
        "properties.bootstrap.servers": "127.0.0.1:9092",
        "properties.security.protocol": "SASL_SSL",
        "properties.sasl.mechanism": "SCRAM-SHA-512",
        "properties.ssl.truststore.type": "PEM",
        "properties.ssl.truststore.location": "/etc/p4bs/kafka-ca.pem",
        "properties.config.providers": "env,dir",
        "properties.config.providers.env.class": f"{providers}.EnvVarConfigProvider",
        "properties.config.providers.dir.class": f"{providers}.DirectoryConfigProvider",
    }
    assert set(CONFIG_PROVIDERS) == {"env", "dir"}
    assert jaas == (
        f"{shaded}.security.scram.ScramLoginModule required "
        f'username="${{env:P4BS_TEST_KAFKA_USER}}" password="${{dir:{tmp_path}:password}}";'
    )
    ddl = kafka_table_ddl("t", "link_counters", "topic", secured.kafka)
    assert "s3cret" not in ddl and "scram-user-7" not in ddl
    assert f'password="${{dir:{tmp_path}:password}}"' in ddl
    # Its own user when the config gives the metrics job one.
    monkeypatch.setenv("P4BS_TEST_JOB_USER", "job-user")
    job = SecretRef(env="P4BS_TEST_JOB_USER")
    kafka = replace(secured.kafka, users={"metrics_job": KafkaUser(job, job)})
    assert (
        'username="${env:P4BS_TEST_JOB_USER}"'
        in kafka_properties(kafka)["properties.sasl.jaas.config"]
    )


def test_a_secret_the_jaas_login_cannot_hold_is_refused_naming_it(
    secured: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from p4bs_jobs.flink_env import kafka_properties

    # The fixture's password file: quotes, a backslash and a final newline.
    with pytest.raises(ValueError, match=f"kafka credential {tmp_path}/password: .*quote"):
        kafka_properties(secured.kafka)
    (tmp_path / "password").write_text("fine\n")
    with pytest.raises(ValueError, match="white space"):
        kafka_properties(secured.kafka)
    # Not readable here (only on the cluster): named, not checked.
    (tmp_path / "password").unlink()
    monkeypatch.delenv("P4BS_TEST_KAFKA_USER")
    assert (
        "${env:P4BS_TEST_KAFKA_USER}"
        in kafka_properties(secured.kafka)["properties.sasl.jaas.config"]
    )
    assert kafka_properties("127.0.0.1:9") == {"properties.bootstrap.servers": "127.0.0.1:9"}


def test_each_component_logs_in_as_its_own_user_or_the_kafka_one(
    secured: Config, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("P4BS_TEST_OPT_USER", "p4bs-optimizer")
    monkeypatch.setenv("P4BS_TEST_OPT_PASSWORD", "opt-secret")
    user = {"env": "P4BS_TEST_OPT_USER"}
    data = {"optimizer": {"username": user, "password": {"env": "P4BS_TEST_OPT_PASSWORD"}}}
    kafka = replace(
        secured.kafka,
        users={"optimizer": KafkaUser(SecretRef(**user), SecretRef(env="P4BS_TEST_OPT_PASSWORD"))},
    )
    config = replace(secured, kafka=kafka)
    optimizer = client_settings(config.for_kafka_component("optimizer").kafka)
    assert (optimizer["sasl.username"], optimizer["sasl.password"]) == (
        "p4bs-optimizer",
        "opt-secret",
    )
    # Without a user of its own, a component logs in as [kafka]'s.
    assert client_settings(config.for_kafka_component("sinks").kafka)["sasl.username"] == (
        "scram-user-7"
    )
    with pytest.raises(ValueError, match="no Kafka component 'web'"):
        config.for_kafka_component("web")
    # The config reads [kafka.users.<component>], and names a component it does not know.
    raw: dict[str, Any] = tomllib.loads((repo / "config" / "testbed.toml").read_text())
    raw["kafka"] |= {
        "security": "sasl_ssl",
        "username": user,
        "password": user,
        "users": {**data, "web": data["optimizer"]},
    }
    with pytest.raises(ConfigError) as problems:
        parse_config(raw)
    assert [p for p in problems.value.problems if "users" in p] == [
        "kafka.users.web: unknown component (known: admin, exporter, metrics_job, optimizer, "
        "sinks, dashboard, links)"
    ]
    del raw["kafka"]["users"]["web"]
    assert parse_config(raw).kafka.users == kafka.users
