"""Agent loops: a value that changes every step goes after the step's last tool result (where
the deployments the request can reach accept it), so the step's calls and results stay cached."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import orjson
import pytest

from gateway.config import PolicyError, PolicySnapshot, parse_policy
from gateway.dialects.anthropic.request import split_messages
from gateway.shaping.check import semantic_changes
from gateway.shaping.placement import Placements
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper

_INSTRUCTIONS = "\n".join(
    f"{n}. Rule {n}: read the files you change, keep diffs small and run the tests after step {n}."
    for n in range(1, 41)
)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "run_tests", "write_file")
]
_BLOCK_BYTES = 64  # a vLLM-like cache: whole blocks of the serialized prompt, chained


def _system(user: int, step_clock: int, volatile: bool) -> str:
    head = f"You are Forge, a coding agent working for user {user}.\n\n{_INSTRUCTIONS}"
    if not volatile:
        return head
    return f"Current time: 2026-12-03T10:{step_clock // 60:02d}:{step_clock % 60:02d}Z\n{head}"


def agent_sessions(volatile: bool = True) -> list[list[dict[str, Any]]]:
    """Per user, the requests of 3 user turns with 4 tool-call steps each; the time changes
    with every request."""
    out = []
    for user in range(4):
        history: list[dict[str, Any]] = []
        requests = []
        clock = 0
        for turn in range(3):
            history.append({"role": "user", "content": f"Task {turn} for user {user}: fix the failing test."})
            for step in range(4):
                clock += 7
                messages = [{"role": "system", "content": _system(user, clock, volatile)}, *history]
                requests.append({"model": "agent", "tools": _TOOLS, "messages": copy.deepcopy(messages)})
                call_id = f"call_{user}_{turn}_{step}"
                arguments = orjson.dumps({"path": f"src/module_{step}.py"}).decode()
                history.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": "read_file", "arguments": arguments},
                            }
                        ],
                    }
                )
                history.append(
                    {"role": "tool", "tool_call_id": call_id, "content": f"contents {step}\n" * 20}
                )
            history.append({"role": "assistant", "content": f"Done with task {turn}."})
        out.append(requests)
    return out


def cached_share(bodies: list[dict[str, Any]]) -> float:
    """Cached share of prompt bytes under a prefix cache of chained blocks that never evicts."""
    seen: set[bytes] = set()
    cached = total = 0
    for body in bodies:
        data = orjson.dumps(body.get("tools")) + b"".join(orjson.dumps(m) for m in body["messages"])
        total += len(data)
        chain = hashlib.blake2b(digest_size=8)
        hit = True
        for at in range(0, len(data) - _BLOCK_BYTES + 1, _BLOCK_BYTES):
            chain.update(data[at : at + _BLOCK_BYTES])
            key = chain.digest()
            if hit and key in seen:
                cached += _BLOCK_BYTES
            else:
                hit = False
            seen.add(key)
    return cached / total


def _shape_all(policy: dict[str, Any] | None, volatile: bool = True) -> tuple[float, int]:
    """The cached share of the workload shaped (None: shaping off), and how many shaped bodies
    the semantic check rejects."""
    shaper = PolicyShaper(ShapingPolicy.model_validate(policy)) if policy is not None else None
    shaped_all, problems = [], 0
    sessions = agent_sessions(volatile)
    for step in range(len(sessions[0])):  # users interleaved, as they arrive
        for requests in sessions:
            body = copy.deepcopy(requests[step])
            if shaper is not None:
                shaper.shape(body)
                problems += bool(semantic_changes(requests[step], body))
                again = copy.deepcopy(body)
                shaper.shape(again)
                assert again == body, "shaping a shaped request changes nothing"
            shaped_all.append(body)
    return cached_share(shaped_all), problems


def test_a_time_that_changes_every_step_goes_after_the_last_tool_result() -> None:
    body = agent_sessions()[0][6]  # turn 1, step 2: two calls and their results so far
    original = copy.deepcopy(body)
    result = PolicyShaper(ShapingPolicy()).shape(body)
    assert body["messages"][-1]["role"] == "system"
    assert body["messages"][-1]["content"].startswith("Current time: ")
    assert body["messages"][-2]["role"] == "tool"
    assert result.header().endswith("to=end:0,tool:1")
    assert semantic_changes(original, body) == []
    ids = [c["id"] for m in body["messages"] for c in m.get("tool_calls") or ()]
    assert ids == [c["id"] for m in original["messages"] for c in m.get("tool_calls") or ()]


def test_agent_loops_are_cached_close_to_ideal_and_never_worse_than_off() -> None:
    off, _ = _shape_all(None)
    after_tool, problems = _shape_all({})
    before_user, problems_before = _shape_all({"placement": "before_last_user"})
    ideal, _ = _shape_all(None, volatile=False)
    assert problems == problems_before == 0
    assert after_tool >= off
    assert after_tool >= 0.95 * ideal, (off, before_user, after_tool, ideal)
    assert after_tool > before_user + 0.05, (before_user, after_tool)


POLICY = """
deployments:
  gpt: {base_url: "https://api.example.com/v1"}
  claude: {provider: anthropic, base_url: "https://api.anthropic.com/v1", model: claude-x}
  local: {provider: vllm, base_url: "http://127.0.0.1:8001/v1"}
