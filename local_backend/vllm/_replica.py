"""One supervised ``vllm serve`` process: start, wait for ``/health``, restart, drain.

Each replica runs in its own process group. It waits for ``GET /health`` to answer 200
within ``startup_timeout_s`` (loading a model takes minutes), polls it every
``health_interval_s`` while running, and restarts with exponential backoff when the
process exits, does not come up in time, or fails ``health_failures_to_restart`` checks
in a row. On stop it sends SIGTERM (vLLM finishes the requests in flight), waits
``drain_timeout_s``, then SIGKILLs the whole group so no engine process keeps GPU memory.
Every line the replica prints becomes a ``vllm_output`` structured log line.

The exit of the API server is seen at once through a pidfd (:func:`_exited`), not through
``proc.wait()``: vLLM's engine processes inherit the output pipe and keep it open after
the API server dies, and asyncio's ``wait()`` may wait for the pipe too. The replicas of
every launch are :class:`~local_backend.vllm._supervisor.Supervisor`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import re
import signal
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import aiohttp
import structlog

from gateway.procutil import child_preexec
from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import ReplicaPlan
from gateway.replicas.vllm_metrics import figures_from_text
from local_backend.vllm._leftovers import group_members, on_port, port_free

_log = structlog.get_logger("switchyard.vllm")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b")
MAX_LINE_CHARS = 4096
TAIL_LINES = 40


class ReplicaState(enum.StrEnum):
    """Where a replica is in its life."""

    STARTING = "starting"  # spawned, /health not yet 200
    READY = "ready"  # /health answers 200
    UNHEALTHY = "unhealthy"  # running, but recent health checks failed
    BACKOFF = "backoff"  # exited or killed; waiting to restart
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"  # will not be restarted (max_restarts reached, or cannot be started)


def _line_level(line: str) -> str:
    match = _LEVEL.search(line[:80])
    if match is None:
        return "info"
    word = match.group(1)
    return {"WARN": "warning", "CRITICAL": "error"}.get(word, word.lower())


class Replica:
    """One ``vllm serve`` process, kept running until :meth:`stop`."""

    def __init__(
        self, plan: ReplicaPlan, launch: VllmLaunch, environ: Mapping[str, str] | None = None
    ) -> None:
        self.plan = plan
        self.launch = launch
        self._environ = dict(os.environ if environ is None else environ)
        self.state = ReplicaState.STOPPED
        self.pid: int | None = None
        self.starts = 0
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.ready_since: float | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._generated: float | None = None  # vLLM's generation tokens at the last failed check
        self._task: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        return f"{self.plan.name}[{self.plan.index}]"

    def status(self) -> dict[str, Any]:
        """JSON-ready state of this replica."""
        return {
            "index": self.plan.index,
            "url": self.plan.base_url,
            "gpus": list(self.plan.gpus),
            "state": str(self.state),
            "pid": self.pid,
            "starts": self.starts,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "last_error": self.last_error,
            "ready_for_s": round(time.monotonic() - self.ready_since, 1) if self.ready_since else None,
        }

    def start(self) -> None:
        """Begin supervising (returns at once; see :attr:`ready`)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"vllm-{self.key}")

    async def stop(self) -> None:
        """SIGTERM, wait ``drain_timeout_s``, then SIGKILL; returns when the process is gone."""
        self._stop.set()
        if self._task is not None:
            await asyncio.shield(self._task)
        elif self.state is ReplicaState.STARTING:  # stopped before its preflight ended
            self._set(ReplicaState.STOPPED)

    # -- the supervision loop ---------------------------------------------------------

    def _set(self, state: ReplicaState) -> None:
        self.state = state
        if state is ReplicaState.READY:
            self.ready.set()
        else:
            self.ready.clear()

    async def _run(self) -> None:
        backoff_s = self.launch.restart_backoff_s
        timeout = aiohttp.ClientTimeout(total=min(5.0, self.launch.health_interval_s * 2))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                self.starts += 1
                try:
                    proc = await self._spawn()
                except OSError as exc:
                    self.last_error = f"cannot start {self.plan.argv[0]}: {exc.strerror or exc}"
                    _log.error("vllm_start_failed", replica=self.key, error=self.last_error)
                    self._set(ReplicaState.FAILED)
                    return
                pump = asyncio.get_running_loop().create_task(self._pump(proc))
                reason = await self._watch(proc, session)
                healthy_for = time.monotonic() - self.ready_since if self.ready_since else 0.0
                self.ready_since = None
                await self._terminate(proc, graceful=reason == "stopping")
                await self._settle_exit(proc, pump, restarting=reason != "stopping")
                self.last_exit_code = proc.returncode
                self.pid = None
                if reason == "stopping":
                    break
                if self.launch.max_restarts is not None and self.restarts >= self.launch.max_restarts:
                    self._set(ReplicaState.FAILED)
                    _log.error(
                        "vllm_gave_up",
                        replica=self.key,
                        reason=reason,
                        restarts=self.restarts,
                        exit_code=proc.returncode,
                        last_lines=list(self.tail)[-10:],
                    )
                    return
                if healthy_for >= self.launch.stable_after_s:
                    backoff_s = self.launch.restart_backoff_s
                self._set(ReplicaState.BACKOFF)
                _log.warning(
                    "vllm_restarting",
                    replica=self.key,
                    reason=reason,
                    exit_code=proc.returncode,
                    restart_in_s=backoff_s,
                    restarts=self.restarts + 1,
                    last_lines=list(self.tail)[-10:],
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), backoff_s)
                backoff_s = min(backoff_s * 2, self.launch.restart_backoff_max_s)
                if not self._stop.is_set():
                    self.restarts += 1
        self._set(ReplicaState.STOPPED)
        _log.info("vllm_stopped", replica=self.key, exit_code=self.last_exit_code)

    async def _spawn(self) -> asyncio.subprocess.Process:
        env = {**self._environ, "PYTHONUNBUFFERED": "1", **self.plan.env}
        self._set(ReplicaState.STARTING)
        self.last_error = None
        proc = await asyncio.create_subprocess_exec(
            *self.plan.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            # Its own group: on stop the whole tree (API server + engine cores) is reached.
            start_new_session=True,
            preexec_fn=child_preexec,
        )
        self.pid = proc.pid
        _log.info(
            "vllm_starting",
            replica=self.key,
            pid=proc.pid,
            url=self.plan.base_url,
            gpus=",".join(self.plan.gpus),
            command=self.plan.command_line(),
        )
        return proc

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        """Every output line -> one ``vllm_output`` log line (at the level the line names)."""
        assert proc.stdout is not None
        buffer = b""
        while True:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                self._emit(raw, proc.pid)
            if len(buffer) > MAX_LINE_CHARS:  # a line without end: log what we have
                self._emit(buffer, proc.pid)
                buffer = b""
        if buffer:
            self._emit(buffer, proc.pid)

    def _emit(self, raw: bytes, pid: int) -> None:
        line = _ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip()[:MAX_LINE_CHARS]
        if not line.strip():
            return
        self.tail.append(line)
        level = _line_level(line)
        getattr(_log, level)("vllm_output", replica=self.key, pid=pid, line=line)

    async def _healthy(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(self.plan.health_url) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _generating(self, session: aiohttp.ClientSession) -> bool:
        """Whether vLLM's generation-token counter (``/metrics``, served without asking the
        engine) grew since the last failed health check: progress counts as health."""
        try:
            async with session.get(self.plan.metrics_url) as resp:
                text = await resp.text(errors="replace") if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
        tokens = figures_from_text(text).generation_tokens
        before, self._generated = self._generated, tokens
        return tokens is not None and before is not None and tokens > before

    async def _wait(self, exited: asyncio.Task[int], timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True when the process exited or a stop was asked."""
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({exited, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        return exited.done() or self._stop.is_set()

    async def _watch(self, proc: asyncio.subprocess.Process, session: aiohttp.ClientSession) -> str:
        """Run until the process should be stopped; returns why."""
        loop = asyncio.get_running_loop()
        exited = loop.create_task(_exited(proc))
        try:
            started = loop.time()
            deadline = started + self.launch.startup_timeout_s
            poll_s = min(0.5, self.launch.health_interval_s)
            while not await self._healthy(session):
                if await self._wait(exited, min(poll_s, max(0.0, deadline - loop.time()))):
                    return self._why(exited)
                if loop.time() >= deadline:
                    self.last_error = (
                        f"/health did not answer 200 within startup_timeout_s={self.launch.startup_timeout_s}"
                    )
                    _log.error(
                        "vllm_startup_timeout",
                        replica=self.key,
                        timeout_s=self.launch.startup_timeout_s,
                        last_lines=list(self.tail)[-10:],
                    )
                    return "startup_timeout"
            self._set(ReplicaState.READY)
            self.ready_since = time.monotonic()
            _log.info(
                "vllm_ready",
                replica=self.key,
                url=self.plan.base_url,
                startup_s=round(loop.time() - started, 2),
            )
            failures = 0
            while True:
                if await self._wait(exited, self.launch.health_interval_s):
                    return self._why(exited)
                if await self._healthy(session):
                    if failures:
                        _log.info("vllm_recovered", replica=self.key, failed_checks=failures)
                    failures = 0
                    self._set(ReplicaState.READY)
                    continue
                if await self._generating(session):
                    # Slow because busy, not down: its streams still produce tokens.
                    _log.info("vllm_health_slow_but_generating", replica=self.key, tokens=self._generated)
                    failures = 0
                    continue
                failures += 1
                self._set(ReplicaState.UNHEALTHY)
                _log.warning("vllm_health_failed", replica=self.key, consecutive=failures)
                if failures >= self.launch.health_failures_to_restart:
                    self.last_error = f"{failures} health checks failed in a row"
                    return "unhealthy"
        finally:
            if not exited.done():
                exited.cancel()

    def _why(self, exited: asyncio.Task[int]) -> str:
        if self._stop.is_set():
            return "stopping"
        code = exited.result()
        self.last_error = f"exited with status {code}"
        _log.error("vllm_exited", replica=self.key, exit_code=code, last_lines=list(self.tail)[-10:])
        return "exited"

    async def _settle_exit(
        self, proc: asyncio.subprocess.Process, pump: asyncio.Task[None], restarting: bool
    ) -> None:
        """Wait up to ``exit_wait_s`` for the old group to be gone and its output to end; then
        log what is left and, before a restart, move to a fresh port if the old one is held."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.launch.exit_wait_s
        for _ in range(int(self.launch.exit_wait_s / 0.05)):  # polled: a group has no pidfd
            if not _group_alive(proc.pid):
                break
            await asyncio.sleep(0.05)
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(pump), max(0.0, deadline - loop.time()))
        left = group_members(proc.pid)
        output_open = not pump.done()
        port_held = restarting and not port_free(self.launch.host, self.plan.port)
        if left or output_open or port_held:
            # Something outlived the wait (a worker whose SIGKILL is pending, or a process that
            # left the group holding the output pipe or the port): say so, and do not wait for it.
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            _log.warning(
                "vllm_exit_wait_over",
                replica=self.key,
                pid=proc.pid,
                waited_s=self.launch.exit_wait_s,
                group_left=left,
                output_open=output_open,
                port=self.plan.port,
                port_held=port_held,
            )
        if port_held:
            old = self.plan.port
            self.plan = on_port(self.plan, self.launch.host)
            _log.warning(
                "vllm_port_moved", replica=self.key, old_port=old, port=self.plan.port, url=self.plan.base_url
            )

    async def _terminate(self, proc: asyncio.subprocess.Process, graceful: bool) -> None:
        if proc.returncode is None:
            self._set(ReplicaState.STOPPING)
            _signal(proc.pid, signal.SIGTERM, group=False)
            try:
                await asyncio.wait_for(_exited(proc), self.launch.drain_timeout_s if graceful else 5.0)
            except TimeoutError:
                _log.warning(
                    "vllm_killed", replica=self.key, pid=proc.pid, after_s=self.launch.drain_timeout_s
                )
                _signal(proc.pid, signal.SIGKILL, group=True)
                await _exited(proc)
        # The API server is gone; anything left in its group (engine cores) goes too.
        if _group_alive(proc.pid):
            _signal(proc.pid, signal.SIGTERM, group=True)
            for _ in range(20):
                await asyncio.sleep(0.1)
                if not _group_alive(proc.pid):
                    break
            else:
                _signal(proc.pid, signal.SIGKILL, group=True)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _readable(fd: int) -> None:
    """Wait until the pidfd ``fd`` is readable (its process has ended), then close it."""
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    try:
        loop.add_reader(fd, _settle, gone)
        try:
            await gone
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """The exit status of ``proc`` as soon as it exits, whoever holds its output pipe.

    A pidfd becomes readable when the process ends (it does not reap it: asyncio's child
    watcher still does, and sets ``returncode``). Without pidfds: ``proc.wait()``, which
    returns only once the pipes close.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        # Already reaped, and the watcher's callback that sets returncode has not run yet:
        # wait for that below, not for proc.wait() (a child may hold the pipe for minutes).
        pass
    except (AttributeError, OSError):
        return await proc.wait()
    else:
        await _readable(fd)
    # The watcher reaps it (or has reaped it) a moment later; its status is the one to report.
    for _ in range(100):
        if proc.returncode is not None:
            return proc.returncode
        await asyncio.sleep(0.01)
    return -1


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
