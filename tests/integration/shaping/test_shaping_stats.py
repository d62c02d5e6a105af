"""Shaping and cache-hit accounting through a running gateway, a real Redis and the simulator's
prefix cache: the provider's report and the gateway's expectation, the template that breaks
the cache, the stability model shared by replicas, and Redis going away mid-traffic."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import ROOT, GatewayProcess, SimServer, http_json, sim_policy

INSTRUCTIONS = "\n".join(
    f"Rule {n}: answer questions about the Acme order system precisely, citing the policy section."
    for n in range(1, 41)
)  # about 1,000 tokens of stable instructions


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("--model", "sim-fast:5:1", "--model", "sim-strong:5:1", "--cache-model", "vllm") as server:
        yield server


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


def ask(gw: GatewayProcess, system: str, question: str = "Where is my order?", **extra: Any) -> Any:
    return client(gw).chat.completions.with_raw_response.create(
        model="fast",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=4,
        **extra,
    )


def dated(day: int) -> str:
    return f"Today is 2026-12-{day:02d}.\n" + INSTRUCTIONS


def stats(gw: GatewayProcess, want: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    """/admin/stats, polled until ``want(report)`` (counters reach Redis off the request path)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            report: dict[str, Any] = http_json("GET", gw.url + "/admin/stats?since=1h")
        except urllib.error.HTTPError as exc:  # 503 while a restarted Redis reconnects
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        else:
            if want(report) or time.monotonic() > deadline:
                return report
        time.sleep(0.1)


def reported_cached(raw: Any) -> int:
    usage = raw.parse().usage
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def test_shaping_moves_the_date_so_the_provider_hits_and_both_counts_agree(
    sim: SimServer, make_gateway: Any
) -> None:
    sim.reset()
    gw = make_gateway(sim_policy(sim.base_url))
    replies = [ask(gw, dated(day)) for day in (1, 2, 3, 4)]
    shaping = replies[0].headers["x-switchyard-shaping"]
    assert shaping.startswith("moved=1; stable_prefix_tokens=")
    cached = [reported_cached(r) for r in replies]
    prompt = replies[1].parse().usage.prompt_tokens
    assert cached[0] == 0
    assert all(c >= 0.9 * prompt - 32 for c in cached[1:]), (cached, prompt)
    # This replica's own expectation, before the provider answered.
    assert int(replies[3].headers["x-switchyard-prefix-hit"]) > 0.8 * prompt
    total_cached = sum(cached)
    report = stats(
        gw,
        lambda r: (
            r["totals"]["cached_tokens"] >= total_cached
            and abs(r["totals"]["expected_cached_tokens"] - total_cached) <= 4 * 16
        ),
    )
    totals = report["totals"]
    assert totals["requests"] == 4
    assert totals["cached_tokens"] == total_cached
    assert totals["shaped_requests"] == 4
    assert totals["prompt_tokens"] == sum(r.parse().usage.prompt_tokens for r in replies)
    # The expectation (Redis block-hash chain) sees what the simulator's cache saw, give or take a block.
    assert abs(totals["expected_cached_tokens"] - total_cached) <= 4 * 16
    assert report["deployments"]["sim-fast"]["hit_rate"] > 0.6
    (template,) = report["templates"]
    assert template["flagged"] is False and template["breaking_segment"] is None


