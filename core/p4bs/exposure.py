"""Who may reach a server the project runs: one rule for the dashboard and every Prometheus
endpoint. A server on the loopback (a loopback IP address, or localhost) is this machine's
alone; one on any other address is reachable from the network, and needs a token and TLS."""

from __future__ import annotations

import ipaddress


class ExposureError(ValueError):
    """A server would be reachable beyond this machine without a token and TLS (or its
    address is not one the rule can judge); the message says what to give."""


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP address, or localhost; IPv6 with or without brackets) is this
    machine's loopback. ExposureError for a host name: what it resolves to is not known
    here."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        raise ExposureError(f"{host!r}: an IP address or localhost") from None


def check_exposure(
    host: str, *, token: bool, tls: bool, where: str, what: str, remedy: str
) -> None:
    """Refuses (ExposureError) a server on `host` reachable beyond this machine without a
    token and TLS. `where` names the setting, `what` the server, `remedy` how to give both."""
    try:
        loopback = is_loopback(host)
    except ExposureError as exc:
        raise ExposureError(f"{where}: {exc}") from None
    if not loopback and not (token and tls):
        raise ExposureError(f"{where} exposes {what} beyond this machine: {remedy}")
