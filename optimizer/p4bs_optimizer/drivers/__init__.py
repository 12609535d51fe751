"""Router drivers behind one interface (`base.RouterDriver`), one module each: gNMI, NETCONF
(OpenConfig), Junos (NETCONF, class-of-service) and Linux tc. `driver_for` makes the one a
router's config names (`driver`, one of `p4bs.config.ROUTER_DRIVERS`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from p4bs.config import LinkConfig, RouterConfig
from p4bs_optimizer.drivers.base import DEFAULT_RETRY, Retry, RouterDriver


# Each maker imports its driver's module when called: a driver pulls in its own client
# library (grpc, ncclient), and a process needs only the ones its routers use.
def _gnmi(router: RouterConfig, links: Sequence[LinkConfig], retry: Retry) -> RouterDriver:
    from p4bs_optimizer.drivers.gnmi import GnmiDriver

    return GnmiDriver(router, retry)


def _netconf(router: RouterConfig, links: Sequence[LinkConfig], retry: Retry) -> RouterDriver:
    from p4bs_optimizer.drivers.netconf import NetconfDriver

    return NetconfDriver(router, retry)


def _netconf_junos(router: RouterConfig, links: Sequence[LinkConfig], retry: Retry) -> RouterDriver:
    from p4bs_optimizer.drivers.junos import JunosDriver

    junos = {k.interface: (k.junos, k.capacity_bps) for k in links if k.junos is not None}
    return JunosDriver(router, links=junos, retry=retry)


def _linux_tc(router: RouterConfig, links: Sequence[LinkConfig], retry: Retry) -> RouterDriver:
    from p4bs_optimizer.drivers.linux_tc import LinuxTcDriver

    return LinuxTcDriver(router, retry)


DriverMaker = Callable[[RouterConfig, Sequence[LinkConfig], Retry], RouterDriver]
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
    attempts: int = DEFAULT_RETRY.attempts,
    backoff_ns: int = DEFAULT_RETRY.backoff_ns,
) -> RouterDriver:
    """The driver `router.driver` names. `links` (the router's) give the netconf-junos driver
    each link's Junos names and the capacity it converts bytes to microseconds with."""
    try:
        make = DRIVERS[router.driver]
    except KeyError:
        raise ValueError(f"router {router.name}: no driver {router.driver!r}") from None
    retry = Retry(attempts, backoff_ns)
    return make(router, [k for k in links if k.router == router.name], retry)