@pytest.mark.slow
def test_without_shaping_the_template_is_flagged_with_the_date_line_that_broke_it(
    sim: SimServer, make_gateway: Any, tmp_path: Path
) -> None:
    sim.reset()
    gw = make_gateway(sim_policy(sim.base_url, "shaping: {enabled: false}"))
    replies = [ask(gw, dated(day)) for day in (1, 2, 3, 4)]
    assert "x-switchyard-shaping" not in replies[0].headers or replies[0].headers[
        "x-switchyard-shaping"
    ].startswith("moved=0")
    assert all(reported_cached(r) == 0 for r in replies)  # the date is the first block
    report = stats(gw, lambda r: r["totals"]["requests"] >= 4 and r["templates"][0]["flagged"])
    (template,) = report["templates"]
    assert template["flagged"] is True and template["hit_rate"] < 0.3
    assert template["breaking_segment"] == {
        "index": 0,
        "segment": "system line 1",
        "preview": "Today is <*>.",
        "variants": 4,
    }
    # The same report on the command line, as a table and as JSON.
    env = {"SWITCHYARD_URL": gw.url, "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "gateway", "stats", "--since", "15m"]
    text = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    assert f"! template {template['template']}: hit rate 0.0% < 30%" in text
    assert "system line 1 (4 variants): 'Today is <*>.'" in text
    as_json = subprocess.run([*cmd, "--json"], capture_output=True, env=env, cwd=ROOT, check=True).stdout
    assert json.loads(as_json)["templates"][0]["breaking_segment"]["segment"] == "system line 1"
    bad = subprocess.run([*cmd[:-2], "--since", "soon"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert bad.returncode == 1 and "answered 400: since: not a duration" in bad.stderr


def test_a_stream_counts_its_cached_tokens_without_the_client_seeing_a_usage_chunk(
    sim: SimServer, make_gateway: Any
) -> None:
    sim.reset()
    gw = make_gateway(sim_policy(sim.base_url))
    for day in (1, 2):
        chunks = list(
            client(gw).chat.completions.create(
                model="fast",
                messages=[{"role": "system", "content": dated(day)}, {"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
        )
        assert all(c.usage is None for c in chunks)
    report = stats(gw, lambda r: r["totals"]["cached_tokens"] > 0)
    assert report["totals"]["requests"] == 2
    assert report["totals"]["cached_tokens"] > 0.8 * report["totals"]["prompt_tokens"] / 2


LEARN = "shaping: {learn_min_requests: 4}"


def named(name: str) -> str:
    # No detector knows a name: only the learned model can find this line volatile.
    return f"You are talking with {name}.\n" + INSTRUCTIONS


def test_the_stability_model_is_shared_by_replicas_and_survives_a_restart(
    sim: SimServer, make_gateway: Any
) -> None:
    sim.reset()
    first = make_gateway(sim_policy(sim.base_url, LEARN))
    moved = [ask(first, named(n)).headers["x-switchyard-shaping"] for n in ("Ana", "Bo", "Cy", "Di", "Ed")]
    assert [m.split(";")[0] for m in moved] == ["moved=0"] * 4 + ["moved=1"]
    # A second replica on the same Redis: it learns the template from the shared counts
    # (loaded as soon as it sees the template), not from four requests of its own.
    second = make_gateway(sim_policy(sim.base_url, LEARN), flush_redis=False)
    ask(second, named("Flo"))
    time.sleep(0.5)
    assert ask(second, named("Gus")).headers["x-switchyard-shaping"].startswith("moved=1")
    first.stop()
    second.stop()
    again = make_gateway(sim_policy(sim.base_url, LEARN), flush_redis=False)
    ask(again, named("Hal"))
    time.sleep(0.5)
    assert ask(again, named("Ivy")).headers["x-switchyard-shaping"].startswith("moved=1")


@pytest.mark.slow
def test_redis_stopped_mid_traffic_fails_no_request_and_the_dropped_writes_are_counted(
    sim: SimServer, tmp_path: Path
) -> None:
    sim.reset()
    redis_server = EmbeddedRedis().start()
    gw = GatewayProcess(sim_policy(sim.base_url), redis_url=redis_server.url, workdir=tmp_path).start()
    try:
        for day in (1, 2):
            assert ask(gw, dated(day)).http_response.status_code == 200
        redis_server.stop()
        started = time.monotonic()
        replies = [ask(gw, dated(day)) for day in range(3, 13)]
        assert [r.http_response.status_code for r in replies] == [200] * 10
        assert time.monotonic() - started < 5.0  # no request waited on the dead Redis
        # The provider's cache is not Redis: shaping still makes it hit.
        assert all(reported_cached(r) > 0 for r in replies)
        down = openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            down.get("/admin/stats", cast_to=object)
        assert err.value.status_code == 503 and err.value.code == "stats_unavailable"
        redis_server.start()
        report = stats(gw, lambda r: r["stats_writes"]["dropped"] > 0 and r["totals"]["requests"] > 0)
        assert report["stats_writes"]["dropped"] > 0
        # Requests after the restart are counted again.
        ask(gw, dated(13))
        count_before = report["totals"]["requests"]
        after = stats(gw, lambda r: r["totals"]["requests"] > count_before)
        assert after["totals"]["requests"] > count_before
    finally:
        gw.stop()
        redis_server.stop()


def test_provider_hints_prompt_cache_key_and_a_cache_breakpoint_at_the_stable_prefix(
    sim: SimServer, make_gateway: Any
) -> None:
    sim.reset()
    gw = make_gateway(
        f"""
deployments:
  sim-fast: {{provider: openai, base_url: "{sim.base_url}"}}
  sim-strong: {{provider: vllm, base_url: "{sim.base_url}", cache_breakpoints: true}}
tiers:
  fast: [sim-fast]
  strong: [sim-strong]
"""
    )
    ask(gw, dated(1))
    ask(gw, dated(2))
    ask(gw, dated(3), extra_body={"prompt_cache_key": "tenant-7"})
    ask(gw, dated(4), question="hi")
    recent = sim.stats()["recent"]
    keys = [r["prompt_cache_key"] for r in recent[-4:]]
    assert keys[0] == keys[1] == keys[3] and len(keys[0]) == 16  # the stable prefix's hash
    assert keys[2] == "tenant-7"  # the client's own key is kept
    strong = client(gw).chat.completions.with_raw_response.create(
        model="strong",
        messages=[{"role": "system", "content": dated(5)}, {"role": "user", "content": "hi"}],
        max_tokens=4,
    )
    assert strong.headers["x-switchyard-model"] == "sim-strong"
    record = sim.stats()["recent"][-1]
    assert record["cache_control"] == ["0:0"] and record["prompt_cache_key"] is None
