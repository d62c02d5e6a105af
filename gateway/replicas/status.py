"""Readiness of replica-backed deployments, their admin figures, and starting launches."""

from __future__ import annotations

import functools
from typing import Any, Protocol

from gateway.config import PolicyError, PolicySnapshot
from gateway.providers.pool import UpstreamPool
from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import LaunchError, plan_replicas
from gateway.replicas.upstream import ReplicaSetUpstream
from gateway.validation import Issue


class LaunchSupervisor(Protocol):
    """What the gateway reads from the supervisor of its ``launch:`` servers
    (the local backend's ``SupervisorThread``, started by the runner)."""

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """Each deployment's supervised processes, JSON-ready."""
        ...

    def launch_error(self, name: str) -> str | None:
        """Why ``name``'s launch was refused for good (by the preflight), else ``None``."""
        ...

    def replica_url(self, name: str, index: int) -> str | None:
        """Where replica ``index`` of ``name`` serves now (a restart may have moved it)."""
        ...


def attach(pool: UpstreamPool, deployments: list[str], supervisor: LaunchSupervisor | None) -> None:
    """Let each replica-backed deployment of ``pool`` say why its launch was refused, when
    this gateway runs the launches (call after each policy load)."""
    if supervisor is None:
        return
    for name in deployments:
        try:
            upstream = pool.get(name)
        except KeyError:
            continue
        if isinstance(upstream, ReplicaSetUpstream):
            upstream.launch_error = functools.partial(supervisor.launch_error, name)
            upstream.replica_url = functools.partial(supervisor.replica_url, name)


def readiness(pool: UpstreamPool, deployments: list[str]) -> dict[str, dict[str, Any]]:
    """For ``/readyz``: each replica-backed deployment's ``ready`` flag and healthy count."""
    out: dict[str, dict[str, Any]] = {}
    for name in deployments:
        try:
            upstream = pool.get(name)
        except KeyError:
            continue
        if isinstance(upstream, ReplicaSetUpstream):
            healthy = sum(r.healthy for r in upstream.replicas)
            out[name] = {"ready": healthy > 0, "healthy": healthy, "replicas": len(upstream.replicas)}
            refused = upstream.launch_error() if upstream.launch_error is not None else None
            if refused is not None:
                out[name]["launch_error"] = refused
    return out


def replica_problems(tiers: dict[str, list[str]], replicas: dict[str, dict[str, Any]]) -> list[str]:
    """For ``/readyz``: the tiers none of whose deployments can answer because each is
    replica-backed with no healthy replica (still loading, crashed, or refused for good).
    A tier named ``""`` stands for a policy's deployments when it has no tiers."""
    problems = []
    for tier, names in tiers.items():
        if not names or not all(name in replicas and not replicas[name]["ready"] for name in names):
            continue
        parts = []
        for name in names:
            state = replicas[name]
            why = state.get("launch_error")
            parts.append(
                f"{name}: launch refused: {why}"
                if why
                else f"{name}: {state['healthy']} of {state['replicas']} replicas answer /health"
            )
        where = f"tier {tier}" if tier else "every deployment"
        problems.append(f"{where}: no deployment has a healthy replica ({'; '.join(parts)})")
    return problems


def replica_status(
    pool: UpstreamPool, deployments: list[str], supervisor: LaunchSupervisor | None
) -> dict[str, Any]:
    """For ``/admin/replicas``: each replica-backed deployment's routing state and vLLM figures,
    plus the supervised processes when this gateway runs them."""
    processes = supervisor.status() if supervisor is not None else {}
    out: dict[str, Any] = {}
    for name in deployments:
        try:
            upstream = pool.get(name)
        except KeyError:
            continue
        if isinstance(upstream, ReplicaSetUpstream):
            entry = upstream.status()
            if name in processes:
                entry["processes"] = processes[name]
            out[name] = entry
    return {"deployments": out}


def launches_of(snapshot: PolicySnapshot) -> dict[str, VllmLaunch]:
    """The ``launch:`` blocks of a policy, checked against this machine (GPUs on offer, the
    API key variable); a problem is a :class:`PolicyError` located at its deployment."""
    launches = {name: d.launch for name, d in snapshot.policy.deployments.items() if d.launch is not None}
    issues = []
    for name, launch in launches.items():
        try:
            plan_replicas(launch, name)
        except LaunchError as exc:
            issues.append(Issue(loc=("deployments", name, "launch"), message=str(exc)))
    if issues:
        raise PolicyError(snapshot.source, issues)
    return launches
