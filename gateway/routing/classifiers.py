"""Classifiers behind one small interface, as RouteLLM's ``calculate_strong_win_rate``.

A classifier turns a request's :class:`~gateway.routing.features.Features` into the
probability that the strong tier is needed; the router compares it with the policy's
threshold. A new classifier is a class with ``strong_probability`` registered by name in
:data:`CLASSIFIERS`; ``routing.classifier.name`` selects it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from gateway.routing.features import Features
from gateway.routing.policy import ClassifierSpec


class Classifier(Protocol):
    def strong_probability(self, features: Features) -> float:
        """P(the strong tier is needed), in [0, 1]."""
        ...


class Linear:
    """Logistic regression: sigmoid(bias + sum of weight x normalized feature)."""

    def __init__(self, spec: ClassifierSpec) -> None:
        self.weights = dict(spec.weights)
        self.bias = spec.bias

    def contributions(self, features: Features) -> dict[str, float]:
        """Each weighted feature's share of the logit (what ``route explain`` prints)."""
        vector = features.vector()
        return {name: weight * vector[name] for name, weight in self.weights.items()}

    def strong_probability(self, features: Features) -> float:
        vector = features.vector()
        z = self.bias + sum(weight * vector[name] for name, weight in self.weights.items())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


CLASSIFIERS: dict[str, Callable[[ClassifierSpec], Classifier]] = {"linear": Linear}
"""Classifier name -> factory from its policy block."""


def build(spec: ClassifierSpec) -> Classifier:
    return CLASSIFIERS[spec.name](spec)