tiers:
  fast: [local, gpt]
  strong: [claude]
aliases: {small: local}
"""


def test_each_deployment_gets_the_latest_placement_its_provider_accepts() -> None:
    placements = Placements.of(parse_policy(POLICY, "p.yaml"))
    assert placements("gpt") == "after_last_turn"
    assert placements("claude") == "after_last_turn"
    # Many vLLM chat templates raise on a system message that is not first.
    assert placements("local") == placements("small") == "end_of_system"
    # A tier or auto may reach any deployment (fallback, escalation): the earliest of them.
    assert placements("fast") == placements("auto") == "end_of_system"


def test_a_deployment_says_what_its_chat_template_accepts() -> None:
    text = POLICY + "shaping: {deployment_placement: {local: after_last_tool}, placement: before_last_user}\n"
    placements = Placements.of(parse_policy(text, "p.yaml"))
    assert placements("local") == placements("gpt") == placements("fast") == "before_last_user"


def test_a_placement_for_an_unknown_deployment_or_an_unknown_place_is_a_load_error() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(POLICY + "shaping: {deployment_placement: {lcoal: end_of_system}}\n", "p.yaml")
    assert [str(i) for i in info.value.issues] == [
        "line 10: shaping.deployment_placement.lcoal: unknown deployment 'lcoal'"
    ]
    with pytest.raises(PolicyError) as info:
        parse_policy(POLICY + "shaping: {deployment_placement: {local: after_tools}}\n", "p.yaml")
    assert len(info.value.issues) == 1
    assert "shaping.deployment_placement.local" in str(info.value.issues[0])


def test_a_request_to_a_vllm_deployment_keeps_every_system_line_in_the_first_message() -> None:
    snapshot = PolicySnapshot(parse_policy(POLICY, "p.yaml"), "p.yaml", "d", 1)
    body = agent_sessions()[0][6]
    body["model"] = "local"
    snapshot.shaper.shape(body)
    assert [m["role"] for m in body["messages"]].count("system") == 1
    body = agent_sessions()[1][6]
    body["model"] = "gpt"
    snapshot.shaper.shape(body)
    assert body["messages"][-1]["role"] == "system"


def test_for_anthropic_the_value_after_the_tool_results_is_a_text_block_after_them() -> None:
    body = agent_sessions()[0][6]
    PolicyShaper(ShapingPolicy()).shape(body)
    system, messages = split_messages(body["messages"])
    last = messages[-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert last["content"][-1]["text"].startswith("Current time: ")
    assert "Current time" not in system[0]["text"]
