"""The thread-hosted event loop the simulator's and the vLLM supervisor's threads share."""

from __future__ import annotations

import asyncio
import threading

import pytest

from local_backend import LoopThread


def test_setup_runs_calls_reach_the_loop_and_stop_runs_the_teardown() -> None:
    events: list[str] = []
    loop_thread = LoopThread("test-loop")

    async def setup() -> None:
        events.append("setup")

    async def teardown() -> None:
        events.append("teardown")

    async def whose_thread() -> str:
        asyncio.get_running_loop()  # raises outside a loop
        return threading.current_thread().name

    loop_thread.start(setup, teardown)
    assert loop_thread.running
    assert loop_thread.call(whose_thread()) == "test-loop"
    loop_thread.stop()
    assert events == ["setup", "teardown"]
    assert not loop_thread.running


def test_a_failed_setup_is_raised_in_the_caller_and_nothing_is_torn_down() -> None:
    torn_down: list[bool] = []

    async def setup() -> None:
        raise OSError("address in use")

    async def teardown() -> None:
        torn_down.append(True)

    loop_thread = LoopThread("test-loop")
    with pytest.raises(OSError, match="address in use"):
        loop_thread.start(setup, teardown)
    loop_thread.stop()
    assert torn_down == []


def test_a_call_when_not_running_is_a_runtime_error() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="not running"):
        LoopThread("test-loop").call(nothing())
