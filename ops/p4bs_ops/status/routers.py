"""The routers' check: each router with a link read through its driver (queue 0 of one of its
links' interfaces)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

from p4bs.config import Config, LinkConfig, RouterConfig
from p4bs.units import duration_for_bytes, format_size_bytes
from p4bs_ops.status.runner import (
    GRACE_NS,
    PartStatus,
    StatusOptions,
    describe_error,
    part_check,
)


@part_check("routers")
def check_routers(config: Config, options: StatusOptions) -> PartStatus:
    """Each router with a link, read through its driver: queue 0 of its first link's
    interface, one attempt within the timeout (the router's own if shorter)."""
    routers: dict[str, dict[str, Any]] = {}
    probes: list[tuple[RouterConfig, LinkConfig]] = []
    for router in config.routers:
        link = next((k for k in config.links if k.router == router.name), None)
        if link is None:
            routers[router.name] = {"driver": router.driver, "checked": False, "note": "no link"}
            continue
        probes.append((router, link))
    answers = asyncio.run(_read_routers(config, probes, options.timeout_ns))
    failed = []
    for (router, link), answer in zip(probes, answers, strict=True):
        entry: dict[str, Any] = {
            "driver": router.driver,
            "address": router.address,
            "interface": link.interface,
            "queue": 0,
        }
        if isinstance(answer, int):
            entry["reachable"] = True
            entry["buffer_bytes"] = answer
            entry["drains_in_ns"] = duration_for_bytes(answer, link.capacity_bps)
        else:
            entry["reachable"] = False
            entry["error"] = answer
            failed.append(f"{router.name}: {answer}")
        routers[router.name] = entry
    details = {"routers": routers}
    if failed:
        return PartStatus("routers", False, "; ".join(failed), details)
    read = [
        f"{name} {format_size_bytes(r['buffer_bytes'])}"
        for name, r in routers.items()
        if r.get("reachable")
    ]
    summary = f"{len(read)} router{'s' if len(read) != 1 else ''} answered: {', '.join(read)}"
    if not read:
        summary = "no router with a link to read"
    return PartStatus("routers", True, summary, details)


async def _read_routers(
    config: Config, probes: list[tuple[RouterConfig, LinkConfig]], timeout_ns: int
) -> list[int | str]:
    return list(await asyncio.gather(*(_read_router(config, r, k, timeout_ns) for r, k in probes)))


async def _read_router(
    config: Config, router: RouterConfig, link: LinkConfig, timeout_ns: int
) -> int | str:
    """Queue 0's buffer in bytes, or why it could not be read."""
    from p4bs_optimizer.drivers import driver_for
    from p4bs_optimizer.drivers.base import DriverError

    bounded = dataclasses.replace(router, timeout_ns=min(router.timeout_ns, timeout_ns))
    try:
        driver = driver_for(bounded, links=config.links, attempts=1)
    except Exception as exc:  # a driver that cannot be made (its library, its address)
        return f"driver {router.driver}: {describe_error(exc)}"
    try:
        # The driver cuts an attempt at its timeout; this bounds the rest (connecting a
        # library that ignores it, closing).
        return await asyncio.wait_for(
            driver.get_buffer(link.interface, 0), timeout_ns / 1e9 + GRACE_NS / 2e9
        )
    except DriverError as exc:
        return f"{exc.kind}: {exc.message}"
    except TimeoutError:
        return f"no answer within {timeout_ns / 1e9:g} s"
    except Exception as exc:
        return describe_error(exc)
    finally:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing to do
            await asyncio.wait_for(driver.close(), 1.0)
