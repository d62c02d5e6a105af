"""The policy file's schema: deployments, tiers, aliases and the per-stage sections.

These pydantic models are the truth about what a policy may say; ``policies/schema.json``
is exported from :class:`Policy`. A policy is validated in two passes: the shape
(pydantic) and the cross-references (:meth:`Policy.issues`), each problem reported with
its path, e.g. ``tiers.fast[1]: unknown deployment 'gpt-fsat'``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from gateway.cache.policy import CachePolicy
from gateway.dialects.responses.policy import ResponsesPolicy
from gateway.dispatch.policy import DEFAULT_TIMEOUTS, DispatchPolicy, Timeouts
from gateway.providers.azure_policy import AzureSettings, check_azure
from gateway.providers.bedrock_policy import BedrockSettings, check_bedrock, fill_bedrock_defaults
from gateway.providers.gemini_policy import check_google
from gateway.providers.presets import default_base_url
from gateway.providers.registry import PROVIDERS
from gateway.replicas.launch import VllmLaunch
from gateway.replicas.policy import ReplicaSetPolicy, check_replicas, fill_replica_defaults, launch_issues
from gateway.routing.policy import RoutingPolicy
from gateway.shaping.policy import ShapingPolicy
from gateway.validation import Issue, StrictModel, one_of

RESERVED_MODEL_NAMES = frozenset({"auto"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Price(StrictModel):
    """USD per million tokens. ``cached_input`` defaults to ``input`` (no discount known)."""

    input: float = Field(0.0, ge=0)
    cached_input: float | None = Field(None, ge=0)
    output: float = Field(0.0, ge=0)


class Deployment(StrictModel):
    """One upstream model endpoint that requests can be sent to."""

    provider: Annotated[str, *one_of(tuple(PROVIDERS))] = Field(
        "openai",
        description="Wire protocol family: openai, vllm (OpenAI's API), anthropic (the Messages API), "
        "azure (Azure OpenAI), bedrock (AWS Bedrock's Converse API), gemini or vertex (Google's "
        "generateContent), or an OpenAI-compatible provider with its quirks (docs/providers.md).",
    )
    model: str | None = Field(
        None, description="Model name sent upstream; defaults to the deployment's own name."
    )
    base_url: str = Field(
        description="Base URL including the API prefix, e.g. https://api.openai.com/v1 (provider azure: "
        "the resource endpoint; an OpenAI-compatible provider's default is its public API)"
    )
    api_key_env: str | None = Field(
        None, description="Environment variable holding the upstream API key (never logged)."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra headers sent upstream.")
    price: Price | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Overrides of dispatch.timeouts.")
    max_connections: int = Field(256, ge=1, le=100_000, description="Connection pool size.")
    stream_usage: bool = Field(
        True,
        description="Ask the upstream for usage on streams; the extra chunk is stripped "
        "before forwarding when the client did not ask for it.",
    )
    cache_breakpoints: bool | None = Field(
        None,
        description="Place Anthropic-style cache_control breakpoints at the end of the stable prefix "
        "(provider anthropic: tools, stable system prompt, previous turn; provider bedrock: "
        "cachePoint blocks in the same places); default: on for providers anthropic and bedrock, "
        "off for the others.",
    )
    cache_ttl: Literal["5m", "1h"] = Field(
        "5m", description="TTL of the breakpoints the gateway places (provider anthropic); 1h writes cost 2x."
    )
    min_cache_tokens: int = Field(
        1024,
        ge=0,
        description="The model's minimum cacheable prompt length: no breakpoint is placed before it.",
    )
    max_tokens: int = Field(
        4096, ge=1, description="max_tokens sent when the client sets none (provider anthropic requires one)."
    )
    anthropic_version: str = Field(
        "2023-06-01", description="The anthropic-version header (provider anthropic)."
    )
    structured_outputs: bool = Field(
        True,
        description="The model supports structured output (response_format json_schema); "
        "when false such requests are refused with a 400 (providers anthropic and bedrock).",
    )
    google_auth: Literal["env", "metadata"] = Field(
        "env",
        description="provider vertex: the OAuth access token comes from api_key_env (env, read once) "
        "or from the GCP metadata server (metadata: GKE Workload Identity, Compute Engine, Cloud Run; "
        "refreshed before it expires; GCE_METADATA_HOST names another server).",
    )
    temperature_with_top_p: bool | None = Field(
        None,
        description="The model accepts temperature and top_p in one request (provider anthropic); "
        "when false a request with both is refused with a 400. Default: by model name, true for "
        "Claude 3.x and the first Claude 4 models, false for Claude Opus 4.1, later models and "
        "names it does not know.",
    )
    response_model: Literal["upstream", "deployment", "requested"] = Field(
        "upstream",
        description="The `model` field clients see: the upstream's, this deployment's name, "
        "or the name the client asked for.",
    )
    responses_api: Literal["native", "translate"] | None = Field(
        None,
        description="How /v1/responses requests reach this deployment: passed through (native) "
        "or translated to chat completions (translate). Default: native for provider openai, "
        "translate for the others.",
    )
    bedrock: BedrockSettings | None = Field(
        None,
        description="Region, credentials profile and endpoint of a bedrock deployment (provider bedrock).",
    )
    launch: VllmLaunch | None = Field(
        None, description="Start and supervise `vllm serve` for this deployment (provider vllm)."
    )
    replicas: ReplicaSetPolicy | None = Field(
        None, description="Several vLLM replicas of this model, and how requests are spread over them."
    )
    azure: AzureSettings | None = Field(
        None, description="Azure OpenAI's URL form, api-version and Entra ID token (provider azure)."
    )

    @model_validator(mode="before")
    @classmethod
    def _replica_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and "base_url" not in data:
            preset_url = default_base_url(str(data.get("provider", "openai")))
            if preset_url is not None:
                data = {**data, "base_url": preset_url}
        return fill_bedrock_defaults(fill_replica_defaults(data))

    @model_validator(mode="after")
    def _replicas_coherent(self) -> Deployment:
        check_replicas(self)
        check_azure(self.provider, self.azure, self.api_key_env, self.base_url)
        check_google(self)
        check_bedrock(self.provider, self.base_url, self.bedrock)
        return self

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"not an environment variable name: {value!r}")
        return value


def _member(value: Any) -> Any:
    return {"deployment": value} if isinstance(value, str) else value


class TierMember(StrictModel):
    """A deployment in a tier; earlier members are preferred, ``weight`` splits traffic."""

    deployment: str
    weight: float = Field(1.0, gt=0)


Member = Annotated[TierMember, BeforeValidator(_member)]


class ErrorsPolicy(StrictModel):
    """What the error messages clients see may say. By default an upstream failure reads as
    a stable code and a plain message; the exception text, the upstream's answer and the
    deployment's name stay in the log line and the trace."""

    expose_deployments: bool | list[str] = Field(
        False,
        description="Name the deployment that failed in client error messages: true for every "
        "caller, or a list of virtual key names (trusted callers) that see it.",
    )

    def shows_deployment(self, key_name: str | None) -> bool:
        """Whether a caller with this virtual key name may see deployment names."""
        expose = self.expose_deployments
        if isinstance(expose, bool):
            return expose
        return key_name is not None and key_name in expose


