"""Routing: from the model name a client sent to the deployments that may answer it.

A deployment name (or an alias of one) bypasses routing; a tier name chooses the tier;
``auto`` (or any name, with ``routing.route_all``) asks the router: the client's tier hint,
then the first matching rule, then the classifier's score against the threshold, then
``routing.default_tier``. Inside a tier the deployments are ordered by preference,
weights or fewest requests in flight, with unavailable ones (open circuit, not ready) last.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.errors import ModelNotFoundError
from gateway.policy import Policy
from gateway.routing.classifiers import Classifier, build
from gateway.routing.features import STRUCTURE_FEATURES, Features, Structure, complete, structure, tier_hint
from gateway.routing.rules import CompiledRule

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: the tier (if any), its candidate deployments in order, and why."""

    tier: str | None
    deployments: tuple[str, ...]
    reason: str
    score: float | None = None
    threshold: float | None = None
    escalated_from: str | None = None
    _header: str | None = field(default=None, init=False, compare=False, repr=False)

    def header(self) -> str:
        """The ``x-switchyard-route`` value, e.g. ``tier=strong; by=rule:has_tools`` or
        ``tier=fast; score=0.21; threshold=0.5``."""
        written = self._header
        if written is None:
            # Written once: a route a NamePlan holds serves every request with its name.
            written = self._written()
            object.__setattr__(self, "_header", written)
        return written

    def _written(self) -> str:
        if self.tier is None:
            return f"deployment={self.deployments[0]}; by={self.reason}"
        if self.score is not None:
            return f"tier={self.tier}; score={self.score:.2f}; threshold={self.threshold:g}"
        suffix = f"; from={self.escalated_from}" if self.escalated_from else ""
        return f"tier={self.tier}; by={self.reason}{suffix}"


def _always(name: str) -> bool:
    return True


