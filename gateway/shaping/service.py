"""What the server calls to shape a request: the snapshot's shaper, with the process's
stability model and local prefix view."""

from __future__ import annotations

from typing import Any

from gateway.cachestats.chain import checkpoints
from gateway.cachestats.prefix import GEOMETRY, LocalPrefixes
from gateway.context import RequestContext
from gateway.errors import InvalidRequestError
from gateway.replicas.affinity import PREFIX_HASH
from gateway.shaping.probe import PROBED
from gateway.shaping.stability import StabilityModel
from gateway.shaping.tokens import TOKENIZERS
from gateway.store.writer import StatsWriter

_GATEWAY_METADATA = ("switchyard_tier", "switchyard_template")
TEMPLATE_MAX_CHARS = 200


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


def template_hint(header: str | None, metadata: str | None) -> str | None:
    """The template the client names (``x-switchyard-template``, else
    ``metadata.switchyard_template``), or None. The name goes into Redis field names, where
    ``|`` separates a deployment, key, template and metric, and into the cache report: it
    must be at most :data:`TEMPLATE_MAX_CHARS` printable characters without ``|`` (a header
    that is not UTF-8 reads as unprintable), else the request is refused (400)."""
    for value, param in ((header, "x-switchyard-template"), (metadata, "metadata.switchyard_template")):
        if value:
            if len(value) > TEMPLATE_MAX_CHARS or "|" in value or not value.isprintable():
                raise InvalidRequestError(
                    f"{param} names a prompt template: at most {TEMPLATE_MAX_CHARS} printable"
                    " UTF-8 characters, without '|'.",
                    param=param,
                    code="invalid_template",
                )
            return value
    return None


class ShapingState:
    """What shaping learns and remembers in this process, across requests and policy reloads:
    the stability model (synced with Redis) and the local prefix view. The per-policy
    :class:`~gateway.shaping.shaper.PolicyShaper` comes with the request's snapshot."""

    def __init__(self) -> None:
        self.stability = StabilityModel()
        self.prefixes = LocalPrefixes()
        self._probed_for: object = None  # the last policy whose vLLM templates were asked about

    def shape(
        self,
        ctx: RequestContext,
        body: dict[str, Any],
        writer: StatsWriter | None,
        template: str | None,
        tools_json: bytes | None = None,
    ) -> None:
        """Shape a chat body in place; keep the result and the prompt's checkpoint chain on ``ctx``.
        ``tools_json``: the body's tool list as compact JSON, if the caller has it."""
        policy = ctx.snapshot.policy
        if policy is not self._probed_for:
            # What each vLLM deployment's chat template accepts, asked once (in the background;
            # until it answers, its default placement holds).
            self._probed_for = policy
            PROBED.ask(policy)
            TOKENIZERS.ask(policy)  # a launched model's own tokenizer, loaded in the background
        ctx.shape = shape = ctx.snapshot.shaper.shape(body, self.stability, writer, template, tools_json)
        ctx.prefix_chain = checkpoints(body, shape.rendered_tools)
        # Replica affinity follows the shaped stable prefix (tools and the head's stable
        # units), not the body's whole system message: a date in it moved, and the template's
        # requests share one home replica. A client's own cache key wins. The variable is the
        # request task's (a hedge's task inherits it); set on every shaped request, so that
        # none inherits another's.
        keyed = shape.prefix_hash and "prompt_cache_key" not in body
        PREFIX_HASH.set(int(shape.prefix_hash, 16) if keyed else None)

    def prefix_hit(self, ctx: RequestContext) -> None:
        """This replica's expectation of cached tokens for the deployment that answers."""
        if ctx.prefix_chain is not None and ctx.deployment is not None:
            ttl_s = ctx.snapshot.policy.shaping.cache_ttl_s
            spec = ctx.snapshot.policy.deployments.get(ctx.deployment)
            if spec is not None and spec.provider == "vllm":  # counted in vLLM's blocks and tokens
                GEOMETRY.use_vllm(ctx.deployment, spec.launch.block_size if spec.launch else None)
            ctx.prefix_hit_tokens = self.prefixes.expect_and_add(ctx.deployment, ctx.prefix_chain, ttl_s)
            if ctx.shape is not None:
                # The stable prefix in the deployment's own tokens: counted by its model's
                # tokenizer where Switchyard reads it, else estimated (bytes per token
                # calibrated by its replies; the shaper counted 4 bytes a token); an estimate
                # never more than the prompt's.
                shape = ctx.shape
                counted = TOKENIZERS.stable_tokens(ctx.deployment, shape.prefix_hash, shape.stable_texts)
                if counted is not None:
                    shape.stable_prefix_tokens = counted
                    return
                chain = ctx.prefix_chain
                prompt = GEOMETRY.estimate(ctx.deployment, getattr(chain, "prompt_bytes", 0))
                stable = GEOMETRY.estimate(ctx.deployment, 4 * shape.stable_prefix_tokens)
                shape.stable_prefix_tokens = min(stable, prompt) if prompt else stable
