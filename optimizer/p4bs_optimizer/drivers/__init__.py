"""Router drivers behind one interface (`base.RouterDriver`), one module each: gNMI, NETCONF
(OpenConfig), Junos (NETCONF, class-of-service) and Linux tc. `driver_for` makes the one a
router's config names (`driver`, one of `p4bs.config.ROUTER_DRIVERS`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from p4bs.config import LinkConfig, RouterConfig
from p4bs_optimizer.drivers.base import DEFAULT_ATTEMPTS, DEFAULT_BACKOFF_NS, RouterDriver


# Each maker imports its driver's module when called: a driver pulls in its own client
# library (grpc, ncclient), and a process needs only the ones its routers use.
def _gnmi(
    router: RouterConfig, links: Sequence[LinkConfig], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.gnmi import GnmiDriver

    return GnmiDriver(router, attempts=attempts, backoff_ns=backoff)


def _netconf(
    router: RouterConfig, links: Sequence[LinkConfig], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.netconf import NetconfDriver

    return NetconfDriver(router, attempts=attempts, backoff_ns=backoff)


def _netconf_junos(
    router: RouterConfig, links: Sequence[LinkConfig], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.junos import JunosDriver

    junos = {k.interface: (k.junos, k.capacity_bps) for k in links if k.junos is not None}
    return JunosDriver(router, links=junos, attempts=attempts, backoff_ns=backoff)


def _linux_tc(
    router: RouterConfig, links: Sequence[LinkConfig], attempts: int, backoff: int
) -> RouterDriver:
    from p4bs_optimizer.drivers.linux_tc import LinuxTcDriver

    return LinuxTcDriver(router, attempts=attempts, backoff_ns=backoff)


DriverMaker = Callable[[RouterConfig, Sequence[LinkConfig], int, int], RouterDriver]
DRIVERS: dict[str, DriverMaker] = {
    "gnmi": _gnmi,
    "netconf": _netconf,
    "netconf-junos": _netconf_junos,
    "linux-tc": _linux_tc,
}


def driver_for(
    router: RouterConfig,
    *,
    links: Sequence[LinkConfig] = (),
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_ns: int = DEFAULT_BACKOFF_NS,
) -> RouterDriver:
    """The driver `router.driver` names. `links` (the router's) give the netconf-junos driver
    each link's Junos names and the capacity it converts bytes to microseconds with."""
    try:
        make = DRIVERS[router.driver]
    except KeyError:
        raise ValueError(f"router {router.name}: no driver {router.driver!r}") from None
    return make(router, [k for k in links if k.router == router.name], attempts, backoff_ns)
