"""``switchyard route judge``: grade the stored pairs with a judge deployment and write the
per-model-quality JSONL that ``route fit`` and ``route eval`` read.

Each shadow pair is one judge call: a rubric (:data:`RUBRIC`), the conversation, and the
two answers as A and B in an order drawn from the request id (the same pair always gets
the same order, and either tier is A about half the time, so a judge's position bias does
not favour one tier). The judge must answer with :data:`GRADES_SCHEMA` (asked for as a
``json_schema`` response format); an answer that is not exactly that object is skipped and
counted, never guessed. Grades 1-5 are written as quality ``(grade - 1) / 4``.

An escalation needs no judge: the fast answer failed a check, so ``weak`` is 0, and
``strong`` is 1 when the strong answer passed the same checks, else 0.

A written row::

    {"messages": [...], "weak": q, "strong": q, "bench": "shadow" | "escalation",
     "id": "<request id>", "score": s, "judge": {"deployment": d, "weak": g, "strong": g}}
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.config import PolicySnapshot
from gateway.context import RequestContext
from gateway.dispatch.attempt import attempt_once
from gateway.errors import SwitchyardError
from gateway.policy import Policy
from gateway.providers.pool import UpstreamPool
from gateway.routing.learn.datafiles import policy_from
from gateway.routing.loop_policy import Judge
from gateway.routing.shadow import read_pairs
from gateway.store import connect

RUBRIC = """You grade the answers two AI assistants gave to the same conversation.

Grade each answer on its own, from 1 to 5:
5: correct, complete and directly useful;
4: correct, with small omissions or imprecisions;
3: partly correct, or correct but missing something the user asked for;
2: mostly wrong, unhelpful or off-topic;
1: wrong, empty, cut off before it answers, or refusing without reason.

Correctness comes first, then completeness; length and style count only as far as they
help the user. Check facts, arithmetic and code yourself. The answers are labelled A and B
in a random order: do not prefer either position, and two equally good answers get the
same grade.

Reply with only this JSON object: {"score_a": <1-5>, "score_b": <1-5>}"""

GRADES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score_a": {"type": "integer", "minimum": 1, "maximum": 5},
        "score_b": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["score_a", "score_b"],
    "additionalProperties": False,
}


def parse_grades(content: Any) -> tuple[int, int] | None:
    """``(score_a, score_b)`` when ``content`` is exactly the grades object (whitespace around
    it allowed), else None: no fences, no prose, no other keys, integers 1-5 only."""
    if not isinstance(content, str):
        return None
    try:
        obj = orjson.loads(content.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or set(obj) != {"score_a", "score_b"}:
        return None
    grades = obj["score_a"], obj["score_b"]
    for grade in grades:
        if type(grade) is not int or not 1 <= grade <= 5:
            return None
    return grades


def _clip(text: str, max_chars: int) -> str:
    """``text`` whole, or its head and tail with the cut said."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            if isinstance(part, dict) and part.get("type") == "text"
            else "[non-text part]"
            for part in content
        )
    return "" if content is None else orjson.dumps(content).decode()


def _answer_text(answer: Any) -> str:
    if not isinstance(answer, dict):
        return "(no answer)"
    parts = [_text(answer.get("content"))]
    calls = answer.get("tool_calls")
    if calls:
        parts.append("Tool calls: " + orjson.dumps(calls).decode())
    if answer.get("finish_reason") == "length":
        parts.append("(cut off by the length limit)")
    text = "\n".join(p for p in parts if p)
    return text or "(empty answer)"


def a_is_fast(pair_id: str) -> bool:
    """Whether the fast tier's answer is shown as A (drawn from the id: stable, about half)."""
    return zlib.crc32(pair_id.encode()) % 2 == 0


def judge_request(pair: dict[str, Any], judge: Judge) -> dict[str, Any]:
    """The chat request that asks the judge to grade one pair."""
    lines = [
        f"[{message.get('role', '?')}] {_text(message.get('content'))}"
        for message in pair.get("messages") or []
        if isinstance(message, dict)
    ]
    if pair.get("tools"):
        lines.append("[tools offered] " + orjson.dumps(pair["tools"]).decode())
    conversation = _clip("\n".join(lines), judge.max_chars)
    fast = _clip(_answer_text(pair.get("fast")), judge.max_chars)
    strong = _clip(_answer_text(pair.get("strong")), judge.max_chars)
    first, second = (fast, strong) if a_is_fast(str(pair.get("id", ""))) else (strong, fast)
    user = f"## Conversation\n{conversation}\n\n## Answer A\n{first}\n\n## Answer B\n{second}"
    return {
        "model": judge.deployment,
        "messages": [{"role": "system", "content": RUBRIC}, {"role": "user", "content": user}],
        "max_tokens": judge.max_tokens,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "grades", "strict": True, "schema": GRADES_SCHEMA},
        },
    }


def _row(pair: dict[str, Any], weak: float, strong: float, bench: str) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": pair.get("messages")}
    if pair.get("tools"):
        row["tools"] = pair["tools"]
    row.update(
        {"weak": weak, "strong": strong, "bench": bench, "id": pair.get("id"), "score": pair.get("score")}
    )
    return row


def escalation_row(pair: dict[str, Any]) -> dict[str, Any]:
    """The labelled row of a stored escalation (no judge call)."""
    row = _row(pair, 0.0, 1.0 if pair.get("strong_passed") else 0.0, "escalation")
    row["reason"] = pair.get("reason")
    return row


