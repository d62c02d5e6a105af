"""What the server calls to shape a request: shapers per policy, the stability model, the prefix view."""

from __future__ import annotations

from typing import Any

from gateway.cachestats.prefix import LocalPrefixes, checkpoints
from gateway.context import RequestContext
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import Shaper
from gateway.shaping.stability import StabilityModel
from gateway.store.writer import StatsWriter

_GATEWAY_METADATA = ("switchyard_tier", "switchyard_template")


def pop_gateway_metadata(body: dict[str, Any]) -> dict[str, str]:
    """Take the gateway-only keys out of ``metadata`` (they must not reach the upstream)."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or not any(k in metadata for k in _GATEWAY_METADATA):
        return {}
    taken = {k: str(metadata[k]) for k in _GATEWAY_METADATA if k in metadata}
    rest = {k: v for k, v in metadata.items() if k not in _GATEWAY_METADATA}
    if rest:
        body["metadata"] = rest
    else:
        del body["metadata"]
    return taken


class Shaping:
    """Per process: the shapers of the policies in use, the stability model, the local prefix view."""

    def __init__(self) -> None:
        self.stability = StabilityModel()
        self.prefixes = LocalPrefixes()
        self._shapers: dict[int, Shaper] = {}

    def _shaper(self, policy: ShapingPolicy) -> Shaper:
        found = self._shapers.get(id(policy))
        if found is None or found.policy is not policy:
            if len(self._shapers) > 8:
                self._shapers.clear()
            found = self._shapers[id(policy)] = Shaper(policy)
        return found

    def shape(
        self, ctx: RequestContext, body: dict[str, Any], writer: StatsWriter | None, template: str | None
    ) -> None:
        """Shape a chat body in place; keep the result and the prompt's checkpoint chain on ``ctx``."""
        policy = ctx.snapshot.policy.shaping
        ctx.shape = self._shaper(policy).shape(body, self.stability, writer, template)
        ctx.prefix_chain = checkpoints(body)

    def prefix_hit(self, ctx: RequestContext) -> None:
        """This replica's expectation of cached tokens for the deployment that answers."""
        if ctx.prefix_chain is not None and ctx.deployment is not None:
            ttl_s = ctx.snapshot.policy.shaping.cache_ttl_s
            ctx.prefix_hit_tokens = self.prefixes.expect_and_add(ctx.deployment, ctx.prefix_chain, ttl_s)
