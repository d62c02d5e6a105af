"""Whether a change to shaping left its output as it was: one SHA-256 per stream of requests
over every shaped body (its exact bytes), its ``x-switchyard-shaping`` header, every field
of its ShapeResult (moves, prefix hash, segment signatures, rendered tools) and its
checkpoint chain, for this checkout's gateway and another's.

    .venv/bin/python bench/probes/shaping_identity.py --against /tmp/before

(``/tmp/before``: e.g. ``git archive main | tar -x -C /tmp/before``.) The requests are made
once, by this checkout: the template corpus's sessions (3 passes, interleaved) under the
default policy, each placement, retrieval on and tools unsorted; the bench's chat, agent and
RAG workloads; the cost bench's prompts (three traffic patterns) and its 20 tools in a new
key order each request; and tool lists whose ordered parts (``properties``, literals, a
wrapper's other values) change order while their JSON with sorted keys does not. Each
stream is shaped in order by a fresh shaper and stability model, in a process of its own per
checkout, with the signature sample's clock faked (it samples by the second). Exits 1 when
any stream differs.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]

POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "end": {"placement": "end_of_system"},
    "before": {"placement": "before_last_user"},
    "tool": {"placement": "after_last_tool"},
    "turn": {"placement": "after_last_turn"},
    "rag": {"rag": {"enabled": True}},
    "nosort": {"sort_tools": False},
}


def _rekeyed(node: Any, rng: random.Random) -> Any:
    """``node`` with half its objects' keys (any object's) in another order."""
    if isinstance(node, list):
        return [_rekeyed(v, rng) for v in node]
    if not isinstance(node, dict):
        return node
    items = list(node.items())
    if rng.random() < 0.5:
        rng.shuffle(items)
    return {k: _rekeyed(v, rng) for k, v in items}


def _ordered_parts_body(k: int, rng: random.Random) -> dict[str, Any]:
    """A request whose tools and response format keep orders that mean something."""
    props = {
        "b": {"type": "string", "default": {"y": 1, "x": [{"q": 1, "p": 2}]}},
        "a": {"type": "object", "properties": {"d": {"type": "integer"}, "c": {"enum": [{"n": 1, "m": 2}]}}},
        "e": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"g": {"type": "string"}, "f": {"const": {"s": 1, "r": 2}}},
            },
        },
    }
    params = {
        "type": "object",
        "properties": props,
        "required": ["a"],
        "$defs": {"z": {"type": "string"}, "w": {"type": "number"}},
        "anyOf": [{"required": ["b"], "properties": {"b": {}, "a": {}}}, {"required": ["a"]}],
    }
    tools: list[Any] = [
        {
            "type": "function",
            "function": {"name": "t", "description": "d", "parameters": params, "strict": True},
            "metadata": {"k2": {"v": 1, "u": 2}, "k1": [1, 2]},
        },
        {
            "type": "function",
            "function": {
                "name": "t",
                "description": "same name",
                "parameters": {"type": "object", "properties": {"y": {}, "x": {}}},
            },
        },
        {
            "name": "anthropic_style",
            "description": "x",
            "input_schema": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "p": {"type": "string"}},
            },
        },
        {"type": "web_search"},
        "not a dict",
        {"type": "function", "function": "not a dict"},
    ]
    tools = [_rekeyed(t, rng) for t in tools]
    rng.shuffle(tools)
    schema = _rekeyed({"name": "out", "schema": params, "strict": True}, rng)
    return {
        "model": "fast",
        "messages": [
            {"role": "system", "content": f"You help.\nToday is 2026-12-0{k % 9 + 1}."},
            {"role": "user", "content": f"q{k}"},
        ],
        "tools": tools,
        "response_format": {"type": "json_schema", "json_schema": schema},
    }


def _cost_bodies() -> list[tuple[str, list[bytes]]]:
    """The cost bench's prompts (bench/shaping.py), 300 requests each."""
    import bench.shaping as bs

    out = []
    rng = random.Random(11)
    tools = bs._tools(None)
    bodies = []
    for i in range(300):
        order = [bs._shuffled_keys(tool, rng) for tool in tools]
        rng.shuffle(order)
        system = "\n".join(bs.RULES)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {i}: find the order."},
        ]
        bodies.append(orjson.dumps({"model": "fast", "messages": messages, "tools": order}))
    out.append(("tools", bodies))
    for lines, agent in ((40, False), (130, False), (556, True)):
        if agent:
            system = bs.agent_system_prompt(lines).replace("/home/ana", "/home/Ana Lopez")
        else:
            rules = ["Current time: {now}", "The customer is Ana Lopez."]
            rules += [f"{rule} (section {n})" for n, rule in enumerate(bs.RULES * 3)][: lines - 2]
            system = "\n".join(rules)
        history = "Where is my order? It left on Monday. " * (max(0, 15_000 - len(system)) // 38 + 1)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": "Ticket CONVERSATION. " + history},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "NEWEST"},
        ]
        raw = orjson.dumps({"model": "fast", "messages": messages, "tools": bs._tools(random.Random(1))[:3]})
        for pattern, conversation in bs.PATTERNS.items():
            bodies = [
                raw.replace(b"Ana Lopez", f"Name {conversation(i) % 50:02d}".encode())
                .replace(b"{now}", f"10:{i % 3600:04d}".encode())
                .replace(b"CONVERSATION", str(conversation(i)).encode())
                .replace(b"NEWEST", f"Any news? This is my message {i}, sent at 10:{i % 3600:04d}.".encode())
                for i in range(300)
            ]
            out.append((f"{lines} lines, {pattern}", bodies))
    return out


