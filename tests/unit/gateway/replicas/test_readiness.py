"""Which tiers make ``/readyz`` not ready for want of a healthy replica (issue #50, item 12)."""

from __future__ import annotations

from typing import Any

from gateway.replicas.status import replica_problems

DOWN = {"ready": False, "healthy": 0, "replicas": 2}
UP = {"ready": True, "healthy": 1, "replicas": 2}


def test_a_tier_whose_only_deployment_has_no_healthy_replica_is_a_problem() -> None:
    replicas: dict[str, dict[str, Any]] = {"local": DOWN}
    assert replica_problems({"fast": ["local"]}, replicas) == [
        "tier fast: no deployment has a healthy replica (local: 0 of 2 replicas answer /health)"
    ]


def test_a_refused_launch_gives_its_reason() -> None:
    replicas: dict[str, dict[str, Any]] = {"local": {**DOWN, "launch_error": "vLLM 0.32 refuses X"}}
    assert replica_problems({"fast": ["local"]}, replicas) == [
        "tier fast: no deployment has a healthy replica (local: launch refused: vLLM 0.32 refuses X)"
    ]


def test_a_tier_with_another_way_to_answer_is_fine() -> None:
    replicas: dict[str, dict[str, Any]] = {"local": DOWN, "other": UP}
    assert replica_problems({"fast": ["local", "gpt"], "strong": ["local", "other"]}, replicas) == []


def test_a_policy_without_tiers_is_judged_on_all_its_deployments() -> None:
    replicas: dict[str, dict[str, Any]] = {"local": DOWN}
    assert replica_problems({"": ["local"]}, replicas) == [
        "every deployment: no deployment has a healthy replica (local: 0 of 2 replicas answer /health)"
    ]