def order_tier(
    policy: Policy,
    tier: str,
    available: Callable[[str], bool] = _always,
    in_flight: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """The tier's deployments in the order attempts should try them."""
    members = policy.tiers[tier]
    if len(members) == 1:  # one order whatever the load and the circuits say
        return (members[0].deployment,)
    names = [m.deployment for m in members]
    mode = policy.routing.choice_by_tier.get(tier, policy.routing.choice)
    if mode == "least_outstanding" and in_flight is not None:
        rank = {name: i for i, name in enumerate(names)}
        names.sort(key=lambda n: (in_flight.get(n, 0), rank[n]))
    elif mode == "weighted" and len(names) > 1:
        pool = [m for m in members if available(m.deployment)] or list(members)
        first = random.choices([m.deployment for m in pool], weights=[m.weight for m in pool])[0]
        names.remove(first)
        names.insert(0, first)
    ready = [n for n in names if available(n)]
    if len(ready) == len(names):
        return tuple(names)
    return (*ready, *(n for n in names if n not in ready))


@dataclass(slots=True)
class Decision:
    """Why the router chose a tier (``route explain`` prints all of it)."""

    tier: str
    reason: str
    features: Features
    score: float | None = None
    rule: str | None = None


_Choice = tuple[str, str, float | None, str | None]


@dataclass(frozen=True, slots=True)
class NamePlan:
    """What routing decided once, per policy, for one model name: everything about a request
    that the name alone settles, so that a request pays only for what its body can change.

    A name that is not routed resolves to one deployment, or to a tier whose order is taken
    per request (load, circuits). A routed name (``auto``, or any name with ``route_all``)
    keeps only the rules it can match, their ``model`` conditions already tested; when the
    first of them holds whatever the body says, the tier is settled too (unless the client
    names a tier and ``honor_hint`` lets it)."""

    routed: bool
    route: Route | None = None
    """The route of every request with this name (a deployment, a tier of one deployment)."""
    tier: str | None = None
    """The tier every request with this name goes to, its order taken per request."""
    reason: str = "model"
    rules: tuple[CompiledRule, ...] = ()


_PLANS_KEPT = 1024
"""Model names a router keeps plans for (a client with ``route_all`` may send any name)."""


class Router:
    """The routing decision for one policy, its classifier and rules built once (a loaded
    policy's snapshot holds its router)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        spec = policy.routing.classifier
        self.classifier: Classifier | None = build(spec) if spec is not None else None
        self._rules = tuple(rule.compiled() for rule in policy.routing.rules)
        self._plans: dict[str, NamePlan] = {}

    def plan(self, model: str) -> NamePlan:
        """The plan for requests naming ``model``, made on its first request. Raises
        :class:`ModelNotFoundError` for a name the policy does not know (never kept)."""
        found = self._plans.get(model)
        if found is None:
            found = self._plan(model)
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            self._plans[model] = found
        return found

    def reads_body(self, model: str) -> bool:
        """Whether routing a request naming ``model`` reads its body beyond the name and the
        tier hint (False: the name settles the tier, and another dialect's request needs no
        chat view for the router). Raises :class:`ModelNotFoundError` as :meth:`plan`."""
        plan = self.plan(model)
        return plan.route is None and plan.tier is None

    def _plan(self, model: str) -> NamePlan:
        policy = self.policy
        if not policy.routing.route_all and model != AUTO:
            name = policy.aliases.get(model, model)
            if name in policy.deployments:
                return NamePlan(False, Route(tier=None, deployments=(name,), reason="model"))
            if name not in policy.tiers:
                raise ModelNotFoundError(model)
            return self._tier_plan(False, name, "model")
        rules: list[CompiledRule] = []
        for rule in self._rules:
            if not all(test(model) for key, test in rule.tests if key == "model"):
                continue  # never matches this name
            tests = tuple((key, test) for key, test in rule.tests if key != "model")
            if not tests and not rules:
                # Holds for every body with this name: the tier is settled.
                return self._tier_plan(True, rule.tier, rule.reason)
            structural = all(key in STRUCTURE_FEATURES for key, _ in tests)
            rules.append(replace(rule, tests=tests, structural=structural))
            if not tests:
                break  # holds for every body: the rules after it are never reached
        if not rules and self.classifier is None:
            return self._tier_plan(True, policy.routing.default_tier, "default")
        return NamePlan(True, rules=tuple(rules))

    def _tier_plan(self, routed: bool, tier: str, reason: str) -> NamePlan:
        members = self.policy.tiers[tier]
        if len(members) == 1:  # one order whatever the load and the circuits say
            return NamePlan(routed, Route(tier, (members[0].deployment,), reason), tier, reason)
        return NamePlan(routed, tier=tier, reason=reason)

    def decide(self, body: Mapping[str, Any], hint: str | None = None) -> Decision:
        """The tier for a body and why, with all of its features (``route explain``)."""
        shape = structure(body, hint)
        features = complete(shape)
        tier, reason, score, rule = self._choose(shape, features)
        return Decision(tier, reason, features, score=score, rule=rule)

    def _choose(
        self,
        shape: Structure,
        features: Features | None = None,
        rules: tuple[CompiledRule, ...] | None = None,
    ) -> _Choice:
        """The tier, the reason, the score and the rule: the text features are read only when
        a rule on them, or a classifier that reads them, is reached (``features``, when
        given, are the complete features of ``shape``; ``rules``, the rules left to try,
        default every rule)."""
        routing = self.policy.routing
        if routing.honor_hint and shape.hint in self.policy.tiers:
            return shape.hint, "hint", None, None
        for rule in self._rules if rules is None else rules:
            if rule.structural:
                matched = rule.matches(shape)
            else:
                features = features or complete(shape)
                matched = rule.matches(features)
            if matched:
                return rule.tier, rule.reason, None, rule.label
        if self.classifier is not None:
            features = features or complete(shape, self.classifier.reads_text_features)
            score = self.classifier.strong_probability(features)
            tier = routing.strong_tier if score >= routing.threshold else routing.fast_tier
            return tier, "score", score, None
        return routing.default_tier, "default", None, None

    def resolve(
        self,
        body: Mapping[str, Any],
        hint: str | None = None,
        available: Callable[[str], bool] = _always,
        in_flight: Mapping[str, int] | None = None,
        tool_chars: int | None = None,
    ) -> Route:
        """The route for a request body. Raises :class:`ModelNotFoundError` for a name the
        policy does not know. ``tool_chars``: the length of the body's tool list as compact
        JSON, when the caller knows it (:func:`~gateway.routing.features.structure`)."""
        policy = self.policy
        plan = self.plan(str(body.get("model", "")))
        if plan.tier is not None or plan.route is not None:
            if plan.routed and policy.routing.honor_hint:
                hinted = tier_hint(body, hint)
                if hinted in policy.tiers:
                    return Route(hinted, order_tier(policy, hinted, available, in_flight), "hint")
            if plan.route is not None:
                return plan.route
            assert plan.tier is not None
            return Route(plan.tier, order_tier(policy, plan.tier, available, in_flight), plan.reason)
        tier, reason, score, _ = self._choose(structure(body, hint, tool_chars), rules=plan.rules)
        deployments = order_tier(policy, tier, available, in_flight)
        if score is not None:
            return Route(tier, deployments, "score", score, policy.routing.threshold)
        return Route(tier, deployments, reason)


def tier_route(policy: Policy, tier: str, reason: str, escalated_from: str | None = None) -> Route:
    return Route(tier, order_tier(policy, tier), reason, escalated_from=escalated_from)


def model_names(policy: Policy) -> list[str]:
    """Every name a client may send: deployments, tiers, aliases and ``auto``."""
    return [*policy.deployments, *policy.tiers, *policy.aliases, AUTO]
