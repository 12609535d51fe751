"""Creating the Flink table environment and Kafka tables that match the p4bs Avro schemas.

`table_environment` runs jobs in PyFlink's embedded MiniCluster (mode "embedded", the
default) or submits them to a standalone cluster's REST endpoint (mode "remote"): the one
switch between the two. `kafka_table_ddl` derives each table from the stream's Avro schema,
so the bytes Flink's `avro` format reads and writes are exactly the p4bs codec's, and connects
it as the config's [kafka] says (`kafka_properties`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyflink.common import Configuration
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, StreamTableEnvironment, TableEnvironment

from p4bs import paths
from p4bs.bus import Cluster
from p4bs.config import SecretRef
from p4bs_schemas.registry import STREAMS, current_schema

# The Kafka connector jar shades the Kafka client: its SCRAM login module has this name.
SCRAM_LOGIN_MODULE = (
    "org.apache.flink.kafka.shaded.org.apache.kafka.common.security.scram.ScramLoginModule"
)

_SQL_TYPES = {
    "string": "STRING",
    "long": "BIGINT",
    "int": "INT",
    "double": "DOUBLE",
    "float": "FLOAT",
    "boolean": "BOOLEAN",
    "bytes": "BYTES",
}


def pipeline_jars() -> list[str]:
    """The Kafka connector and Avro format jars, and the project's own Flink functions."""
    jars = sorted(paths.jars_dir("flink").glob("*.jar"))
    if not jars:
        raise FileNotFoundError(
            f"no Flink connector jars in {paths.jars_dir('flink')}; run `make setup`"
        )
    functions = paths.flink_functions_jar()
    if not functions.is_file():
        raise FileNotFoundError(f"no {functions}; run `make setup`")
    return [jar.as_uri() for jar in [*jars, functions]]


def flink_configuration(
    mode: str = "embedded",
    jobmanager: str = "127.0.0.1:8081",
    parallelism: int = 1,
    checkpoint_interval_ns: int | None = None,
    checkpoint_dir: Path | None = None,
    restore_from: Path | None = None,
) -> Configuration:
    """Connector jars, parallelism, checkpointing and where the job runs. Checkpoints are
    exactly-once and kept when the job stops, so a restart can resume from the last one."""
    conf = Configuration()
    conf.set_string("pipeline.jars", ";".join(pipeline_jars()))
    conf.set_string("parallelism.default", str(parallelism))
    # Without it, every record is deep-copied between chained operators: a fifth of the
    # metrics job's per-link stage in a profile. The SQL runtime's operators and the
    # project's functions keep no reference to an input row.
    conf.set_string("pipeline.object-reuse", "true")
    if checkpoint_interval_ns:
        conf.set_string(
            "execution.checkpointing.interval", f"{checkpoint_interval_ns // 1_000_000} ms"
        )
        conf.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
        conf.set_string(
            "execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION"
        )
    if checkpoint_dir is not None:
        conf.set_string("execution.checkpointing.dir", checkpoint_dir.resolve().as_uri())
    if restore_from is not None:
        conf.set_string("execution.state-recovery.path", restore_from.resolve().as_uri())
    if mode == "remote":
        host, _, port = jobmanager.rpartition(":")
        conf.set_string("execution.target", "remote")
        conf.set_string("rest.address", host)
        conf.set_string("rest.port", port)
    elif mode != "embedded":
        raise ValueError(f"Flink mode must be embedded or remote, got {mode!r}")
    return conf


def table_environment(
    mode: str = "embedded",
    jobmanager: str = "127.0.0.1:8081",
    parallelism: int = 1,
    checkpoint_interval_ns: int | None = None,
) -> TableEnvironment:
    """A Table API environment, for jobs that are SQL from end to end."""
    conf = flink_configuration(mode, jobmanager, parallelism, checkpoint_interval_ns)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf)
    return TableEnvironment.create(settings.build())


def stream_table_environment(conf: Configuration) -> StreamTableEnvironment:
    """A Table API environment for a full configuration (`flink_configuration`'s, with a
    checkpoint folder or a checkpoint to restore), embedded or remote."""
    if conf.get_string("execution.target", "local") == "remote":
        # get_execution_environment would make a local environment, which forces the
        # target to local; the base environment honours execution.target and rest.*.
        jvm = get_gateway().jvm
        j_conf = jvm.org.apache.flink.configuration.Configuration.fromMap(conf.to_dict())
        env = StreamExecutionEnvironment(
            jvm.org.apache.flink.streaming.api.environment.StreamExecutionEnvironment(j_conf)
        )
    else:
        env = StreamExecutionEnvironment.get_execution_environment(conf)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().build()
    return StreamTableEnvironment.create(env, environment_settings=settings)


def _sql_type(where: str, avro_type: Any) -> str:
    """The Flink SQL type of an Avro type: a [null, T] union is nullable, the rest NOT NULL
    (nested too: a nullable field would be a union in the schema Flink derives, and its
    bytes would differ); arrays are ARRAY, records ROW."""
    nullable = isinstance(avro_type, list)
    if nullable:
        branches = [t for t in avro_type if t != "null"]
        if len(branches) != 1 or avro_type[0] != "null":
            raise ValueError(f"{where}: only [null, T] unions map")
        avro_type = branches[0]
    if isinstance(avro_type, dict) and avro_type["type"] == "array":
        sql = f"ARRAY<{_sql_type(where + '[]', avro_type['items'])}>"
    elif isinstance(avro_type, dict) and avro_type["type"] == "record":
        sql = f"ROW<{', '.join(_sql_fields(where, avro_type['fields']))}>"
    else:
        sql = _SQL_TYPES[avro_type]
    return sql + ("" if nullable else " NOT NULL")


