"""The ``routing`` section of a policy: how ``model: auto`` picks a tier, and a deployment in it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.routing.classifiers import AnyClassifierSettings, ClassifierSettings
from gateway.routing.loop_policy import Calibration, Judge, Shadow
from gateway.routing.rules import Rule
from gateway.validation import Issue, StrictModel

Choice = Literal["preference", "weighted", "least_outstanding"]
Check = Literal["invalid_json", "empty", "length"]
CHECKS: tuple[Check, ...] = ("invalid_json", "empty", "length")


class Escalation(StrictModel):
    """Retry a non-stream answer of a ``from_tiers`` tier once on ``to`` when it fails a check:
    ``invalid_json`` (a JSON response_format and an answer that does not parse), ``empty``
    (no text and no tool call), ``length`` (cut by the length limit when the client set none)."""

    enabled: bool = False
    on: list[Check] = Field(default_factory=lambda: list(CHECKS))
    from_tiers: list[str] = Field(default_factory=lambda: ["fast"])
    to: str = "strong"


class RoutingPolicy(StrictModel):
    """How requests are routed.

    ``model: auto`` (or every request, with ``route_all``) is routed: the client's hint
    (``x-switchyard-tier`` header or ``metadata.switchyard_tier``) if it names a tier, else the
    first matching rule, else the classifier's strong probability against ``threshold``
    (``strong_tier`` at or above it, ``fast_tier`` below), else ``default_tier``.
    """

    default_tier: str = "fast"
    route_all: bool = False
    rules: list[Rule] = Field(default_factory=list)
    classifier: Annotated[ClassifierSettings, AnyClassifierSettings] | None = Field(
        None, description="The classifier by name (default linear) and its own settings."
    )
    threshold: float = Field(0.5, ge=0, le=1)
    fast_tier: str = "fast"
    strong_tier: str = "strong"
    honor_hint: bool = True
    choice: Choice = "preference"
    choice_by_tier: dict[str, Choice] = Field(default_factory=dict)
    escalation: Escalation = Field(default_factory=Escalation)
    shadow: Shadow | None = Field(None, description="The shadow sample (off by default: it stores prompts).")
    judge: Judge | None = Field(None, description="The deployment `route judge` asks.")
    calibration: Calibration = Field(default_factory=Calibration)

    def issues(self, tiers: dict[str, Any], deployments: dict[str, Any] | None = None) -> list[Issue]:
        """Tier (and deployment) names this section uses that the policy does not define."""
        found = []
        if self.judge is not None and deployments is not None and self.judge.deployment not in deployments:
            found.append(
                Issue(
                    loc=("routing", "judge", "deployment"),
                    message=f"unknown deployment '{self.judge.deployment}'",
                )
            )
        named: list[tuple[tuple[int | str, ...], str]] = [(("routing", "default_tier"), self.default_tier)]
        if self.classifier is not None:
            named += [
                (("routing", "fast_tier"), self.fast_tier),
                (("routing", "strong_tier"), self.strong_tier),
            ]
        named += [(("routing", "rules", i, "tier"), rule.tier) for i, rule in enumerate(self.rules)]
        named += [(("routing", "choice_by_tier", t), t) for t in self.choice_by_tier]
        if self.escalation.enabled:
            named.append((("routing", "escalation", "to"), self.escalation.to))
            named += [
                (("routing", "escalation", "from_tiers", i), t)
                for i, t in enumerate(self.escalation.from_tiers)
            ]
        for loc, tier in named:
            if tier not in tiers:
                found.append(Issue(loc=loc, message=f"unknown tier '{tier}'"))
        return found
