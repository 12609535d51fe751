"""A P4BS link's Bayesian search as its optimizer state holds it (P4BS Fig. 7, live): the
observations, the GP's posterior mean and band and the Expected Improvement over the
buffer range, and the next trial.

The search is rebuilt exactly as the optimizer has it: the policy restored from the state's
snapshot gives the search's spec (bounds, seed, observations, grid), and
`p4bs_optimizer.policies.bayes.BufferSearch` fits the same GP (a search is a pure function of
its spec). The authors' grid search (P4BS's default) fits in milliseconds; a continuous
search imports Ax and torch the first time one is shown (seconds, ~0.7 GB).
"""

from __future__ import annotations

from typing import Any

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.bayes import BufferSearch
from p4bs_optimizer.policies.p4bs import OPTIMISE, P4bsPolicy

GRID_POINTS = 200  # of a continuous search's curves (a grid search shows its own grid)


class NoSearch(Exception):
    """The link has no Bayesian search to show; the message says why."""


def search_view(link: LinkConfig, state: dict[str, Any] | None) -> dict[str, Any]:
    """The search of the link's newest optimizer `state` (an OptimizerLinkState record, its
    snapshot decoded). Buffers in bytes, f unitless. Raises NoSearch when there is none."""
    if state is None:
        raise NoSearch(f"link {link.id} has no optimizer state yet")
    if state["policy"] != P4bsPolicy.name:
        raise NoSearch(
            f"link {link.id} runs policy {state['policy']!r}: only {P4bsPolicy.name!r} "
            "searches with a Gaussian process"
        )
    if not isinstance(state["policy_state"], dict):
        raise NoSearch(f"link {link.id}: its optimizer state's policy snapshot is not readable")
    policy = P4bsPolicy(link, link.policy_options)
    refused = policy.restore(state["policy_state"])
    if refused is not None:
        raise NoSearch(f"link {link.id}: its optimizer state's policy snapshot: {refused}")
    step = policy.step
    view: dict[str, Any] = {
        "link_id": link.id,
        "state_ts_ns": state["ts_ns"],
        "phase": policy.phase,
        "bound_points": [o._asdict() for o in policy.bound_points],
        "low_bytes": policy.low_bytes,
        "high_bytes": policy.high_bytes,
        "observations": [],
        "grid": [],
        "mean": [],
        "std": [],
        "ei": [],
        "suggestion_bytes": None,
        "max_ei": None,
        # The buffer being measured now: a trial's when the search is on.
        "measuring": {"buffer_bytes": step.buffer_bytes, "trial": step.trial} if step else None,
        "incumbent": policy.incumbent._asdict() if policy.incumbent else None,
    }
    if policy.high_bytes <= policy.low_bytes:
        return view  # the bound search has not found the range yet
    spec = policy.search_spec()  # the spec the optimizer's next step is computed from
    view["observations"] = [o._asdict() for o in spec.observations]
    if not spec.observations:
        return view
    search = BufferSearch(**spec._asdict())  # a spec's fields are the search's arguments
    grid = search.grid(GRID_POINTS)
    mean, std = search.posterior(grid)
    ei = search.expected_improvement(grid)
    view.update(
        grid=grid,
        mean=mean,
        std=std,
        ei=ei,
        max_ei=max(ei),
        suggestion_bytes=search.suggest() if policy.phase == OPTIMISE else None,
    )
    return view
