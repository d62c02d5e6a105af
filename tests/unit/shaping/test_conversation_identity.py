"""A request continues the conversation whose turns it repeats, not whichever started alike."""

from __future__ import annotations

from typing import Any

from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper

INSTRUCTIONS = "You are the support assistant of Acme.\nAnswer in two sentences.\nNever promise refunds."


def system(day: int, minute: int) -> str:
    # The session's opening day is fixed within a session and differs between users; the
    # time changes on every request.
    return f"Session opened on 2026-12-{day:02d}.\nCurrent time: 12:{minute:02d}:00\n{INSTRUCTIONS}"


def body(day: int, minute: int, turns: list[tuple[str, str]]) -> dict[str, Any]:
    messages = [{"role": "system", "content": system(day, minute)}]
    messages += [{"role": r, "content": t} for r, t in turns]
    return {"model": "fast", "messages": messages}


def test_two_users_opening_with_the_same_message_keep_their_own_sessions() -> None:
    shaper = PolicyShaper(ShapingPolicy.model_validate({}))  # after_last_turn, the default
    a_turns: list[tuple[str, str]] = [("user", "Hi!")]
    b_turns: list[tuple[str, str]] = [("user", "Hi!")]
    sent: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for step in range(3):
        for who, day, turns in (("a", 3, a_turns), ("b", 4, b_turns)):
            request = body(day, step * 2 + (who == "b"), turns)
            shaper.shape(request)
            sent[who].append(request)
            turns += [("assistant", f"answer {step} to {who}"), ("user", f"question {step + 1}")]
    for who, day in (("a", 3), ("b", 4)):
        heads = [r["messages"][0]["content"] for r in sent[who]]
        # The session's day stays at the end of the system message on every turn: the system
        # message is the same all conversation long (the time is the only thing that moves late).
        assert heads[1] == heads[2], heads
        assert heads[1].endswith(f"Session opened on 2026-12-{day:02d}.")
        for request in sent[who][1:]:
            late = [m["content"] for m in request["messages"][1:] if m["role"] == "system"]
            assert late == [f"Current time: 12:{int(late[0][-5:-3]):02d}:00"], late
            assert request["messages"][-1]["role"] == "system"  # after the newest turn
        # Each request's prefix up to its newest turn is the previous request's, turns included.
        second, third = sent[who][1]["messages"], sent[who][2]["messages"]
        assert third[: len(second) - 1] == second[:-1]


def test_agent_steps_of_two_users_on_the_same_task_keep_their_own_layout() -> None:
    shaper = PolicyShaper(ShapingPolicy.model_validate({}))
    histories: dict[str, list[dict[str, Any]]] = {
        who: [{"role": "user", "content": "Make the failing test pass."}] for who in ("a", "b")
    }
    heads: dict[str, list[str]] = {"a": [], "b": []}
    for step in range(4):
        for who, day in (("a", 3), ("b", 4)):
            request = {
                "model": "fast",
                "messages": [
                    {"role": "system", "content": system(day, step * 2 + (who == "b"))},
                    *histories[who],
                ],
            }
            shaper.shape(request)
            heads[who].append(request["messages"][0]["content"])
            if step:
                # The step's time goes after its last tool result; nothing else leaves.
                assert request["messages"][-1]["role"] == "system"
                assert request["messages"][-1]["content"].startswith("Current time:")
            call = f"call_{who}_{step}"
            histories[who] += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call, "type": "function", "function": {"name": "run", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": call, "content": f"step {step} of {who}"},
            ]
    for who in ("a", "b"):
        assert len(set(heads[who][1:])) == 1, heads[who]  # one system message all task long