def _sql_fields(where: str, fields: list[dict[str, Any]]) -> list[str]:
    return [f"`{f['name']}` {_sql_type(where + '.' + f['name'], f['type'])}" for f in fields]


def sql_columns(schema_name: str) -> list[str]:
    """Table columns for an Avro record (types as `_sql_type` maps them)."""
    return _sql_fields(schema_name, current_schema(schema_name)["fields"])


# The Kafka client resolves `${provider:[path:]key}` in its properties from these config
# providers where it runs (the TaskManagers: KIP-297, KIP-887), so a secret is named in the
# job and never sent in it: a remote job goes to the JobManager's REST API (HTTP, no login).
_SHADED_PROVIDERS = "org.apache.flink.kafka.shaded.org.apache.kafka.common.config.provider."
CONFIG_PROVIDERS = {
    "env": _SHADED_PROVIDERS + "EnvVarConfigProvider",
    "dir": _SHADED_PROVIDERS + "DirectoryConfigProvider",
}


def secret_placeholder(ref: SecretRef) -> str:
    """The Kafka client's reference to a secret: an environment variable (`${env:VAR}`) or
    a whole file's content (`${dir:folder:file}`), resolved where the client runs. The
    value goes into the JAAS option's quotes as it is: a secret that holds a quote, a
    backslash or (a file) surrounding white space, where it can be read here, is refused."""
    if ref.env is not None:
        placeholder = f"${{env:{ref.env}}}"
    else:
        assert ref.file is not None
        path = Path(ref.file)
        placeholder = f"${{dir:{path.parent}:{path.name}}}"
    try:
        raw = os.environ[ref.env] if ref.env is not None else Path(ref.file or "").read_text()
    except (KeyError, OSError):  # set only where the job runs
        return placeholder
    where = f"${ref.env}" if ref.env is not None else ref.file
    if '"' in raw or "\\" in raw:
        raise ValueError(
            f"kafka credential {where}: the Flink job's JAAS login cannot hold a quote or a "
            "backslash; choose a password without them"
        )
    if raw != raw.strip():
        raise ValueError(
            f"kafka credential {where}: the Flink job's Kafka client reads it as it is, "
            "surrounding white space (a final newline) included; remove it"
        )
    return placeholder


def kafka_properties(cluster: Cluster) -> dict[str, str]:
    """The Kafka connector's client properties for the cluster: its bootstrap, and for a
    secured one TLS trusting the config's CA and a SCRAM login as the metrics job's user
    ([kafka.users.metrics_job], or [kafka]'s) whose credentials are references the Kafka
    client resolves where it runs (`secret_placeholder`): the job holds no secret, embedded
    or submitted to a remote cluster, whose TaskManagers need the variables or files."""
    if isinstance(cluster, str):
        return {"properties.bootstrap.servers": cluster}
    properties = {"properties.bootstrap.servers": cluster.bootstrap}
    if cluster.security == "plaintext":
        return properties
    job = cluster.for_component("metrics_job")
    assert job.username is not None and job.password is not None  # the config checks
    login = (
        f'{SCRAM_LOGIN_MODULE} required username="{secret_placeholder(job.username)}" '
        f'password="{secret_placeholder(job.password)}";'
    )
    properties |= {
        "properties.security.protocol": "SASL_SSL",
        "properties.sasl.mechanism": cluster.sasl_mechanism,
        "properties.sasl.jaas.config": login,
        "properties.config.providers": ",".join(CONFIG_PROVIDERS),
        **{
            f"properties.config.providers.{name}.class": provider
            for name, provider in CONFIG_PROVIDERS.items()
        },
    }
    if cluster.ca_file is not None:
        properties["properties.ssl.truststore.type"] = "PEM"
        properties["properties.ssl.truststore.location"] = cluster.ca_file
    return properties


def kafka_table_ddl(
    table: str,
    stream: str,
    topic: str,
    cluster: Cluster,
    *,
    raw_value: str | None = None,
    extra_columns: tuple[str, ...] = (),
    options: Mapping[str, str] | None = None,
) -> str:
    """CREATE TABLE for a Kafka topic of `stream`, keyed by link id like every p4bs topic.
    With `raw_value`, the value is not decoded: the table has the key and a BYTES column of
    that name holding the value's Avro bytes."""
    columns = [*sql_columns(STREAMS[stream]), *extra_columns]
    if not columns[0].startswith("`link_id` "):
        raise ValueError(f"stream {stream} is not keyed by link_id")
    value: dict[str, str] = {"value.format": "avro", "value.fields-include": "ALL"}
    if raw_value is not None:
        columns = [columns[0], f"`{raw_value}` BYTES", *extra_columns]
        value = {"value.format": "raw", "value.fields-include": "EXCEPT_KEY"}
    settings = {
        "connector": "kafka",
        "topic": topic,
        **kafka_properties(cluster),
        "properties.isolation.level": "read_committed",
        "key.format": "raw",
        "key.fields": "link_id",
        **value,
        **(options or {}),
    }
    column_list = ",\n  ".join(columns)
    # A quote inside a SQL string literal is doubled (a topic or a path may hold one).
    with_clause = ",\n  ".join(
        "'{}' = '{}'".format(k, v.replace("'", "''")) for k, v in settings.items()
    )
    return f"CREATE TABLE `{table}` (\n  {column_list}\n) WITH (\n  {with_clause}\n)"
