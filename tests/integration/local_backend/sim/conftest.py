"""Simulators on loopback for the simulator's own tests: each on its own event loop in a
thread, reached over real HTTP with the official openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from local_backend.sim import ModelProfile, SimConfig, SimControl, SimThread

# m: quick; timed: a fixed 10-token answer with a visible TTFT/ITL; prefill: a cost per uncached token.
MODELS = {
    "m": ModelProfile(ttft_ms=2, itl_ms=0.5),
    "timed": ModelProfile(ttft_ms=60, itl_ms=10, output_tokens=(10, 10)),
    "prefill": ModelProfile(ttft_ms=2, itl_ms=0.5, prefill_ms_per_1k_tokens=150),
}


@pytest.fixture(scope="session")
def sim_server() -> Iterator[SimThread]:
    """One simulator for most tests (reset before each)."""
    with SimThread(SimConfig(models=dict(MODELS))) as sim:
        yield sim


@pytest.fixture()
def sim(sim_server: SimThread) -> SimThread:
    sim_server.control.reset()
    return sim_server


@pytest.fixture()
def control(sim: SimThread) -> SimControl:
    return sim.control


@pytest.fixture()
def client(sim: SimThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim.base_url, api_key="sk-test", max_retries=0, timeout=10) as c:
        yield c
