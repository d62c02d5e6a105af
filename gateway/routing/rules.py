"""Routing rules: ``when`` every condition on the request's features holds, go to ``tier``.

The rule's policy block and the matching live together here; the router tries the rules
in order after the client's hint and before the classifier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.routing.features import RULE_FEATURES
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
        for key, condition in self.when.items():
            value = values.get(key)
            if isinstance(condition, dict):
                for op, target in condition.items():
                    if op == "in":
                        if value not in target:
                            return False
                    elif op == "eq":
                        if value != target:
                            return False
                    elif op == "ne":
                        if value == target:
                            return False
                    elif value is None or not _compare(op, value, target):
                        return False
            elif value != condition:
                return False
        return True


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
