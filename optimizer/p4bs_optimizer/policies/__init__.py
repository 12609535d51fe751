"""Buffer-sizing policies, one module each, behind `base.Policy`; `policy_for` makes the one
a link's config names (`policy`, `policy_options`)."""

from __future__ import annotations

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.base import Policy, PolicyOptionError
from p4bs_optimizer.policies.baselines import (
    AdtPolicy,
    BdpPolicy,
    BloatedPolicy,
    BsclPolicy,
    StanfordPolicy,
    StaticPolicy,
    StepPolicy,
    TinyPolicy,
)
from p4bs_optimizer.policies.globecom import GlobecomPolicy
from p4bs_optimizer.policies.jenks import JenksPolicy
from p4bs_optimizer.policies.loss_delay_fit import LossDelayFitPolicy
from p4bs_optimizer.policies.p4bs import P4bsPolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        StaticPolicy,
        BdpPolicy,
        StanfordPolicy,
        TinyPolicy,
        BloatedPolicy,
        BsclPolicy,
        AdtPolicy,
        StepPolicy,
        GlobecomPolicy,
        P4bsPolicy,
        LossDelayFitPolicy,
        JenksPolicy,
    )
}


def policy_for(link: LinkConfig) -> Policy:
    """The link's policy with its options (PolicyOptionError names an unknown policy or a bad
    option)."""
    try:
        cls = POLICIES[link.policy]
    except KeyError:
        known = ", ".join(POLICIES)
        raise PolicyOptionError(f"policy: no policy {link.policy!r} (one of {known})") from None
    return cls(link, link.policy_options)
