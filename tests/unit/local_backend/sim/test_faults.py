"""Fault spec syntax, per-model rules and how specs merge into one request's plan."""

from __future__ import annotations

import random

import pytest

from local_backend.sim import (
    FaultRule,
    FaultSpecError,
    FaultTable,
    build_plan,
    parse_fault_rule,
    parse_fault_spec,
    parse_fault_specs,
)


def test_spec_values_and_defaults() -> None:
    assert parse_fault_spec("error").status == 500
    assert parse_fault_spec("error=503").status == 503
    assert parse_fault_spec("rate_limit").retry_after_s == 1.0
    assert parse_fault_spec("rate_limit=7").retry_after_s == 7.0
    assert parse_fault_spec("slow_first_token=250").delay_ms == 250.0
    assert parse_fault_spec("reset_mid_stream=3").after_chunks == 3
    stall = parse_fault_spec("stall_mid_stream=2:300")
    assert (stall.after_chunks, stall.stall_ms) == (2, 300.0)
    assert parse_fault_spec("stall_mid_stream=4").stall_ms is None
    assert parse_fault_spec("length").tokens == 3
    assert parse_fault_spec(" length = 5 ").tokens == 5
    assert [s.name for s in parse_fault_specs("hang, empty,,bad_json")] == ["hang", "empty", "bad_json"]


@pytest.mark.parametrize(
    "text", ["nope", "error=200", "error=abc", "error=700", "hang=1", "reset_mid_stream=-1", "length=0"]
)
def test_bad_specs_are_refused(text: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault_spec(text)


def test_rule_syntax() -> None:
    rule = parse_fault_rule("sim-fast:error=503@0.25#10")
    assert (rule.model, rule.fault, rule.rate, rule.count) == ("sim-fast", "error=503", 0.25, 10)
    rule = parse_fault_rule("qwen:7b:stall_mid_stream=2:300")  # colons in the model and the value
    assert (rule.model, rule.fault, rule.rate, rule.count) == ("qwen:7b", "stall_mid_stream=2:300", 1.0, None)
    assert parse_fault_rule("*:hang#1").count == 1
    for bad in ("sim-fast", "sim-fast:nope", "m:error@2", "m:error#x", ":error"):
        with pytest.raises(FaultSpecError):
            parse_fault_rule(bad)


def test_rule_count_caps_injections_then_the_rule_is_dropped() -> None:
    table = FaultTable([parse_fault_rule("m:error=500#2")], random.Random(0))
    assert [len(table.draw("m")) for _ in range(4)] == [1, 1, 0, 0]
    assert table.rules == []


def test_rule_matches_its_model_or_every_model() -> None:
    table = FaultTable([FaultRule("m", "empty"), FaultRule("*", "length")], random.Random(0))
    assert [s.name for s in table.draw("m")] == ["empty", "length"]
    assert [s.name for s in table.draw("other")] == ["length"]


def test_rule_rate_is_a_seeded_probability() -> None:
    def hits(seed: int) -> int:
        table = FaultTable([parse_fault_rule("*:hang@0.3")], random.Random(seed))
        return sum(bool(table.draw("x")) for _ in range(2000))

    assert hits(1) == hits(1)
    assert 500 < hits(1) < 700


def test_plan_first_rejecting_fault_wins_and_stops_the_rest() -> None:
    plan = build_plan(parse_fault_specs("slow_first_token=5, rate_limit=2, error=500"), generation=True)
    assert plan.reject is not None and plan.reject.name == "rate_limit"
    assert plan.names == ["rate_limit"]


def test_plan_merges_mid_stream_faults() -> None:
    plan = build_plan(parse_fault_specs("slow_first_token=5, reset_mid_stream=4, length=2, empty"), True)
    assert plan.reject is None
    assert (plan.slow_first_token_ms, plan.reset_after, plan.length_tokens, plan.empty) == (5.0, 4, 2, True)
    assert plan.outcome == "slow_first_token"
    assert plan.names == ["slow_first_token", "reset_mid_stream", "length", "empty"]


def test_plan_for_embeddings_drops_generation_faults() -> None:
    plan = build_plan(parse_fault_specs("reset_mid_stream=1, slow_first_token=10"), generation=False)
    assert plan.names == ["slow_first_token"] and plan.reset_after is None


def test_answering_faults_reject_and_the_first_wins() -> None:
    plan = build_plan(parse_fault_specs("slow_first_token=5, error_200, empty_200"), generation=True)
    assert plan.reject is not None and plan.reject.name == "error_200" and plan.names == ["error_200"]
    rule = parse_fault_rule("a:error=401")
    assert (rule.model, [s.status for s in rule.specs]) == ("a", [401])  # a per-model 401


def test_stream_answering_faults_are_dropped_for_embeddings() -> None:
    assert build_plan(parse_fault_specs("done_in_content"), generation=False).reject is None
    assert build_plan(parse_fault_specs("done_no_close"), generation=False).reject is None
    plan = build_plan(parse_fault_specs("truncated_200"), generation=False)
    assert plan.reject is not None and plan.reject.name == "truncated_200"
