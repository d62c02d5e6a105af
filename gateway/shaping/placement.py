"""Where a request's per-request content may go, given the deployments that may answer it.

Shaping runs before routing, and one shaped body serves every attempt (fallbacks, hedges,
escalation), so the placement must suit every deployment the request can reach: a request
naming a deployment (or an alias of one) reaches that deployment only; a tier, ``auto`` or a
policy that routes everything may reach any of them, and gets the earliest placement any
deployment needs. Compiled once per policy load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.shaping.policy import PLACEMENTS, PROVIDER_PLACEMENT, Placement, ShapingPolicy
from gateway.shaping.probe import PROBED

if TYPE_CHECKING:
    from gateway.policy import Policy


def _earliest(*placements: Placement) -> Placement:
    return min(placements, key=PLACEMENTS.index)


def deployment_placement(
    shaping: ShapingPolicy, name: str, provider: str, probed: Placement | None = None
) -> Placement:
    """The latest placement deployment ``name`` accepts: its own setting, else what its chat
    template was found to accept (``probed``, :mod:`gateway.shaping.probe`), else its
    provider's default (the safest, ``end_of_system``, for a provider without one)."""
    return (
        shaping.deployment_placement.get(name) or probed or PROVIDER_PLACEMENT.get(provider, "end_of_system")
    )


class Placements:
    """Per requested model name, where per-request content goes (the policy's ``placement``,
    capped by what every deployment the name can reach accepts)."""

    def __init__(
        self, by_model: dict[str, Placement], default: Placement, policy: Policy | None = None
    ) -> None:
        self.by_model = by_model
        self.default = default
        self._policy = policy  # compiled again when a probe answers (see __call__)
        self._version = PROBED.version

    @classmethod
    def everywhere(cls, placement: Placement) -> Placements:
        """One placement for every request (a shaper used without a policy's deployments)."""
        return cls({}, placement)

    @classmethod
    def of(cls, policy: Policy) -> Placements:
        """Compile ``policy``'s placements."""
        shaping = policy.shaping
        accepts = {
            name: deployment_placement(shaping, name, spec.provider, PROBED.placement(name, spec))
            for name, spec in policy.deployments.items()
        }
        default = _earliest(shaping.placement, *accepts.values())
        if policy.routing.route_all:
            return cls({}, default, policy)
        by_model = {name: _earliest(shaping.placement, where) for name, where in accepts.items()}
        for alias, target in policy.aliases.items():
            if target in by_model:
                by_model[alias] = by_model[target]
        return cls(by_model, default, policy)

    def __call__(self, model: object) -> Placement:
        """The placement for a request naming ``model`` (compiled again first when a probe
        of a deployment's chat template answered since)."""
        if self._version != PROBED.version and self._policy is not None:
            fresh = Placements.of(self._policy)
            self.by_model, self.default, self._version = fresh.by_model, fresh.default, fresh._version
        return self.by_model.get(model, self.default) if isinstance(model, str) else self.default
