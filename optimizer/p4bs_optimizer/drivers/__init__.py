"""Router drivers behind one interface (`base.RouterDriver`), one module each: gNMI, NETCONF
(OpenConfig and Junos) and Linux tc. `driver_for` makes the one a router's config names
(`driver`, one of `p4bs.config.ROUTER_DRIVERS`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from p4bs.config import RouterConfig
from p4bs_optimizer.drivers.base import DEFAULT_ATTEMPTS, DEFAULT_BACKOFF_NS, RouterDriver


# Each maker imports its driver's module when called: a driver pulls in its own client
# library (grpc, ncclient), and a process needs only the ones its routers use.
def _gnmi(
    router: RouterConfig, rates: Mapping[str, int], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.gnmi import GnmiDriver

    return GnmiDriver(router, attempts=attempts, backoff_ns=backoff)


def _netconf(
    router: RouterConfig, rates: Mapping[str, int], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.netconf import NetconfDriver

    return NetconfDriver(router, attempts=attempts, backoff_ns=backoff)


def _netconf_junos(
    router: RouterConfig, rates: Mapping[str, int], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.netconf import JunosNetconfDriver

    return JunosNetconfDriver(router, line_rates_bps=rates, attempts=attempts, backoff_ns=backoff)


def _linux_tc(
    router: RouterConfig, rates: Mapping[str, int], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.linux_tc import LinuxTcDriver

    return LinuxTcDriver(router, attempts=attempts, backoff_ns=backoff)


DriverMaker = Callable[[RouterConfig, Mapping[str, int], int, int], RouterDriver]
DRIVERS: dict[str, DriverMaker] = {
    "gnmi": _gnmi,
    "netconf": _netconf,
    "netconf-junos": _netconf_junos,
    "linux-tc": _linux_tc,
}


def driver_for(
    router: RouterConfig,
    *,
    line_rates_bps: Mapping[str, int] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_ns: int = DEFAULT_BACKOFF_NS,
) -> RouterDriver:
    """The driver `router.driver` names. `line_rates_bps` (interface -> bit/s, the links'
    capacities) is what the netconf-junos driver converts bytes to microseconds with."""
    try:
        make = DRIVERS[router.driver]
    except KeyError:
        raise ValueError(f"router {router.name}: no driver {router.driver!r}") from None
    return make(router, line_rates_bps or {}, attempts, backoff_ns)
