"""The ``linear`` classifier: logistic regression over the normalized features.

``switchyard route fit`` fits its weights to labelled traffic (:func:`fit`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from gateway.routing.classifiers import Classifier, ClassifierSettings, register
from gateway.routing.features import FEATURE_NAMES, Features


class LinearSettings(ClassifierSettings):
    """``linear``: sigmoid of ``bias`` + sum of ``weights`` x the normalized features."""

    name: Literal["linear"] = "linear"
    weights: dict[str, float] = Field(default_factory=dict)
    bias: float = 0.0

    @field_validator("weights")
    @classmethod
    def _features(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = [k for k in weights if k not in FEATURE_NAMES]
        if unknown:
            raise ValueError(
                f"weight for unknown feature(s) {unknown} (features: {', '.join(FEATURE_NAMES)})"
            )
        return weights


@register(LinearSettings)
class Linear(Classifier):
    """Logistic regression: sigmoid(bias + sum of weight x normalized feature)."""

    def __init__(self, settings: LinearSettings) -> None:
        self.weights = dict(settings.weights)
        self.bias = settings.bias

    def contributions(self, features: Features) -> dict[str, float]:
        """Each weighted feature's share of the logit."""
        vector = features.vector()
        return {name: weight * vector[name] for name, weight in self.weights.items()}

    def strong_probability(self, features: Features) -> float:
        vector = features.vector()
        z = self.bias + sum(weight * vector[name] for name, weight in self.weights.items())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def explain(self, features: Features) -> list[tuple[str, float]]:
        """The bias, then each feature's share of the logit, largest first."""
        parts = sorted(self.contributions(features).items(), key=lambda kv: -abs(kv[1]))
        return [("bias", self.bias), *parts]


def fit(x: list[list[float]], y: list[int], l2: float) -> LinearSettings:
    """L2-regularized logistic regression on rows of ``FEATURE_NAMES`` values (labels 1 = strong),
    rounded to 4 places as a policy would carry them."""
    import numpy as np  # only `route fit` pays for numpy

    X = np.hstack([np.ones((len(x), 1)), np.asarray(x)])
    t = np.asarray(y, dtype=float)
    w = np.zeros(X.shape[1])
    penalty = np.full(X.shape[1], l2)
    penalty[0] = 0.0  # the bias is not shrunk
    for _ in range(50):  # Newton / IRLS: a few steps converge for a dozen features
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -60, 60)))
        grad = X.T @ (p - t) + penalty * w
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.diag(penalty) + 1e-9 * np.eye(X.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    weights = [float(v) for v in w[1:]]
    return LinearSettings(
        weights={n: round(v, 4) for n, v in zip(FEATURE_NAMES, weights, strict=True)},
        bias=round(float(w[0]), 4),
    )
