"""The learning loop through a running gateway, a real Redis and the simulator: the shadow
sample (off the client's path), escalations as labels, ``route judge`` writing what
``route fit`` and ``route eval`` read, and the drift report and warning."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from gateway.cli import main
from gateway.routing.shadow import PAIRS_KEY
from tests.helpers import GatewayProcess, SimServer, http_json, sim_policy
from tests.integration.telemetry.test_metrics import scrape, value


def policy(sim: SimServer, extra: str) -> str:
    # reasoning_cues decides: "Prove ... why" goes strong, "Hello" fast.
    routing = "routing:\n  classifier: {name: linear, bias: -2.0, weights: {reasoning_cues: 10.0}}\n"
    return sim_policy(sim.base_url, f"{routing}  threshold: 0.5\n{extra}", provider="openai")


SHADOW_ALL = "  shadow: {share: 1.0, max_per_minute: 100}\n"


@pytest.fixture()
def start(sim: SimServer, make_gateway: Any) -> Callable[[str], GatewayProcess]:
    def factory(extra: str) -> GatewayProcess:
        sim.reset()
        gw: GatewayProcess = make_gateway(policy(sim, extra))
        return gw

    return factory


@pytest.fixture()
def store(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def ask(gw: GatewayProcess, text: str, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], **extra
    )


def pairs(store: redis.Redis, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The stored pairs, once there are ``count`` of them (newest first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = store.lrange(PAIRS_KEY, 0, -1)
        if len(raw) >= count:
            return [json.loads(item) for item in raw]
        time.sleep(0.05)
    raise AssertionError(f"{len(store.lrange(PAIRS_KEY, 0, -1))} pairs stored, expected {count}")


def drift(gw: GatewayProcess) -> Any:
    return http_json("GET", gw.url + "/admin/routing/drift")


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_sampled_request_is_also_answered_by_the_other_tier_and_both_answers_are_stored(
    start: Callable[[str], GatewayProcess], store: redis.Redis, sim: SimServer
) -> None:
    gw = start(SHADOW_ALL)
    easy = ask(gw, "Hello there")
    hard = ask(gw, "Prove it and explain why")
    assert easy.headers["x-switchyard-model"] == "sim-fast"
    assert hard.headers["x-switchyard-model"] == "sim-strong"
    found = {pair["messages"][0]["content"]: pair for pair in pairs(store, 2)}
    for text, tier in (("Hello there", "fast"), ("Prove it and explain why", "strong")):
        pair = found[text]
        assert pair["kind"] == "shadow" and pair["tier"] == tier and 0 <= pair["score"] <= 1
        assert pair["threshold"] == 0.5 and pair["id"]
        assert pair["fast"]["deployment"] == "sim-fast" and pair["strong"]["deployment"] == "sim-strong"
        assert pair["fast"]["content"] and pair["strong"]["content"]
    # The client's own answer is the one stored for its tier.
    assert found["Hello there"]["fast"]["content"] == easy.parse().choices[0].message.content
    assert sorted(r["model"] for r in sim.stats()["recent"]) == ["sim-fast"] * 2 + ["sim-strong"] * 2
    samples = scrape(gw.url)
    assert value(samples, "switchyard_shadow_calls_total", outcome="stored") == 2
    assert value(samples, "switchyard_route_decisions_total", by="score", tier="fast") == 1
    assert value(samples, "switchyard_route_decisions_total", by="score", tier="strong") == 1
    assert value(samples, "switchyard_route_score_count") == 2
    assert drift(gw)["shadow"]["stored"] == 2


def test_the_client_never_waits_for_or_sees_a_slow_or_failing_shadow_call(
    start: Callable[[str], GatewayProcess], store: redis.Redis, sim: SimServer
) -> None:
    gw = start(SHADOW_ALL)
    sim.set_fault("sim-strong", "slow_first_token=1500", count=1)
    began = time.monotonic()
    raw = ask(gw, "Hello there")
    assert time.monotonic() - began < 1.0
    assert raw.headers["x-switchyard-model"] == "sim-fast"
    assert store.llen(PAIRS_KEY) == 0  # the shadow answer is still on its way
    assert pairs(store, 1)[0]["strong"]["content"]
    sim.set_fault("sim-strong", "error=500", count=1)
    raw = ask(gw, "Hello again")
    assert raw.http_response.status_code == 200 and raw.parse().choices[0].message.content
    wait_for(lambda: drift(gw)["shadow"]["failed"] == 1)
    assert store.llen(PAIRS_KEY) == 1


def test_streams_rules_and_a_spent_budget_are_not_shadowed(
    start: Callable[[str], GatewayProcess], store: redis.Redis, sim: SimServer
) -> None:
    gw = start(
        "  rules: [{name: tools, when: {has_tools: true}, tier: strong}]\n"
        "  shadow: {share: 1.0, budget_per_day_usd: 0}\n"
    )
    chunks = list(
        openai.OpenAI(base_url=gw.base_url, api_key="x").chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Hello there"}], stream=True
        )
    )
    assert chunks
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert ask(gw, "hi", tools=[tool]).headers["x-switchyard-route"] == "tier=strong; by=rule:tools"
    ask(gw, "Hello there")  # sampled, but today's budget (0 USD) is spent
    wait_for(lambda: drift(gw)["shadow"]["skipped_budget"] == 1)
    assert drift(gw)["shadow"]["sampled"] == 1
    assert store.llen(PAIRS_KEY) == 0 and len(sim.stats()["recent"]) == 3


def test_an_escalation_is_stored_as_a_labelled_pair(
    start: Callable[[str], GatewayProcess], store: redis.Redis, sim: SimServer
) -> None:
    gw = start("  escalation: {enabled: true}\n  shadow: {share: 0}\n")
    sim.set_fault("sim-fast", "empty", count=1)
    raw = ask(gw, "Hello there")
    assert raw.headers["x-switchyard-escalated"] == "empty"
    (pair,) = pairs(store, 1)
    assert pair["kind"] == "escalation" and pair["reason"] == "empty" and pair["strong_passed"] is True
    assert pair["fast"]["content"] == "" and pair["strong"]["content"]
    assert pair["fast"]["deployment"] == "sim-fast" and pair["strong"]["deployment"] == "sim-strong"


def test_nothing_is_stored_without_the_shadow_block(
    start: Callable[[str], GatewayProcess], store: redis.Redis, sim: SimServer
) -> None:
    gw = start("  escalation: {enabled: true}\n")
    sim.set_fault("sim-fast", "empty", count=1)
    assert ask(gw, "Hello there").headers["x-switchyard-escalated"] == "empty"
    ask(gw, "Hello again")
    time.sleep(0.3)  # two stats flushes
    assert store.llen(PAIRS_KEY) == 0 and drift(gw)["shadow"]["sampled"] == 0


PROMPTS = [
    "Hello there",
    "Prove that the square root of two is irrational and explain why",
    "What is the capital of France?",
    "Explain step by step why the sky is blue",
    "Say hi",
    "Derive the quadratic formula and compare the trade-offs of two methods",
]


def test_route_judge_labels_the_pairs_for_fit_and_eval(
    start: Callable[[str], GatewayProcess],
    store: redis.Redis,
    sim: SimServer,
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = SHADOW_ALL + "  escalation: {enabled: true}\n  judge: {deployment: sim-strong}\n"
    gw = start(extra)
    for text in PROMPTS:
        ask(gw, text)
    pairs(store, len(PROMPTS))  # every shadow call is done: none can take the fault below
    sim.set_fault("sim-fast", "length=3", count=1)
    assert ask(gw, "Hello, what is new?").headers["x-switchyard-escalated"] == "length"
    pairs(store, len(PROMPTS) + 1)
    policy_file = tmp_path / "judge.yaml"
    policy_file.write_text(policy(sim, extra))
    out = tmp_path / "judged.jsonl"
    sim.set_fault("sim-strong", "bad_json", count=1)  # one judge answer is not JSON: skipped
    capsys.readouterr()
    args = ["route", "judge", "--redis-url", redis_url, "--policy", str(policy_file), "--out", str(out)]
    assert main([*args, "--concurrency", "1"]) == 0
    err = capsys.readouterr().err
    assert f"{len(PROMPTS) - 1} judged pairs, 1 escalations" in err and "1 malformed judge answers" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(PROMPTS)
    judged = [r for r in rows if r["bench"] == "shadow"]
    for row in judged:
        assert row["weak"] in (0, 0.25, 0.5, 0.75, 1) and row["strong"] in (0, 0.25, 0.5, 0.75, 1)
        assert row["judge"]["deployment"] == "sim-strong" and row["messages"][0]["role"] == "user"
    (escalation,) = [r for r in rows if r["bench"] == "escalation"]
    assert (escalation["weak"], escalation["strong"], escalation["reason"]) == (0, 1, "length")
    # The judge saw both answers, in the rubric's frame, and was asked for the grades' schema.
    judge_calls = [r for r in sim.stats()["recent"] if "response_format" in r["body_keys"]]
    assert len(judge_calls) == len(PROMPTS)
    # What route judge wrote is what route eval and route fit read. The simulated judge's grades
    # are arbitrary: where they give strong no gain, both commands read every row and refuse.
    weights = tmp_path / "w.json"
    eval_args = ["route", "eval", str(out), "--policy", str(policy_file)]
    fit_args = ["route", "fit", str(out), "--classifier", "ngram", "--folds", "0", "--out", str(weights)]
    weak, strong = (sum(r[side] for r in rows) / len(rows) for side in ("weak", "strong"))
    if strong > weak:
        assert main(eval_args) == 0
        assert "APGR" in capsys.readouterr().out
        assert main(fit_args) == 0
        assert weights.exists()
    else:
        for args in (eval_args, fit_args):
            with pytest.raises(SystemExit) as info:
                main(args)
            assert f"strong {strong:.3f}, weak {weak:.3f}, over {len(rows)} rows" in str(info.value)
        assert not weights.exists()


def test_drift_from_the_calibrated_share_is_reported_and_warned_once(
    start: Callable[[str], GatewayProcess],
) -> None:
    gw = start("  calibration: {strong_share: 0.9, tolerance: 0.2, min_decisions: 3}\n")
    for i in range(4):
        ask(gw, f"Hello number {i}")
    wait_for(lambda: drift(gw)["decisions"] == 4)
    report = drift(gw)
    assert report["drifted"] is True and report["strong_share"] == 0.0 and report["target"] == 0.9
    assert report["threshold"] == 0.5 and report["threshold_for_target"] is not None
    assert sum(b["count"] for b in report["score_histogram"]) == 4
    summary = http_json("GET", gw.url + "/admin/dashboard?since=5m")["routing"]
    assert summary == {"decisions": 4, "strong_share": 0.0, "target": 0.9, "verdict": "drifted"}
    line = gw.wait_log(lambda entry: entry.get("event") == "routing_drift")
    assert line["level"] == "warning" and line["target"] == 0.9 and line["strong_share"] == 0.0
    ask(gw, "Hello again")
    time.sleep(0.2)
    assert sum(entry.get("event") == "routing_drift" for entry in gw.log_lines()) == 1
