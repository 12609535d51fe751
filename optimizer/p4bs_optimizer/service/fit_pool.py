"""Where policies that fit a GP do it: the decide threads and the fit processes.

Policies decide on the service's loop: most in microseconds, P4BS in a few milliseconds when a
trial ends and its default search, on the authors' grid, fits its GP (warmed up before the
first window: `warm_up_grid`). A P4BS search on log(buffer) fits with Ax, 0.1-0.3 s
(`decides_off_loop`), so such a link's `decide` runs in one of the decide threads (the
controller's inbox keeps its windows in order meanwhile), and its GP fits run in a pool of
processes, one per core (`optimizer.fit_processes`): fits are Python-bound, so threads could
not run two at once, and each process seeds its own random generators around a fit, so a
search never depends on what other links' fits did. (Handing every window of the grid
searches to a thread cost more than their fits: 200 searching links send 2,000 windows a
second.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import threadpoolctl

from p4bs.config import Config, LinkConfig
from p4bs_optimizer.policies import bayes
from p4bs_optimizer.policies.base import Policy, PolicyOptionError
from p4bs_optimizer.policies.p4bs import P4bsOptions, P4bsPolicy

# How often a fit process looks whether its service is still there.
FIT_PARENT_POLL_S = 1.0
WARM_UP_GRID_STEP_BYTES = 1_000  # the throwaway grid search's (any step will do)


class FitPool:
    """The decide threads (one per fit process) and, when a link of the config searches on
    log(buffer), the fit processes."""

    def __init__(self, config: Config) -> None:
        self.size = config.optimizer.fit_processes or os.cpu_count() or 1
        self._decide_thread = ThreadPoolExecutor(self.size, thread_name_prefix="decide")
        self._processes: ProcessPoolExecutor | None = None
        if any(decides_off_loop(link) for link in config.links):
            # Spawned, not forked: the service runs Kafka clients' threads.
            self._processes = ProcessPoolExecutor(
                self.size, mp_context=multiprocessing.get_context("spawn"), initializer=_fit_worker
            )

    def decide_thread_for(self, link: LinkConfig, policy: Policy) -> ThreadPoolExecutor | None:
        """The decide thread of a link that decides off the loop, None for one that decides
        on it; a P4BS policy's fits go to the fit processes."""
        if not decides_off_loop(link):
            return None
        if isinstance(policy, P4bsPolicy) and self._processes is not None:
            policy.planner = self._plan
        return self._decide_thread

    def _plan(self, spec: bayes.SearchSpec) -> bayes.Plan:
        """A P4BS search's next step, computed in a fit process (the decide thread waits)."""
        assert self._processes is not None
        return self._processes.submit(bayes.plan, spec).result()

    def start(self) -> None:
        """Each fit process imports Ax and torch and fits once as it starts (seconds), before
        the links' first fits come."""
        if self._processes is not None:
            for _ in range(self.size):
                self._processes.submit(int)

    def pids(self) -> list[int]:
        """The fit processes' ids (for their CPU time: tests/bench/optimizer_service.py)."""
        if self._processes is None:
            return []
        return list(self._processes._processes or {})  # the executor names no public way

    def shutdown(self) -> None:
        """Stops taking work; a decision or fit under way is left to end on its own."""
        self._decide_thread.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)


def warm_up_grid(links: Iterable[LinkConfig]) -> float | None:
    """Fits a throwaway grid GP when a link fits one on the loop, before the first window:
    the first fit would otherwise hold the loop, and every link's windows with it, while it
    imports numpy and scipy (bayes.warm_up). Its seconds; None when no link needs it."""
    if not any(fits_on_loop(link) for link in links):
        return None
    return bayes.warm_up(WARM_UP_GRID_STEP_BYTES)


def _p4bs_options(link: LinkConfig) -> P4bsOptions | None:
    """A P4BS link's options; None for another policy's link, or for options the link's
    controller refuses (it reports them when it is made)."""
    if link.policy != P4bsPolicy.name:
        return None
    try:
        return P4bsOptions.parse(link.policy_options)
    except PolicyOptionError:
        return None


def decides_off_loop(link: LinkConfig) -> bool:
    """A link whose `decide` may hold the loop for long: a P4BS search on log(buffer), which
    fits its GP with Ax when a trial ends (0.1-0.3 s; the authors' grid search, P4BS's
    default, a few ms: tests/bench/ax_decision.py)."""
    options = _p4bs_options(link)
    return options is not None and options.grid_step_ns == 0


def fits_on_loop(link: LinkConfig) -> bool:
    """A link whose policy fits a GP on the loop: P4BS on the authors' grid."""
    options = _p4bs_options(link)
    return options is not None and options.grid_step_ns > 0


def _fit_worker() -> None:
    """A fit process as it starts: Ctrl-C is the service's to handle (it stops the pool), it
    ends with its service, Ax and torch are loaded and a first GP fitted before any link's
    fit comes, and numpy's and scipy's BLAS, loaded by then, run on one thread as torch does
    (bayes.load_ax; why: service.blas_on_one_thread)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    service = os.getppid()
    threading.Thread(target=_exit_with, args=(service,), name="service", daemon=True).start()
    bayes.warm_up()
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")


def _exit_with(service: int) -> None:
    """Ends this fit process once its service is gone (the process is then re-parented): a
    killed service cannot stop its pool, whose processes would otherwise stay for ever."""
    while os.getppid() == service:
        time.sleep(FIT_PARENT_POLL_S)  # a poll: a parent's death gives nothing to wait on
    os._exit(0)