class Policy(StrictModel):
    """A whole policy file."""

    deployments: dict[str, Deployment] = Field(min_length=1)
    tiers: dict[str, list[Member]] = Field(
        default_factory=dict, description="Tier name -> deployments in order of preference."
    )
    aliases: dict[str, str] = Field(
        default_factory=dict, description="Extra model names -> a deployment or tier."
    )
    routing: RoutingPolicy = Field(default_factory=RoutingPolicy)
    dispatch: DispatchPolicy = Field(default_factory=DispatchPolicy)
    shaping: ShapingPolicy = Field(default_factory=ShapingPolicy)
    responses: ResponsesPolicy = Field(default_factory=ResponsesPolicy)
    errors: ErrorsPolicy = Field(default_factory=ErrorsPolicy)
    cache: CachePolicy = Field(default_factory=CachePolicy)

    def timeouts_for(self, deployment: str, tier: str | None = None) -> Timeouts:
        """The timeouts of an attempt on ``deployment`` for ``tier``: the deployment's own, the
        tier's, the policy's, then the defaults. Requests read them precomputed from the
        policy's snapshot (``PolicySnapshot.timeouts``)."""
        base = self.dispatch.timeouts.over(DEFAULT_TIMEOUTS)
        tier_timeouts = self.dispatch.tier_timeouts.get(tier) if tier else None
        if tier_timeouts is not None:
            base = tier_timeouts.over(base)
        return self.deployments[deployment].timeouts.over(base)

    def issues(self) -> list[Issue]:
        """Cross-reference problems the shape alone cannot catch, each with its path."""
        found: list[Issue] = []
        names: dict[str, str] = {}
        for section, keys in (
            ("deployments", self.deployments),
            ("tiers", self.tiers),
            ("aliases", self.aliases),
        ):
            for name in keys:
                if name in RESERVED_MODEL_NAMES:
                    found.append(Issue(loc=(section, name), message=f"'{name}' is reserved"))
                elif name in names:
                    found.append(Issue(loc=(section, name), message=f"name already used in {names[name]}"))
                else:
                    names[name] = section
        for tier, members in self.tiers.items():
            if not members:
                found.append(Issue(loc=("tiers", tier), message="a tier needs at least one deployment"))
            for i, member in enumerate(members):
                if member.deployment not in self.deployments:
                    found.append(
                        Issue(
                            loc=("tiers", tier, i),
                            message=f"unknown deployment '{member.deployment}'",
                        )
                    )
        for alias, target in self.aliases.items():
            if target not in self.deployments and target not in self.tiers:
                found.append(Issue(loc=("aliases", alias), message=f"unknown deployment or tier '{target}'"))
        found.extend(launch_issues(self.deployments))
        for tier, chain in self.dispatch.fallback.items():
            if tier not in self.tiers:
                found.append(Issue(loc=("dispatch", "fallback", tier), message=f"unknown tier '{tier}'"))
            for i, target in enumerate(chain):
                if target not in self.tiers:
                    found.append(
                        Issue(loc=("dispatch", "fallback", tier, i), message=f"unknown tier '{target}'")
                    )
        found.extend(
            Issue(loc=("dispatch", "tier_timeouts", tier), message=f"unknown tier '{tier}'")
            for tier in self.dispatch.tier_timeouts
            if tier not in self.tiers
        )
        found.extend(self.routing.issues(self.tiers, self.deployments))
        found.extend(self.cache.issues(set(self.tiers), set(self.deployments)))
        found.extend(self.shaping.issues({name: d.provider for name, d in self.deployments.items()}))
        return found
