"""What the server calls to shape a request: the snapshot's shaper, with the process's
stability model and local prefix view."""

from __future__ import annotations

from typing import Any

from gateway.cachestats.prefix import GEOMETRY, LocalPrefixes, checkpoints
from gateway.context import RequestContext
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


class ShapingState:
    """What shaping learns and remembers in this process, across requests and policy reloads:
    the stability model (synced with Redis) and the local prefix view. The per-policy
    :class:`~gateway.shaping.shaper.PolicyShaper` comes with the request's snapshot."""

    def __init__(self) -> None:
        self.stability = StabilityModel()
        self.prefixes = LocalPrefixes()

    def shape(
        self, ctx: RequestContext, body: dict[str, Any], writer: StatsWriter | None, template: str | None
    ) -> None:
        """Shape a chat body in place; keep the result and the prompt's checkpoint chain on ``ctx``."""
        ctx.shape = ctx.snapshot.shaper.shape(body, self.stability, writer, template)
        ctx.prefix_chain = checkpoints(body, ctx.shape.rendered_tools)

    def prefix_hit(self, ctx: RequestContext) -> None:
        """This replica's expectation of cached tokens for the deployment that answers."""
        if ctx.prefix_chain is not None and ctx.deployment is not None:
            ttl_s = ctx.snapshot.policy.shaping.cache_ttl_s
            spec = ctx.snapshot.policy.deployments.get(ctx.deployment)
            if spec is not None and spec.provider == "vllm":  # counted in vLLM's blocks and tokens
                GEOMETRY.use_vllm(ctx.deployment, spec.launch.block_size if spec.launch else None)
            ctx.prefix_hit_tokens = self.prefixes.expect_and_add(ctx.deployment, ctx.prefix_chain, ttl_s)
