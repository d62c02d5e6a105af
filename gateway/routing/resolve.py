"""Routing: from the model name a client sent to the deployments that may answer it."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ModelNotFoundError
from gateway.policy import Policy

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: the tier (if any), its candidate deployments in order, and why."""

    tier: str | None
    deployments: tuple[str, ...]
    reason: str

    def header(self) -> str:
        """The ``x-switchyard-route`` value, e.g. ``tier=fast; by=default``."""
        if self.tier is None:
            return f"deployment={self.deployments[0]}; by={self.reason}"
        return f"tier={self.tier}; by={self.reason}"


def tier_route(policy: Policy, tier: str, reason: str) -> Route:
    return Route(tier=tier, deployments=tuple(m.deployment for m in policy.tiers[tier]), reason=reason)


def resolve(policy: Policy, model: str) -> Route:
    """The route for ``model``: a deployment, a tier, an alias of either, or ``auto``.

    Raises :class:`ModelNotFoundError` for a name the policy does not know.
    """
    if policy.routing.route_all or model == AUTO:
        return tier_route(policy, policy.routing.default_tier, "default")
    name = policy.aliases.get(model, model)
    if name in policy.deployments:
        return Route(tier=None, deployments=(name,), reason="model")
    if name in policy.tiers:
        return tier_route(policy, name, "model")
    raise ModelNotFoundError(model)


def model_names(policy: Policy) -> list[str]:
    """Every name a client may send: deployments, tiers, aliases and ``auto``."""
    return [*policy.deployments, *policy.tiers, *policy.aliases, AUTO]
