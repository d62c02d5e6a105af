"""Which requests the response cache may answer, and the key of their entry.

The key is a hash of the request in canonical JSON (object keys sorted; tools and response
schemas in the canonical form shaping gives them, :mod:`gateway.shaping.canonical`, so a
schema's property order, which changes what a model generates, still tells two requests
apart), the model of the deployment that answers, the endpoint's kind of answer, and the
tenant's namespace. A lookup only ever finds its own namespace's entries: a tenant cannot
learn, by header or by timing, what another tenant asked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache.policy import CachePolicy
from gateway.shaping.canonical import canonical_wrapper

KINDS = {"/chat/completions": "chat", "/responses": "responses"}
"""The pipeline endpoints whose answers are cached, and the form their entries hold."""

_UNKEYED = frozenset({"model", "stream", "stream_options", "store"})
"""Fields that do not change the answer's content: the model is keyed as the deployment's."""

PREFIX = "sy:rc:"
"""Every entry's Redis key starts so: ``sy:rc:<namespace>:<hash>``."""


@dataclass(slots=True)
class CachePlan:
    """What the cache does for one request; ``outcome`` is its ``x-switchyard-cache`` header."""

    kind: str
    digest: bytes
    read: bool
    write: bool
    namespace: str
    outcome: str = "bypass"
    key: str = ""
    deployment: str = ""
    ttl_s: float = 0.0
    max_bytes: int = 0

    @property
    def prompt_id(self) -> str:
        """The entry's id as ``switchyard cache`` shows it."""
        return self.key.rpartition(":")[2]


def namespace_of(policy: CachePolicy, key_id: str | None, key_name: str | None) -> str | None:
    """The key's namespace, or None when the policy denies it the cache."""
    spec = policy.keys.get(key_id or "-")
    if spec is None and key_name is not None:
        spec = policy.keys.get(key_name)
    if spec is not None and not spec.enabled:
        return None
    if spec is not None and spec.namespace:
        return spec.namespace
    return f"k:{key_id}" if key_id is not None else "-"


def deterministic(body: Mapping[str, Any]) -> bool:
    """Temperature 0 or a seed: the client asked for an answer that repeats."""
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0:
        return True
    return body.get("seed") is not None


def client_directives(headers: Mapping[str, str]) -> tuple[bool, bool]:
    """``(read, write)`` as the client allows them: ``Cache-Control: no-cache`` or
    ``x-switchyard-cache: refresh`` skip the lookup, ``Cache-Control: no-store`` the store."""
    control = headers.get("Cache-Control", "").lower()
    read = "no-cache" not in control and headers.get("x-switchyard-cache", "").lower() != "refresh"
    return read, "no-store" not in control


def canonical_request(body: Mapping[str, Any]) -> bytes:
    """The request's fields that shape its answer, in one byte form per meaning."""
    plain: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for name, value in body.items():
        if name in _UNKEYED:
            continue
        if name in ("tools", "functions") and isinstance(value, list):
            schemas[name] = [canonical_wrapper(tool) for tool in value]
        elif name == "response_format":
            schemas[name] = canonical_wrapper(value)
        elif name == "text" and isinstance(value, dict):
            schemas[name] = {
                k: canonical_wrapper(v) if k == "format" else v for k, v in sorted(value.items())
            }
        else:
            plain[name] = value
    # Only the schema objects keep their properties' order: the rest is sorted by orjson.
    return orjson.dumps(plain, option=orjson.OPT_SORT_KEYS) + b"\x00" + orjson.dumps(sorted(schemas.items()))


def plan_request(
    policy: CachePolicy,
    endpoint: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    key_id: str | None,
    key_name: str | None,
) -> CachePlan | None:
    """The cache's plan for a request before it is shaped (None: the cache is not for it).
    The key's hash is finished by :func:`settle` once the deployment is known."""
    kind = KINDS.get(endpoint)
    if kind is None:
        return None
    namespace = namespace_of(policy, key_id, key_name)
    if namespace is None:
        return None
    read, write = client_directives(headers)
    n = body.get("n")
    if (
        (isinstance(n, int) and n > 1)
        or (policy.deterministic_only and not deterministic(body))
        or body.get("previous_response_id") is not None
    ):
        return CachePlan(kind, b"", False, False, namespace)
    try:
        canonical = canonical_request(body)
    except (TypeError, orjson.JSONEncodeError):
        return CachePlan(kind, b"", False, False, namespace)
    digest = hashlib.blake2b(canonical, digest_size=20, person=kind.encode()).digest()
    outcome = "miss" if read else "bypass"
    return CachePlan(kind, digest, read, write, namespace, outcome)


def settle(
    plan: CachePlan, policy: CachePolicy, tier: str | None, deployment: str, model: str
) -> CachePlan | None:
    """The plan for the routed deployment (None when its answers are not cached), its
    entry's key, TTL and size bound set."""
    if not policy.enabled_for(tier, deployment):
        return None
    plan.deployment = deployment
    if plan.digest:
        h = hashlib.blake2b(plan.digest + model.encode(), digest_size=16).hexdigest()
        plan.key = f"{PREFIX}{plan.namespace}:{h}"
        plan.ttl_s = policy.ttl_for(tier, deployment, plan.namespace)
        plan.max_bytes = policy.max_bytes_for(plan.namespace)
    return plan
