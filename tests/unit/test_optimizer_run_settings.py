"""What the optimizer service sets for its process while it runs, and puts back after (also
after a failure): the garbage collector takes its young generation less often
(service.py, GC_YOUNG_THRESHOLD: thousands of a batch's objects alive at once were promoted,
and the full collections over every link's state came seconds apart), and numpy's BLAS runs
on one thread (service.blas_on_one_thread: its idle threads spun beside the loop's GP
fits)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import threadpoolctl

from p4bs import paths
from p4bs.config import load_config
from p4bs_optimizer.service import OptimizerService
from p4bs_optimizer.service.service import GC_YOUNG_THRESHOLD

T = TypeVar("T")


def while_running(probe: Callable[[], T]) -> T:
    """What `probe` says while the service runs; its consumer then fails, and the service
    stops as it does on a failure."""
    service = OptimizerService(load_config(paths.example_config()), dry_run=True)
    seen: list[T] = []

    async def consume(on_tick: Any) -> None:
        seen.append(probe())
        raise RuntimeError("the consumer failed")

    service._consume = consume  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the consumer failed"):
        asyncio.run(service.run())
    return seen[0]


def test_the_young_generation_is_collected_less_often_while_the_service_runs() -> None:
    before = gc.get_threshold()
    assert before[0] < GC_YOUNG_THRESHOLD
    assert while_running(gc.get_threshold) == (GC_YOUNG_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before  # also after a failure


def blas_threads() -> set[int]:
    return {
        lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"
    }


def test_numpy_blas_runs_on_one_thread_while_the_service_runs() -> None:
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # as on this machine
        assert blas_threads() == {2}
        assert while_running(blas_threads) == {1}
        assert blas_threads() == {2}