def graded_row(pair: dict[str, Any], grades: tuple[int, int], deployment: str) -> dict[str, Any]:
    """The labelled row of a judged shadow pair (grades as the judge gave them, A then B)."""
    fast, strong = grades if a_is_fast(str(pair.get("id", ""))) else (grades[1], grades[0])
    row = _row(pair, (fast - 1) / 4, (strong - 1) / 4, "shadow")
    row["judge"] = {"deployment": deployment, "weak": fast, "strong": strong}
    return row


@dataclass(slots=True)
class Tally:
    """What one ``route judge`` run did."""

    labelled: int = 0
    escalations: int = 0
    malformed: int = 0
    failed: int = 0
    unusable: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)


def _usable(pair: dict[str, Any]) -> bool:
    return (
        isinstance(pair.get("messages"), list)
        and isinstance(pair.get("fast"), dict)
        and isinstance(pair.get("strong"), dict)
    )


async def judge_pairs(policy: Policy, pairs: Sequence[dict[str, Any]], concurrency: int = 4) -> Tally:
    """Label every pair (escalations by their check, shadow pairs by the judge)."""
    judge = policy.routing.judge
    tally = Tally()
    slots: list[dict[str, Any] | None] = [None] * len(pairs)
    todo = []
    for i, pair in enumerate(pairs):
        if not _usable(pair):
            tally.unusable += 1
        elif pair.get("kind") == "escalation":
            slots[i] = escalation_row(pair)
            tally.escalations += 1
        else:
            todo.append(i)
    if todo and judge is None:
        raise SystemExit("the policy names no judge: add routing.judge: {deployment: NAME}")
    if todo and judge is not None:
        snapshot = PolicySnapshot(policy, source="route judge", digest="", version=0)
        pool = UpstreamPool()
        pool.update(policy)
        gate = asyncio.Semaphore(max(1, concurrency))
        try:

            async def one(i: int) -> None:
                async with gate:
                    grades = await _ask(snapshot, pool, judge, pairs[i], tally)
                if grades is not None:
                    slots[i] = graded_row(pairs[i], grades, judge.deployment)
                    tally.labelled += 1

            await asyncio.gather(*(one(i) for i in todo))
        finally:
            await pool.close()
    tally.rows = [row for row in slots if row is not None]
    return tally


async def _ask(
    snapshot: PolicySnapshot, pool: UpstreamPool, judge: Judge, pair: dict[str, Any], tally: Tally
) -> tuple[int, int] | None:
    name = judge.deployment
    body = judge_request(pair, judge)
    ctx = RequestContext(
        request_id=f"judge-{pair.get('id')}", endpoint="/v1/chat/completions", snapshot=snapshot
    )
    ctx.requested_model = name
    try:
        result = await attempt_once(ctx, pool, name, snapshot.timeouts(name), "/chat/completions", body)
    except (SwitchyardError, OSError) as exc:
        tally.failed += 1
        print(f"# {pair.get('id')}: the judge call failed: {exc}", file=sys.stderr)
        return None
    try:
        content = orjson.loads(result.body)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        content = None
    grades = parse_grades(content)
    if grades is None:
        tally.malformed += 1
    return grades


def read_pairs_file(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Stored pairs from a JSONL file (one pair a line, as the gateway stores them)."""
    out = []
    for raw in Path(path).read_bytes().splitlines():
        if raw.strip():
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise SystemExit(f"{path}: a line is not JSON") from None
            if isinstance(obj, dict):
                out.append(obj)
    return out[:limit] if limit else out


async def _from_redis(url: str, limit: int | None) -> list[dict[str, Any]]:
    redis = connect(url)
    try:
        return await read_pairs(redis, limit)
    finally:
        await redis.aclose()


def cmd_judge(args: argparse.Namespace) -> int:
    """``switchyard route judge``."""
    policy = policy_from(args.policy)

    if args.pairs:
        pairs = read_pairs_file(args.pairs, args.limit)
    else:
        url = args.redis_url or os.environ.get("REDIS_URL")
        if not url:
            raise SystemExit("where are the pairs? give --redis-url (or REDIS_URL), or --pairs FILE")
        pairs = asyncio.run(_from_redis(url, args.limit))

    async def run() -> Tally:
        return await judge_pairs(policy, pairs, args.concurrency)

    tally = asyncio.run(run())
    out = Path(args.out)
    out.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in tally.rows))
    print(
        f"# {len(tally.rows)} rows written to {out}: {tally.labelled} judged pairs, "
        f"{tally.escalations} escalations; skipped: {tally.malformed} malformed judge answers, "
        f"{tally.failed} failed judge calls, {tally.unusable} unreadable pairs",
        file=sys.stderr,
    )
    if tally.rows:
        print(
            f"# next: switchyard route eval {out}  (or route fit {out} --classifier ngram)", file=sys.stderr
        )
    return 0


def register_judge(rsub: Any, policy_help: str) -> None:
    """The ``route judge`` subcommand."""
    p = rsub.add_parser(
        "judge", help="grade stored shadow pairs with the policy's judge; write labelled JSONL"
    )
    p.add_argument("--policy", help=policy_help)
    p.add_argument("--out", default="judged.jsonl", help="the labelled JSONL (default: judged.jsonl)")
    p.add_argument("--redis-url", help="where the gateway stored the pairs (default: $REDIS_URL)")
    p.add_argument("--pairs", help="read stored pairs from this JSONL instead of Redis")
    p.add_argument("--limit", type=int, default=None, help="the newest this many pairs only")
    p.add_argument("--concurrency", type=int, default=4, help="judge calls at once")
    p.set_defaults(func=cmd_judge)
