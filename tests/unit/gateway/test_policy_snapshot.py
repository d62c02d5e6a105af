"""A loaded policy is compiled once into its snapshot; a reload compiles a new one and leaves
the old one whole for the requests still holding it."""

from __future__ import annotations

from pathlib import Path

from gateway.config import PolicyHolder, PolicySnapshot, parse_policy

POLICY = """
deployments:
  f: {base_url: "http://x/v1", timeouts: {first_token_s: 3s}}
  s: {base_url: "http://x/v1"}
tiers: {fast: [f], strong: [s]}
routing:
  classifier: {bias: 2.0}
dispatch:
  timeouts: {total_s: 90s}
  tier_timeouts: {strong: {total_s: 300s}}
"""


def snapshot(text: str = POLICY) -> PolicySnapshot:
    return PolicySnapshot(policy=parse_policy(text, "p"), source="p", digest="d", version=1)


def test_the_snapshot_holds_the_compiled_router_and_shaper() -> None:
    snap = snapshot()
    assert snap.router.policy is snap.policy
    assert snap.router.classifier is not None
    assert snap.shaper.policy is snap.policy.shaping
    route = snap.router.resolve({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert route.tier == "strong"


def test_whether_the_response_cache_applies_is_read_once_at_load() -> None:
    assert not snapshot().cache_active
    assert snapshot(POLICY + "cache: {enabled: true}\n").cache_active
    assert snapshot(POLICY + "cache: {tiers: {fast: {enabled: true}}}\n").cache_active


def test_timeouts_are_resolved_at_load_for_every_deployment_and_tier() -> None:
    snap = snapshot()
    for name in ("f", "s"):
        for tier in (None, "fast", "strong"):
            assert snap.timeouts(name, tier) == snap.policy.timeouts_for(name, tier)
    assert snap.timeouts("f", "fast") is snap.timeouts("f", "fast")  # built once, not per call
    assert snap.timeouts("f").first_token_s == 3.0
    assert snap.timeouts("s", "strong").total_s == 300.0
    assert snap.timeouts("s").total_s == 90.0


def test_a_reload_compiles_a_new_snapshot_and_leaves_the_old_one_whole(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    holder = PolicyHolder(str(path), env={})
    before = holder.current
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    path.write_text(POLICY.replace("bias: 2.0", "bias: -2.0"))
    assert holder.reload()
    after = holder.current
    assert after.version == before.version + 1
    assert after.router is not before.router and after.shaper is not before.shaper
    assert before.router.resolve(body).tier == "strong"  # a request in flight keeps its routing
    assert after.router.resolve(body).tier == "fast"
