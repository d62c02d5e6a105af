"""The policy's ``cache:`` section: which answers the response cache keeps, for whom, how long.

Off unless a policy turns it on: for the whole policy (``enabled``), a tier or a
deployment (``tiers.<name>`` / ``deployments.<name>``, the deployment's setting winning),
and per virtual key (``keys.<key id or name>``: denied, or given a namespace that keys
sharing it read and write together). Redis evicts entries (their TTL, and Redis's own
``maxmemory`` policy); the gateway never deletes to make room.
"""

from __future__ import annotations

import functools
import importlib.util

from pydantic import Field

from gateway.validation import Issue, Seconds, StrictModel

SEMANTIC_INSTALL_HINT = "pip install 'switchyard[semantic]'"


def missing_extra() -> str | None:
    """What the semantic cache lacks to run, with the fix; None when it can run."""
    for module in ("faiss", "numpy", "tokenizers", "wordllama"):
        if importlib.util.find_spec(module) is None:
            return f"the semantic cache needs the '{module}' package: {SEMANTIC_INSTALL_HINT}"
    return None


_NAMESPACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class CacheScope(StrictModel):
    """The cache for one tier or deployment (unset fields inherit the policy's)."""

    enabled: bool | None = Field(None, description="Cache this tier's or deployment's answers.")
    ttl_s: Seconds | None = Field(None, gt=0, description="How long an entry is kept.")


class KeyCache(StrictModel):
    """One virtual key's access to the cache."""

    enabled: bool = Field(True, description="false: the key never reads nor writes the cache.")
    namespace: str | None = Field(
        None,
        description="A namespace the operator shares between keys (they serve each other's "
        "entries); default: the key's own.",
    )


class NamespaceLimits(StrictModel):
    """Bounds of one namespace's entries (unset fields inherit the policy's)."""

    ttl_s: Seconds | None = Field(None, gt=0, description="How long an entry is kept.")
    max_entry_bytes: int | None = Field(None, ge=1, description="Larger answers are not stored.")


class SemanticCache(StrictModel):
    """The semantic cache: a request whose last user turn is close enough to a stored one's
    (and whose conversation before it is the same, byte for byte) gets that answer."""

    enabled: bool = Field(False, description="Also serve the nearest stored answer above threshold.")
    threshold: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Cosine similarity of the last user turns' static embeddings a hit needs.",
    )
    max_entries: int = Field(
        10_000, ge=1, description="Most vectors kept per conversation context and namespace."
    )


class CachePolicy(StrictModel):
    """The response cache: a repeated request answered from Redis without calling upstream."""

    enabled: bool = Field(False, description="Cache answers of every tier and deployment.")
    ttl_s: Seconds = Field(3600.0, gt=0, description="How long an entry is kept (Redis expires it).")
    max_entry_bytes: int = Field(262_144, ge=1, description="Answers larger than this are not stored.")
    deterministic_only: bool = Field(
        True,
        description="Only cache requests whose answer is meant to repeat: temperature 0 or a "
        "seed set. false: cache any request (n > 1 never is).",
    )
    store_length: bool = Field(
        False, description="Also store answers cut by max_tokens (finish_reason length)."
    )
    tiers: dict[str, CacheScope] = Field(default_factory=dict, description="Per tier.")
    deployments: dict[str, CacheScope] = Field(default_factory=dict, description="Per deployment.")
    keys: dict[str, KeyCache] = Field(
        default_factory=dict, description="Per virtual key, by its id or its name."
    )
    namespaces: dict[str, NamespaceLimits] = Field(
        default_factory=dict, description="Per namespace (a shared one, or k:<key id>)."
    )
    semantic: SemanticCache = Field(default_factory=SemanticCache)

    @functools.cached_property
    def active(self) -> bool:
        """Whether any request may use the cache (the request path's one check when off).
        Kept in the instance's ``__dict__``: a private attribute of a pydantic model is read
        through ``__getattr__``, 2.6 µs a request."""
        return self.enabled or any(s.enabled for s in (*self.tiers.values(), *self.deployments.values()))

    def enabled_for(self, tier: str | None, deployment: str) -> bool:
        """Whether answers of ``deployment`` (reached through ``tier``) are cached."""
        scope = self.deployments.get(deployment)
        if scope is not None and scope.enabled is not None:
            return scope.enabled
        scope = self.tiers.get(tier) if tier is not None else None
        if scope is not None and scope.enabled is not None:
            return scope.enabled
        return self.enabled

    def ttl_for(self, tier: str | None, deployment: str, namespace: str) -> float:
        """An entry's TTL: the namespace's, the deployment's, the tier's, else the policy's."""
        limits = self.namespaces.get(namespace)
        for scope in (limits, self.deployments.get(deployment), self.tiers.get(tier or "")):
            if scope is not None and scope.ttl_s is not None:
                return scope.ttl_s
        return self.ttl_s

    def max_bytes_for(self, namespace: str) -> int:
        """The largest entry ``namespace`` stores."""
        limits = self.namespaces.get(namespace)
        if limits is not None and limits.max_entry_bytes is not None:
            return limits.max_entry_bytes
        return self.max_entry_bytes

    def issues(self, tiers: set[str], deployments: set[str]) -> list[Issue]:
        """Unknown tiers and deployments, and namespaces a Redis key cannot carry."""
        found = [
            Issue(loc=("cache", "tiers", name), message=f"unknown tier '{name}'")
            for name in self.tiers
            if name not in tiers
        ]
        found.extend(
            Issue(loc=("cache", "deployments", name), message=f"unknown deployment '{name}'")
            for name in self.deployments
            if name not in deployments
        )
        if self.semantic.enabled:
            problem = missing_extra()
            if problem is not None:
                found.append(Issue(loc=("cache", "semantic", "enabled"), message=problem))
        for key, spec in self.keys.items():
            ns = spec.namespace
            if ns is not None and (not ns or not set(ns) <= _NAMESPACE_CHARS or ns.startswith("k:")):
                found.append(
                    Issue(
                        loc=("cache", "keys", key, "namespace"),
                        message="a namespace is letters, digits, '-', '_' or '.' (k:... is reserved)",
                    )
                )
        return found
