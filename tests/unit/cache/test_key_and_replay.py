"""The cache key's canonical form and which requests it admits; a stored answer's replay
as each endpoint's stream, and a stream's answer as the entry it stores."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.cache.key import canonical_request, plan_request, settle
from gateway.cache.policy import CachePolicy
from gateway.cache.replay import assemble_chat, chat_chunks, responses_events
from gateway.dialects.responses.native import NativeResponsesScanner

ON = CachePolicy(enabled=True)


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, **kw}


def key_of(request: dict[str, Any], *, key_id: str | None = "abc", model: str = "m1") -> str:
    plan = plan_request(ON, "/chat/completions", request, {}, key_id, None)
    assert plan is not None and plan.read
    settled = settle(plan, ON, "fast", "sim-fast", model)
    assert settled is not None
    return settled.key


def test_key_order_stream_and_alias_do_not_split_entries() -> None:
    reordered = {
        "temperature": 0,
        "stream": True,
        "messages": [{"content": "hi", "role": "user"}],
        "model": "auto",
    }
    assert key_of(body()) == key_of(reordered)


def test_schema_property_order_model_and_tenant_do_split_entries() -> None:
    schema_ab = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    schema_ba = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema_ab}}
    swapped = {"json_schema": {"schema": schema_ba, "name": "x"}, "type": "json_schema"}
    same_order = {"json_schema": {"schema": schema_ab, "name": "x"}, "type": "json_schema"}
    assert key_of(body(response_format=fmt)) == key_of(body(response_format=same_order))
    assert key_of(body(response_format=fmt)) != key_of(body(response_format=swapped))
    assert key_of(body()) != key_of(body(), model="m2")
    assert key_of(body()) != key_of(body(), key_id="other")
    assert canonical_request(body(seed=1)) != canonical_request(body(seed=2))


def test_only_deterministic_single_answers_are_planned_for_lookup() -> None:
    for request in (body(temperature=0.5), body(n=2), {"model": "x", "messages": []}):
        plan = plan_request(ON, "/chat/completions", request, {}, "abc", None)
        assert plan is not None and not plan.read and not plan.write and plan.outcome == "bypass"
    seeded = plan_request(ON, "/chat/completions", body(temperature=1, seed=7), {}, "abc", None)
    assert seeded is not None and seeded.read
    anything = CachePolicy(enabled=True, deterministic_only=False)
    loose = plan_request(anything, "/chat/completions", body(temperature=1), {}, "abc", None)
    assert loose is not None and loose.read


def test_client_headers_and_key_settings_steer_the_plan() -> None:
    refresh = plan_request(ON, "/chat/completions", body(), {"x-switchyard-cache": "refresh"}, "a", None)
    assert refresh is not None and not refresh.read and refresh.write
    no_store = plan_request(ON, "/chat/completions", body(), {"Cache-Control": "no-store"}, "a", None)
    assert no_store is not None and no_store.read and not no_store.write
    policy = CachePolicy.model_validate(
        {"enabled": True, "keys": {"team-x": {"namespace": "shared"}, "bad": {"enabled": False}}}
    )
    shared = plan_request(policy, "/chat/completions", body(), {}, "a1", "team-x")
    assert shared is not None and shared.namespace == "shared"
    assert plan_request(policy, "/chat/completions", body(), {}, "a2", "bad") is None
    assert plan_request(policy, "/embeddings", body(), {}, "a1", None) is None


def test_scopes_turn_the_cache_on_per_tier_and_deployment() -> None:
    policy = CachePolicy.model_validate(
        {"tiers": {"fast": {"enabled": True}}, "deployments": {"sim-slow": {"enabled": False}}}
    )
    assert policy.active and not CachePolicy().active
    assert policy.enabled_for("fast", "sim-fast") and not policy.enabled_for("strong", "sim-strong")
    assert not policy.enabled_for("fast", "sim-slow")


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}


def test_a_completion_replayed_as_chunks_adds_up_to_itself() -> None:
    stream = chat_chunks(COMPLETION, include_usage=True)
    assert stream.endswith(b"data: [DONE]\n\n")
    assert assemble_chat(stream, COMPLETION["usage"]) == COMPLETION  # type: ignore[arg-type]
    assert b'"usage"' not in chat_chunks(COMPLETION, include_usage=False)


def test_a_stream_cut_before_its_finish_reason_is_no_answer() -> None:
    stream = chat_chunks(COMPLETION, include_usage=False)
    first_chunk = stream.split(b"\n\n")[0] + b"\n\n"
    assert assemble_chat(first_chunk, None) is None


def test_a_response_replayed_as_events_ends_with_the_response_itself() -> None:
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c",
                "name": "f",
                "arguments": "{}",
                "status": "completed",
            },
        ],
        "usage": {"input_tokens": 2, "output_tokens": 3, "total_tokens": 5},
    }
    scanner = NativeResponsesScanner()
    out = scanner.feed(responses_events(response))
    assert scanner.done and scanner.final_response == response and scanner.error is None
    deltas = [orjson.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ")]
    assert [d["sequence_number"] for d in deltas] == list(range(len(deltas)))
    assert "".join(d["delta"] for d in deltas if d["type"] == "response.output_text.delta") == "hello"


def test_tools_written_in_another_key_order_share_an_entry() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    moved = {
        "function": {"parameters": {"properties": {}, "type": "object"}, "name": "f"},
        "type": "function",
    }
    keys = set()
    for tools in ([tool], [moved], [tool]):
        plan = plan_request(ON, "/chat/completions", body(tools=tools), {}, "a", None, orjson.dumps(tools))
        assert plan is not None
        settled = settle(plan, ON, "fast", "sim-fast", "m")
        assert settled is not None
        keys.add(settled.key)
    assert len(keys) == 1


def test_a_semantic_cache_without_its_extra_is_a_policy_error_with_the_fix(monkeypatch: Any) -> None:
    import importlib.util

    from gateway.cache import policy as cache_policy

    real = importlib.util.find_spec
    monkeypatch.setattr(
        cache_policy.importlib.util, "find_spec", lambda name: None if name == "faiss" else real(name)
    )
    found = CachePolicy.model_validate({"enabled": True, "semantic": {"enabled": True}}).issues(set(), set())
    assert [i.loc for i in found] == [("cache", "semantic", "enabled")]
    assert "pip install 'switchyard[semantic]'" in found[0].message
    assert CachePolicy(enabled=True).issues(set(), set()) == []
