"""The replicas of every launched vLLM deployment: preflight, start, readiness, drain.

Each launch is checked against the installed vLLM first
(:func:`~local_backend.vllm._preflight.preflight`); a launch it refuses never starts and its
replicas are ``failed`` with the reason. One replica's process, health checks and restarts
are :class:`~local_backend.vllm._replica.Replica`'s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import structlog

from gateway.cachestats.prefix import GEOMETRY
from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import LaunchError, plan_replicas
from local_backend._loop_thread import LoopThread
from local_backend.vllm._preflight import Preflight, preflight
from local_backend.vllm._replica import Replica, ReplicaState

_log = structlog.get_logger("switchyard.vllm")


class Supervisor:
    """The replicas of several launches (deployment name -> :class:`VllmLaunch`)."""

    def __init__(self, launches: Mapping[str, VllmLaunch], environ: Mapping[str, str] | None = None) -> None:
        self.launches = dict(launches)
        self._environ = os.environ if environ is None else environ
        # Plans are made (and checked against the GPUs on offer) before anything starts.
        self.plans = {
            name: plan_replicas(launch, name, self._environ) for name, launch in self.launches.items()
        }
        self.replicas: dict[str, list[Replica]] = {}
        self.preflights: dict[str, Preflight] = {}
        self.refused: dict[str, str] = {}
        """Deployment -> why its preflight refused it for good (nothing of it will start)."""
        self._launching: list[asyncio.Task[None]] = []

    async def check(self) -> dict[str, Preflight]:
        """Check every launch against the installed vLLM (:func:`preflight`), all at once.

        Raises :class:`~gateway.replicas.launch_plan.LaunchError` (the first refusal) when one
        cannot start; the launches that passed are remembered and not checked again.
        """
        todo = [name for name in self.plans if name not in self.preflights]
        results = await asyncio.gather(
            *(preflight(self.plans[name][0], self._environ) for name in todo), return_exceptions=True
        )
        failure: BaseException | None = None
        for name, result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                failure = failure or result
            else:
                self.preflights[name] = result
        if failure is not None:
            raise failure
        return self.preflights

    async def start(self) -> None:
        """Start every replica (returns at once; :meth:`wait_ready` waits). A launch that its
        preflight refuses never starts: its replicas are ``failed`` with the reason."""
        loop = asyncio.get_running_loop()
        for name, plans in self.plans.items():
            launch = self.launches[name]
            self.replicas[name] = [Replica(plan, launch, self._environ) for plan in plans]
            for replica in self.replicas[name]:
                replica.state = ReplicaState.STARTING
            self._launching.append(loop.create_task(self._launch(name), name=f"vllm-launch-{name}"))

    async def _launch(self, name: str) -> None:
        if name not in self.preflights:
            try:
                self.preflights[name] = await preflight(self.plans[name][0], self._environ)
            except (LaunchError, OSError) as exc:
                _log.error("vllm_preflight_failed", deployment=name, error=str(exc))
                self.refused[name] = str(exc)
                for replica in self.replicas[name]:
                    replica.last_error = str(exc)
                    replica.state = ReplicaState.FAILED
                return
        # The expected-hit accounting counts in the block size this vLLM will use.
        GEOMETRY.use_vllm(name, self.preflights[name].block_size)
        if self.preflights[name].platform == "cpu":
            # vLLM's CPU backend: size its KV cache explicitly (see cpu_kv_cache_env).
            self.plans[name] = plan_replicas(self.launches[name], name, self._environ, gpu=False)
        drain_s = self.launches[name].drain_timeout_s
        self.plans[name] = [self.preflights[name].versioned(p, drain_s) for p in self.plans[name]]
        for replica, plan in zip(self.replicas[name], self.plans[name], strict=True):
            replica.plan = plan
            replica.start()

    def failed(self) -> bool:
        """True when every replica has failed for good (nothing left to wait for)."""
        every = [r for rs in self.replicas.values() for r in rs]
        return bool(every) and all(r.state is ReplicaState.FAILED for r in every)

    def is_ready(self, name: str) -> bool:
        """True when at least one replica of ``name`` answers ``/health``."""
        return any(r.state is ReplicaState.READY for r in self.replicas.get(name, ()))

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until every replica is ready (or ``timeout_s`` passes); True if they all are."""
        waits = [r.ready.wait() for rs in self.replicas.values() for r in rs]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except TimeoutError:
            return False
        return True

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """Each deployment's replicas, JSON-ready."""
        return {name: [r.status() for r in rs] for name, rs in self.replicas.items()}

    async def stop(self) -> None:
        """Drain and stop every replica, all at once."""
        for task in self._launching:
            task.cancel()
        await asyncio.gather(*self._launching, return_exceptions=True)
        await asyncio.gather(*(r.stop() for rs in self.replicas.values() for r in rs))


class SupervisorThread:
    """A :class:`Supervisor` on its own event loop in a thread, for a synchronous owner (the
    gateway's runner): ``with SupervisorThread(launches): serve()``."""

    def __init__(self, launches: Mapping[str, VllmLaunch], environ: Mapping[str, str] | None = None) -> None:
        self.supervisor = Supervisor(launches, environ)
        # The default loop (not uvloop): its child watcher works from any thread.
        self._thread = LoopThread("switchyard-vllm", asyncio.new_event_loop)

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """The supervisor's status, read on its own loop (empty when it is not running)."""

        async def read() -> dict[str, list[dict[str, Any]]]:
            return self.supervisor.status()

        try:
            return self._thread.call(read(), timeout_s=2.0)
        except (RuntimeError, TimeoutError):
            return {}

    def launch_error(self, name: str) -> str | None:
        """Why ``name``'s launch was refused for good, if it was (a plain read: no call
        into the supervisor's loop, so the request path may ask)."""
        return self.supervisor.refused.get(name)

    def replica_url(self, name: str, index: int) -> str | None:
        """Where replica ``index`` of ``name`` serves now (a restart may move it to a fresh
        port); a plain read, like :meth:`launch_error`."""
        replicas = self.supervisor.replicas.get(name, [])
        return replicas[index].plan.base_url if index < len(replicas) else None

    def __enter__(self) -> SupervisorThread:
        self._thread.start(self.supervisor.start, self.supervisor.stop)
        return self

    def __exit__(self, *exc: object) -> None:
        drain = max((launch.drain_timeout_s for launch in self.supervisor.launches.values()), default=0.0)
        self._thread.stop(join_timeout_s=drain + 15.0)
