"""Routing rules: ``when`` every condition on the request's features holds, go to ``tier``.

The rule's policy block and the matching live together here; the router tries the rules
in order after the client's hint and before the classifier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.routing.features import RULE_FEATURES, STRUCTURE_FEATURES
from gateway.validation import StrictModel

Comparison = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in"]


class Rule(StrictModel):
    """``when`` every condition holds, the request goes to ``tier``. A condition is a value
    (equality) or a mapping of comparisons: ``{gt: 8000}``, ``{in: [fast, strong]}``."""

    name: str | None = Field(None, description="Shown in x-switchyard-route; default: the conditions' keys.")
    when: dict[str, Any] = Field(min_length=1)
    tier: str

    @field_validator("when")
    @classmethod
    def _known(cls, when: dict[str, Any]) -> dict[str, Any]:
        for key, condition in when.items():
            if key not in RULE_FEATURES:
                raise ValueError(f"unknown feature {key!r} (known: {', '.join(RULE_FEATURES)})")
            if isinstance(condition, dict):
                bad = set(condition) - set(Comparison.__args__)  # type: ignore[attr-defined]
                if bad or not condition:
                    raise ValueError(f"{key}: comparisons are eq, ne, gt, gte, lt, lte, in")
        return when

    @property
    def label(self) -> str:
        return self.name or "+".join(self.when)

    def matches(self, values: Mapping[str, Any]) -> bool:
        """Whether every condition holds for these feature values (``Features.as_dict()``)."""
        return all(test(values.get(key)) for key, test in condition_tests(self))

    def compiled(self) -> CompiledRule:
        """This rule with its conditions turned into tests once (a policy's router holds these)."""
        tests = condition_tests(self)
        return CompiledRule(
            tier=self.tier,
            reason=f"rule:{self.label}",
            label=self.label,
            tests=tests,
            structural=all(key in STRUCTURE_FEATURES for key, _ in tests),
        )


Test = Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule as the router runs it: each condition a test of one feature value, read as an
    attribute of the request's :class:`~gateway.routing.features.Features` (or, when
    ``structural``, of its :class:`~gateway.routing.features.Structure`)."""

    tier: str
    reason: str
    label: str
    tests: tuple[tuple[str, Test], ...]
    structural: bool

    def matches(self, features: object) -> bool:
        """Whether every condition holds for this request's features."""
        for key, test in self.tests:  # noqa: SIM110 - a loop, not all(generator): a third faster
            if not test(getattr(features, key)):
                return False
        return True


def condition_tests(rule: Rule) -> tuple[tuple[str, Test], ...]:
    """``(feature, test)`` for each condition of ``rule``, in order: the one reading of a
    condition, for :meth:`Rule.matches` and the router's :class:`CompiledRule`."""
    return tuple((key, _test(condition)) for key, condition in rule.when.items())


def _test(condition: Any) -> Test:
    if not isinstance(condition, dict):
        return lambda value: value == condition
    checks = tuple(_comparison(op, target) for op, target in condition.items())
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)


def _comparison(op: str, target: Any) -> Test:
    if op == "in":
        return lambda value: value in target
    if op == "eq":
        return lambda value: value == target
    if op == "ne":
        return lambda value: value != target
    return lambda value: value is not None and _compare(op, value, target)


def _compare(op: str, value: Any, target: Any) -> bool:
    try:
        if op == "gt":
            return bool(value > target)
        if op == "gte":
            return bool(value >= target)
        if op == "lt":
            return bool(value < target)
        return bool(value <= target)
    except TypeError:
        return False
