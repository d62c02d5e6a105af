"""The learned stability model's counts, loaded from a real Redis: a template's two hours
summed by the fold script, many templates over several round trips, and only the templates
this process served reloaded."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import redis

from gateway.shaping import stability
from gateway.shaping.stability import COUNT_FIELD, HOUR_S, StabilityModel
from gateway.store import connect
from gateway.store.fold import FIRST_CHUNK

NOW = 1_800_000_000.0  # a fixed clock: the test never straddles an hour


def _seed(client: redis.Redis, template: str, this_hour: dict[str, int], last_hour: dict[str, int]) -> None:
    hour = int(NOW) // HOUR_S
    for h, counts in ((hour, this_hour), (hour - 1, last_hour)):
        if counts:
            client.hset(f"sy:stab:{{{template}}}:{h}", mapping=counts)  # type: ignore[arg-type]


@pytest.fixture()
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stability, "time", SimpleNamespace(time=lambda: NOW, monotonic=lambda: 0.0))


@pytest.mark.usefixtures("fixed_clock")
def test_two_hours_are_summed_and_many_templates_load(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    sync.flushdb()
    # "a" is on 5 of 6 requests over the two hours, "b" on 1: stable and volatile at 50 %.
    _seed(sync, "t", {"a": 3, COUNT_FIELD: 4}, {"a": 2, "b": 1, COUNT_FIELD: 2})
    names = [f"many-{i}" for i in range(FIRST_CHUNK * 2 + 7)]  # several round trips
    for i, name in enumerate(names):
        _seed(sync, name, {"x": i + 1, COUNT_FIELD: i + 1}, {})
    model = StabilityModel()
    for name in ["t", "empty", *names]:
        model.observe(name, ["a"], None)

    async def load() -> None:
        client = connect(redis_url)
        try:
            await model._load(client, ["t", "empty", *names])
        finally:
            await client.aclose()

    asyncio.run(load())
    assert model.verdicts("t", ["a", "b", "c"], 4, 0.5) == [True, False, False]
    assert model.verdicts("empty", ["a"], 1, 0.5) == [True]  # nothing in Redis: its own count stays
    assert [model.verdicts(name, ["x", "a"], 1, 1.0) for name in names] == [[True, False]] * len(names)
    assert model.verdicts(names[-1], ["x"], len(names), 1.0) == [True]  # the last chunk's count
    assert model.verdicts(names[-1], ["x"], len(names) + 1, 1.0) == [None]


def test_the_periodic_sync_reloads_only_the_templates_served_since(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    sync.flushdb()
    model = StabilityModel()

    async def run() -> tuple[list[bool | None], list[bool | None]]:
        client = connect(redis_url)
        task = asyncio.create_task(model.sync(client, interval_s=0.05))
        try:
            model.observe("served", ["a"], None)
            model.observe("idle", ["a"], None)
            await asyncio.sleep(0.2)  # both loaded once, as new templates (nothing in Redis yet)
            # Another replica counts 10 requests of each, none with "a".
            for name in ("served", "idle"):
                sync.hset(f"sy:stab:{{{name}}}:{int(stability.time.time()) // HOUR_S}", COUNT_FIELD, 10)
            model.observe("served", ["a"], None)
            for _ in range(100):  # the served one is reloaded at the next periodic sync
                if model.verdicts("served", ["a"], 5, 0.5) == [False]:
                    break
                await asyncio.sleep(0.02)
            return model.verdicts("served", ["a"], 5, 0.5), model.verdicts("idle", ["a"], 5, 0.5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    served, idle = asyncio.run(run())
    assert served == [False]  # 10 of the other replica's requests without "a"
    assert idle == [None]  # not served since its last load: still its one request
