"""What the optimizer service sets for its process while it runs, and puts back after (also
after a failure): the garbage collector takes its young generation less often
(service.py, GC_YOUNG_THRESHOLD: thousands of a batch's objects alive at once were promoted,
and the full collections over every link's state came seconds apart), and numpy's BLAS runs
on one thread (service.blas_on_one_thread: its idle threads spun beside the loop's GP
fits)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import threadpoolctl

from p4bs import paths
from p4bs.config import load_config
from p4bs_optimizer.service import OptimizerService
from p4bs_optimizer.service.service import GC_YOUNG_THRESHOLD


def test_the_young_generation_is_collected_less_often_while_the_service_runs() -> None:
    before = gc.get_threshold()
    assert before[0] < GC_YOUNG_THRESHOLD
    service = OptimizerService(load_config(paths.example_config()), dry_run=True)
    seen: list[tuple[int, ...]] = []

    async def consume(on_tick: Any) -> None:
        seen.append(gc.get_threshold())
        raise RuntimeError("the consumer failed")

    service._consume = consume  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the consumer failed"):
        asyncio.run(service.run())
    assert seen == [(GC_YOUNG_THRESHOLD, *before[1:])]
    assert gc.get_threshold() == before  # also after a failure


def blas_threads() -> set[int]:
    return {
        lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"
    }


def test_numpy_blas_runs_on_one_thread_while_the_service_runs() -> None:
    service = OptimizerService(load_config(paths.example_config()), dry_run=True)
    seen: list[set[int]] = []

    async def consume(on_tick: Any) -> None:
        seen.append(blas_threads())
        raise RuntimeError("the consumer failed")

    service._consume = consume  # type: ignore[method-assign]
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # as on this machine
        assert blas_threads() == {2}
        with pytest.raises(RuntimeError, match="the consumer failed"):
            asyncio.run(service.run())
        assert seen == [{1}]
        assert blas_threads() == {2}
