"""``switchyard serve``: the embedded services of the zero-setup default, and N worker processes.

With no ``REDIS_URL`` an embedded Redis is started; with no policy the built-in
simulator is started and the embedded policy points at it. With ``--workers N`` the
parent starts N gateway processes that share the port through SO_REUSEPORT, and
restarts one that dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import structlog

from gateway.config import PolicyHolder, PolicySnapshot, Settings
from gateway.procutil import child_preexec, free_port, run_async, wait_http_ok
from gateway.store.embedded import EmbeddedRedis, EmbeddedRedisError

if TYPE_CHECKING:
    from gateway.replicas.status import LaunchSupervisor

_log = structlog.get_logger("switchyard")
_WORKER_ENV = "SWITCHYARD_WORKER_SETTINGS"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class SetupError(Exception):
    """A set-up ``serve`` cannot start with (the port is taken, no redis-server ...); the
    message is one line that says what to do."""


class SimProcess:
    """The built-in simulator as a child process on loopback."""

    def __init__(self, port: int | None = None, extra_args: list[str] | None = None) -> None:
        self.port = port or free_port()
        self._args = extra_args or []
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> SimProcess:
        cmd = [sys.executable, "-m", "local_backend.sim", "--host", "127.0.0.1", "--port", str(self.port)]
        self._proc = subprocess.Popen(
            [*cmd, *self._args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            preexec_fn=child_preexec,
        )
        try:
            wait_http_ok(f"http://127.0.0.1:{self.port}/health", 20.0, self._proc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            _stop(self._proc)
            self._proc = None


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(settings: Settings) -> int:
    """Start what the settings need and serve until SIGINT/SIGTERM.

    Raises :class:`SetupError` when the port cannot be bound or no embedded Redis starts."""
    _check_port(settings)
    with contextlib.ExitStack() as stack:
        if settings.redis_url is None:
            try:
                redis = stack.enter_context(EmbeddedRedis())
            except EmbeddedRedisError as exc:
                raise SetupError(str(exc)) from None
            settings = settings.model_copy(update={"redis_url": redis.url})
            _log.info("embedded_redis", url=redis.url)
        if _wants_simulator(settings.policy):
            sim = stack.enter_context(SimProcess(settings.sim_port or None))
            os.environ["SWITCHYARD_SIM_URL"] = sim.base_url
            _log.info("embedded_simulator", base_url=sim.base_url)
        holder = PolicyHolder(settings.policy)
        supervisor = _start_launches(stack, holder)
        if settings.workers == 1:
            return _serve_one(settings, holder, supervisor=supervisor)
        return _serve_workers(settings)
    return 0  # pragma: no cover - the with block always returns


def _wants_simulator(policy: str | None) -> bool:
    """Whether to start the built-in simulator: no policy (the embedded defaults), or one
    whose deployments point at it (``${SWITCHYARD_SIM_URL...}``, as the examples built on
    the defaults do) while no simulator URL is set."""
    if policy is None:
        return True
    if os.environ.get("SWITCHYARD_SIM_URL"):
        return False
    try:
        return "${SWITCHYARD_SIM_URL" in Path(policy).read_text()
    except (OSError, UnicodeDecodeError):
        return False  # the policy loader reports an unreadable file


def _check_port(settings: Settings) -> None:
    """Fail before anything starts when the port cannot be bound (the usual cause: another
    gateway already runs there); the server binds it again for real later."""
    if settings.port == 0:
        return
    from gateway.http.serve import bind_error

    try:
        addresses = socket.getaddrinfo(
            settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as sock:
                # As the server will: reuse a port in TIME_WAIT, and share it between workers.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if settings.workers > 1:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
    except OSError as exc:
        raise SetupError(bind_error(exc, settings.host, settings.port).strerror) from None


def _start_launches(stack: contextlib.ExitStack, holder: PolicyHolder) -> LaunchSupervisor | None:
    """Start the vLLM servers the policy's ``launch:`` blocks ask for (in this, the parent,
    process: with --workers every worker routes to them, none starts its own). They are
    read once, at start; they stop, drained, when the gateway stops."""
    from gateway.replicas.status import launches_of

    launches = launches_of(holder.current)
    if not launches:
        return None
    from local_backend.vllm import SupervisorThread

    def on_reload(snapshot: PolicySnapshot) -> None:
        now = {n: d.launch for n, d in snapshot.policy.deployments.items() if d.launch is not None}
        if now != launches:
            changed = sorted(set(now) ^ set(launches) | {n for n in now if launches.get(n) != now[n]})
            _log.warning("launch_changed_restart_required", deployments=changed)

    holder.on_change(on_reload)
    return stack.enter_context(SupervisorThread(launches))


def _serve_one(
    settings: Settings,
    holder: PolicyHolder | None,
    reuse_port: bool = False,
    supervisor: LaunchSupervisor | None = None,
) -> int:
    from gateway.http import create_app, serve
    from gateway.http.serve import BindError

    app = create_app(settings, holder, supervisor=supervisor)
    try:
        run_async(serve(app, settings.host, settings.port, reuse_port=reuse_port))
    except BindError as exc:
        raise SetupError(exc.strerror) from None
    return 0


def _serve_workers(settings: Settings) -> int:
    if settings.port == 0:
        raise SystemExit("--workers needs a fixed --port (they share it through SO_REUSEPORT)")
    with contextlib.ExitStack() as stack:
        env = {**os.environ, _WORKER_ENV: settings.model_dump_json()}
        if not env.get(MULTIPROC_ENV):
            # Every worker writes its metrics here and a scrape of any one sums them all; a
            # fresh folder per run, so a restart never adds the last run's counts.
            folder = tempfile.TemporaryDirectory(prefix="switchyard-metrics-")
            env[MULTIPROC_ENV] = stack.enter_context(folder)
        return _supervise_workers(settings, env)
    return 0  # pragma: no cover - the with block always returns


def _supervise_workers(settings: Settings, env: dict[str, str]) -> int:
    from gateway.http.serve import FORCED_EXIT_CODE

    cmd = [sys.executable, "-m", "gateway.runner"]
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            # A second signal: the workers are killed, not drained.
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
            _log.error("forced_exit", pid=os.getpid(), reason=f"second {signal.Signals(signum).name}")
            raise SystemExit(FORCED_EXIT_CODE)
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=child_preexec)

    workers: list[subprocess.Popen[bytes]] = []
    workers += [spawn() for _ in range(settings.workers)]
    _log.info("workers_started", count=len(workers), pids=[w.pid for w in workers])
    backoff_s = 0.5
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(workers):
            if proc.poll() is not None and not stopping:
                _log.error("worker_died", pid=proc.pid, status=proc.returncode, restart_in_s=backoff_s)
                _forget_worker_gauges(env[MULTIPROC_ENV], proc.pid)
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)
                workers[i] = spawn()
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers:
        # Each worker drains its requests for up to drain_timeout_s before it exits.
        _stop(proc, timeout_s=settings.drain_timeout_s + 10.0)
    return 0


def _forget_worker_gauges(path: str, pid: int) -> None:
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _worker_main() -> int:
    from gateway.telemetry import logging as tlog

    settings = Settings.model_validate_json(os.environ[_WORKER_ENV])
    tlog.configure(settings.log_level, settings.log_format)
    try:
        return _serve_one(settings, None, reuse_port=True)
    finally:
        tlog.shutdown()


if __name__ == "__main__":
    sys.exit(_worker_main())