def streams() -> list[tuple[str, dict[str, Any], list[bytes]]]:
    """Every stream of requests: (name, shaping policy, bodies in order)."""
    sys.argv = sys.argv[:1]  # bench.shaping reads its own flags at import
    import bench.shaping as bs
    from tests.fixtures.templates import corpus

    out = []
    for template in corpus.TEMPLATES:
        sessions = corpus.sessions(template, users=8, turns=5)
        bodies = [orjson.dumps(s[turn]) for _ in range(3) for turn in range(5) for s in sessions]
        out += [(f"corpus {template.name}, {name}", policy, bodies) for name, policy in POLICIES.items()]
    for name, workload in (
        ("chat", bs.chat_workload),
        ("agent", bs.agent_workload),
        ("rag", bs.rag_workload),
    ):
        sessions = workload(False)
        turns = [s[t] for t in range(max(map(len, sessions))) for s in sessions if t < len(s)]
        stamp = "2026-12-07T10:{:02d}:{:02d}.{:06d}Z"
        bodies = [
            orjson.dumps(body).replace(b"{now}", stamp.format(i // 60 % 60, i % 60, i).encode())
            for i, body in enumerate(turns)
        ]
        out += [(f"bench {name}, {policy}", POLICIES[policy], bodies) for policy in ("default", "end", "rag")]
    for name, bodies in _cost_bodies():
        policies = ("default", "nosort", "end") if name == "tools" else ("default",)
        out += [(f"cost {name}, {policy}", POLICIES[policy], bodies) for policy in policies]
    rng = random.Random(5)
    bodies = [orjson.dumps(_ordered_parts_body(k, rng)) for k in range(400)]
    out += [(f"ordered parts, {policy}", POLICIES[policy], bodies) for policy in ("default", "nosort")]
    return out


def shape_all(inputs: Path) -> None:
    """Shape every stream with the ``gateway`` first on ``sys.path``; print a digest per stream."""
    import gateway.shaping.signature as signature

    clock = itertools.count()
    signature._now = lambda: next(clock) / 50.0  # type: ignore[attr-defined]
    from redis.asyncio import Redis

    from gateway.cachestats.chain import checkpoints
    from gateway.shaping.policy import ShapingPolicy
    from gateway.shaping.result import ShapeResult
    from gateway.shaping.shaper import PolicyShaper
    from gateway.shaping.stability import StabilityModel
    from gateway.store.writer import StatsWriter

    for name, policy, bodies in orjson.loads(inputs.read_bytes()):
        digest = hashlib.sha256()
        shaper = PolicyShaper(ShapingPolicy.model_validate(policy))
        model, writer = StabilityModel(), StatsWriter(Redis())  # never flushed
        for raw in bodies:
            body = orjson.loads(raw)
            result = shaper.shape(body, model, writer)
            digest.update(orjson.dumps(body))
            digest.update(result.header().encode())
            digest.update(repr([getattr(result, f) for f in ShapeResult.__slots__]).encode())
            rendered = getattr(result, "rendered_tools", None)
            chain = checkpoints(body, rendered) if rendered is not None else checkpoints(body)
            digest.update(chain.tobytes() + str(chain.prompt_bytes).encode())
        print(f"{digest.hexdigest()[:16]} {name}")


def _digests(inputs: Path, root: Path) -> list[str]:
    command = [sys.executable, __file__, "--shape", str(inputs), "--root", str(root)]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument("--shape", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.shape:
        sys.path.insert(0, str(args.root))
        shape_all(args.shape)
        return 0
    sys.path.insert(0, str(ROOT))
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        made = streams()
        Path(f.name).write_bytes(
            orjson.dumps([(n, p, [b.decode() for b in bodies]) for n, p, bodies in made])
        )
        print(f"{len(made)} streams, {sum(len(s[2]) for s in made):,} requests")
        ours = _digests(Path(f.name), ROOT)
        theirs = _digests(Path(f.name), args.against.resolve()) if args.against else ours
    differ = [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b]
    for a, b in differ:
        print(f"differs: {a} (this checkout) / {b.split()[0]} ({args.against})")
    total = hashlib.sha256("\n".join(ours).encode()).hexdigest()
    print(f"{len(ours) - len(differ)} of {len(ours)} streams identical; this checkout's digest {total[:16]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
