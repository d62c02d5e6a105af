"""The supervisor sees a process exit at once, even while its children hold the output pipe
(as vLLM's engine processes do after the API server dies)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from local_backend.vllm._replica import _exited


async def kill_and_detect(reaped_first: bool) -> tuple[int, float]:
    """SIGKILL a process whose background child inherits its stdout and outlives it; what
    ``_exited`` says and how soon after the kill. ``reaped_first``: call ``_exited`` only once
    asyncio's child watcher has reaped the process but before it has said so on the loop."""
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", "sleep 30 & echo started; exec sleep 30",
        stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    await proc.stdout.readline()
    try:
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        if reaped_first:
            block_until_reaped(proc.pid)  # holding the loop: the watcher's callback cannot run
            assert proc.returncode is None
        code = await asyncio.wait_for(_exited(proc), 5)
        return code, time.monotonic() - killed_at
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.communicate()  # the pipe closes with the child: the transport ends cleanly


def block_until_reaped(pid: int) -> None:
    """Wait, without yielding to the event loop, until ``pid`` no longer exists."""
    deadline = time.monotonic() + 5
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "the watcher did not reap the process"
        time.sleep(0.001)


def test_exit_is_seen_while_a_child_keeps_the_pipe_open() -> None:
    code, after_s = asyncio.run(kill_and_detect(reaped_first=False))
    assert code == -signal.SIGKILL
    assert after_s < 1.0


def test_exit_is_seen_when_the_process_was_reaped_before_the_watcher_said_so() -> None:
    # In between, the pid is gone (no pidfd to open) and returncode is still None; with a
    # child holding the pipe, proc.wait() would not return until the child exits.
    code, after_s = asyncio.run(kill_and_detect(reaped_first=True))
    assert code == -signal.SIGKILL
    assert after_s < 1.0
