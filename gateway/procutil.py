"""Small helpers for the child processes the gateway starts (Redis, the simulator, workers)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once in the parent: the child (between fork and exec, possibly forked from a
# threaded process) then only calls a function pointer, never dlopen.
_PRCTL = _load_prctl()


def child_preexec() -> None:
    """In the child, before exec: die with SIGTERM when the parent dies (Linux), so no
    orphaned Redis, simulator or vLLM outlives a gateway killed with SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop when uvloop is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on :func:`new_event_loop`'s loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 2xx; raise TimeoutError (or RuntimeError if ``proc`` died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with status {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if 200 <= resp.status < 300:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s} s")
        time.sleep(0.05)


@contextlib.contextmanager
def serving(
    cmd: list[str],
    health_url: str,
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stop_timeout_s: float = 20.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server as a child for the ``with`` block: started, waited for until
    ``health_url`` answers, then SIGTERM (SIGKILL after ``stop_timeout_s``). Its output goes
    to ``log``, or nowhere."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "wb")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            wait_http_ok(health_url, 30, proc)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
