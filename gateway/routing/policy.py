"""The ``routing`` section of a policy: which tier answers ``model: auto``."""

from __future__ import annotations

from gateway._model import StrictModel


class RoutingPolicy(StrictModel):
    """How requests are routed to tiers.

    - ``default_tier``: the tier that answers ``model: auto``.
    - ``route_all``: when true, every request goes through the router, whatever model it names.
    """

    default_tier: str = "fast"
    route_all: bool = False
