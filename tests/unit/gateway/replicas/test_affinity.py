"""Replica choice: a stable prefix keeps its replica, bounded load caps a hot prefix, the rest
goes to the least-loaded replica."""

from __future__ import annotations

import random
from collections import Counter

from gateway.replicas.affinity import PREFIX_HASH, HashRing, affinity_key, choose, stable_prefix_hash

URLS = [f"http://10.0.0.{i}:8000/v1" for i in range(4)]


def chat(system: str, user: str, tools: list[object] | None = None) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if tools:
        body["tools"] = tools
    return body


def test_the_same_system_prompt_and_tools_hash_alike_whatever_the_user_says() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    a = stable_prefix_hash(chat("You are a support bot.", "hello", tools))
    b = stable_prefix_hash(chat("You are a support bot.", "something else entirely", tools))
    assert a is not None and a == b
    assert stable_prefix_hash(chat("You are a sales bot.", "hello", tools)) != a
    assert stable_prefix_hash(chat("You are a support bot.", "hello")) != a  # tools are part of the prefix


def test_leading_system_and_developer_messages_count_later_ones_do_not() -> None:
    base = [{"role": "system", "content": "S"}, {"role": "developer", "content": "D"}]
    one = stable_prefix_hash(
        {"messages": [*base, {"role": "user", "content": "1"}, {"role": "system", "content": "x"}]}
    )
    two = stable_prefix_hash({"messages": [*base, {"role": "user", "content": "2"}]})
    assert one == two
    assert stable_prefix_hash({"messages": [{"role": "user", "content": "just a question"}]}) is None


def test_prompt_cache_key_wins_and_completions_use_the_leading_bytes() -> None:
    assert stable_prefix_hash({"prompt_cache_key": "tenant-7", "messages": []}) == stable_prefix_hash(
        {"prompt_cache_key": "tenant-7", "messages": [{"role": "system", "content": "other"}]}
    )
    head = "x" * 1024
    assert stable_prefix_hash({"prompt": head + "tail one"}) == stable_prefix_hash(
        {"prompt": head + "tail two"}
    )
    assert stable_prefix_hash({"prompt": ""}) is None


def test_a_hash_from_an_earlier_stage_overrides_the_bodys() -> None:
    body = chat("S", "u")
    token = PREFIX_HASH.set(12345)
    try:
        assert affinity_key(body) == 12345
    finally:
        PREFIX_HASH.reset(token)
    assert affinity_key(body) == stable_prefix_hash(body)


def test_ring_walk_visits_every_replica_once() -> None:
    ring = HashRing(URLS)
    for key in range(50):
        assert sorted(ring.walk(key)) == [0, 1, 2, 3]


def test_a_prefix_keeps_its_replica_when_loads_are_even() -> None:
    ring = HashRing(URLS)
    homes = {key: choose(ring, [0, 0, 0, 0], [True] * 4, key, 1.25) for key in range(200)}
    assert all(c is not None and c.how == "home" for c in homes.values())
    again = {key: choose(ring, [1, 1, 1, 1], [True] * 4, key, 1.25) for key in range(200)}
    assert {k: c.index for k, c in homes.items() if c} == {k: c.index for k, c in again.items() if c}
    spread = Counter(c.index for c in homes.values() if c)
    assert len(spread) == 4 and min(spread.values()) > 20  # prefixes spread over all replicas


def test_removing_a_replica_moves_only_its_prefixes() -> None:
    full = HashRing(URLS)
    before = {key: next(full.walk(key)) for key in range(400)}
    eligible = [True, True, False, True]  # replica 2 is down
    after = {key: choose(full, [0, 0, 0, 0], eligible, key, 1.25) for key in range(400)}
    moved = [key for key in before if after[key] is not None and after[key].index != before[key]]  # type: ignore[union-attr]
    assert moved and all(before[key] == 2 for key in moved)


def test_a_hot_prefix_spills_over_once_its_home_reaches_the_bound() -> None:
    ring = HashRing(URLS)
    key = 42
    home = next(ring.walk(key))
    loads = [0.0] * 4
    picks = []
    for _ in range(40):  # 40 concurrent requests of one prefix, none finishing
        choice = choose(ring, loads, [True] * 4, key, 1.25)
        assert choice is not None
        picks.append(choice)
        loads[choice.index] += 1
        total = sum(loads)
        assert max(loads) <= -(-1.25 * total // 4) + 1  # never above the bound
    assert picks[0].index == home and picks[0].how == "home"
    assert any(p.how == "spilled" for p in picks)
    assert max(loads) <= 13  # ceil(1.25 * 40 / 4): a quarter above the mean at most, never all on one
    assert loads[home] == max(loads)  # the home still took the most


def test_without_a_prefix_the_least_loaded_replica_is_chosen_rotating_ties() -> None:
    ring = HashRing(URLS)
    choice = choose(ring, [3, 1, 2, 1], [True] * 4, None, 1.25, tie_break=0)
    assert choice is not None and choice.index == 1 and choice.how == "least_loaded"
    assert choose(ring, [3, 1, 2, 1], [True] * 4, None, 1.25, tie_break=1).index == 3  # type: ignore[union-attr]
    assert choose(ring, [0, 0, 0, 0], [False, False, True, False], None, 1.25).index == 2  # type: ignore[union-attr]


def test_no_eligible_replica_means_no_choice() -> None:
    assert choose(HashRing(URLS), [0, 0, 0, 0], [False] * 4, 7, 1.25) is None


def test_bounded_load_holds_for_random_mixes() -> None:
    rng = random.Random(5)
    ring = HashRing(URLS)
    loads = [0.0] * 4
    for _ in range(2000):
        key = rng.choice([1, 2, 3, None, rng.randrange(10**9)])
        choice = choose(ring, loads, [True] * 4, key, 1.25)
        assert choice is not None
        bound = -(-1.25 * (sum(loads) + 1) // 4)
        if key is not None:
            assert loads[choice.index] + 1 <= bound
        loads[choice.index] += 1
        if rng.random() < 0.5:  # some finish
            busiest = max(range(4), key=lambda i: loads[i])
            loads[busiest] -= 1


def test_slack_keeps_a_prefix_home_while_the_imbalance_is_small() -> None:
    ring = HashRing(URLS)
    home = next(ring.walk(9))
    loads = [0.0] * 4
    at_home = 0
    while True:
        choice = choose(ring, loads, [True] * 4, 9, 1.25, load_slack=4)
        assert choice is not None
        if choice.index != home:
            break
        at_home += 1
        loads[home] += 1
    # Pure bounded load spills the second request already; 4 of slack keeps ~7 at home.
    assert 5 <= at_home <= 8 and choice.how == "spilled"
