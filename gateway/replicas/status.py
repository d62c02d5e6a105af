"""Readiness of replica-backed deployments, their admin figures, and starting launches."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway._model import Issue
from gateway.config import PolicyError, PolicySnapshot
from gateway.providers.pool import UpstreamPool
from gateway.replicas.upstream import ReplicaSetUpstream
from local_backend.vllm_backend import LaunchError, SupervisorThread, VllmLaunch, plan_replicas

SUPERVISOR = web.AppKey("vllm_supervisor", SupervisorThread)
"""Set when this gateway process itself supervises the ``launch:`` servers."""


def is_ready(pool: UpstreamPool, deployment: str) -> bool:
    """Whether ``deployment`` can take a request now. False while every replica of a launched
    or replicated vLLM deployment is loading or down (and for a name the pool does not
    know); True for every other deployment. Routing and dispatch skip a deployment that
    is not ready."""
    try:
        return pool.get(deployment).ready
    except KeyError:
        return False


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
    return out


def replica_status(
    pool: UpstreamPool, deployments: list[str], supervisor: SupervisorThread | None
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
