"""The session's secured stack, shared by test_kafka_security and test_kafka_acls (one broker
start, ~1 min, for both): `p4bs stack up` from a config with `security = "sasl_ssl"`, a
SCRAM user per component ([kafka.users.<component>], each with its own password) and the
[kafka] user, which is the admin (a super user). The brokers run the StandardAuthorizer
with the ACLs `p4bs stack acls` prints, for the config's default topics and groups."""

from __future__ import annotations

import secrets
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from p4bs import paths
from p4bs.config import KafkaConfig
from p4bs.config.model import KAFKA_COMPONENTS
from p4bs_cli.main import main
from p4bs_infra.procs import free_ports, running_pid
from p4bs_infra.stack import Stack

USER_VAR, PASSWORD_VAR = "P4BS_TEST_KAFKA_USER", "P4BS_TEST_KAFKA_PASSWORD"
USER = "p4bs-test"
# Every component but the admin has a user of its own; the admin is [kafka]'s.
OWN_USERS = tuple(c for c in KAFKA_COMPONENTS if c != "admin")


def component_vars(component: str) -> tuple[str, str]:
    upper = component.upper()
    return f"P4BS_TEST_KAFKA_{upper}_USER", f"P4BS_TEST_KAFKA_{upper}_PASSWORD"


@dataclass
class Secured:
    stack: Stack
    password: str  # the [kafka] (admin) user's SCRAM password
    component_passwords: dict[str, str]
    folder: Path  # everything of the run: the stack's state, configs, the parts' logs
    started_s: float

    @property
    def client(self) -> KafkaConfig:
        """The [kafka] settings: the admin's login, the components' by reference."""
        client = self.stack.client
        assert isinstance(client, KafkaConfig)
        return client

    def secrets(self) -> dict[str, str]:
        keystore = (self.stack.kafka.tls_dir / "keystore-password").read_text()
        own = {f"{c} SCRAM password": p for c, p in self.component_passwords.items()}
        return {"SCRAM password": self.password, "keystore password": keystore, **own}


def example_with(sections: dict[str, dict[str, Any]]) -> str:
    """The example config as TOML, each of its sections named in `sections` updated with
    the settings given there."""
    config = tomllib.loads(paths.example_config().read_text())
    for name, settings in sections.items():
        config[name].update(settings)
    return tomli_w.dumps(config)


def client_kafka(secured: Secured) -> dict[str, Any]:
    """The [kafka] settings `p4bs stack up` wrote for the secured stack's clients."""
    settings: dict[str, Any] = tomllib.loads(secured.stack.client_file.read_text())["kafka"]
    return settings


@pytest.fixture(scope="session")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    # A quote: the password passes through librdkafka's properties and the broker's SCRAM
    # exchange (the Flink job names it by reference: its JAAS login refuses '"' and '\').
    password = f"p'{secrets.token_urlsafe(18)}"
    patch = pytest.MonkeyPatch()
    patch.setenv(USER_VAR, USER)
    patch.setenv(PASSWORD_VAR, password)
    component_passwords = {}
    users: dict[str, dict[str, dict[str, str]]] = {}
    for component in OWN_USERS:
        user_var, password_var = component_vars(component)
        component_passwords[component] = secrets.token_urlsafe(18)
        patch.setenv(user_var, f"p4bs-{component.replace('_', '-')}")
        patch.setenv(password_var, component_passwords[component])
        users[component] = {"username": {"env": user_var}, "password": {"env": password_var}}
    folder = tmp_path_factory.mktemp("secured")
    kafka, controller, internal, influx, rpc = free_ports(5)
    config = folder / "stack.toml"
    config.write_text(
        example_with(
            {
                "kafka": {
                    "bootstrap": f"127.0.0.1:{kafka}",
                    "security": "sasl_ssl",
                    "username": {"env": USER_VAR},
                    "password": {"env": PASSWORD_VAR},
                    "users": users,
                },
                "influxdb": {"url": f"http://127.0.0.1:{influx}"},
            }
        )
    )
    state = folder / "state"
    began = time.monotonic()
    code = main(
        [
            *("stack", "up", "--config", str(config), "--state-dir", str(state)),
            *("--kafka-controller-port", str(controller)),
            *("--kafka-internal-port", str(internal)),
            *("--influx-rpc-port", str(rpc), "--timeout", "180"),
        ]
    )
    started_s = time.monotonic() - began
    stack = Stack.from_state(state)
    try:
        assert code == 0, (state / "kafka" / "kafka.log").read_text()[-3000:]
        yield Secured(stack, password, component_passwords, folder, started_s)
    finally:
        stack.down()
        patch.undo()
    assert running_pid(state / "kafka" / "kafka.pid") is None
