"""Fault specs (``name`` or ``name=value``), per-model fault rules and the per-request plan."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from local_backend.sim._canned import ANSWERING

# Faults that answer instead of generating: the first one given wins. The answering
# ones (empty_200 ... headers_hang) are made up by local_backend.sim._canned.
REJECTING = ("error", "rate_limit", "context_length", "hang", *ANSWERING)
# Faults that only mean something while tokens are generated (not for embeddings).
GENERATION_ONLY = ("reset_mid_stream", "stall_mid_stream", "malformed_chunk", "empty", "bad_json", "length")
_NOT_FOR_EMBEDDINGS = (*GENERATION_ONLY, "done_in_content", "done_no_close")
FAULT_NAMES = (*REJECTING, "slow_first_token", *GENERATION_ONLY)

_RULE_RE = re.compile(
    r"^(?P<model>.+?):(?P<spec>(?:" + "|".join(FAULT_NAMES) + r")(?:=[^@#]*)?(?:,[^@#]*)*)"
    r"(?:@(?P<rate>[^@#]+))?(?:#(?P<count>[^@#]+))?$"
)


class FaultSpecError(ValueError):
    """A fault spec or rule that does not parse."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One parsed fault. Only the fields of its kind mean anything."""

    name: str
    status: int = 500  # error
    retry_after_s: float = 1.0  # rate_limit
    delay_ms: float = 1000.0  # slow_first_token
    after_chunks: int = 1  # reset_mid_stream, stall_mid_stream, malformed_chunk
    stall_ms: float | None = None  # stall_mid_stream: None stalls until the client leaves
    tokens: int = 3  # length


def _number(name: str, raw: str, kind: type[int] | type[float], low: float) -> Any:
    try:
        value = kind(raw)
    except ValueError:
        raise FaultSpecError(f"fault {name}: {raw!r} is not a number") from None
    if value < low:
        raise FaultSpecError(f"fault {name}: {raw!r} is below {low}")
    return value


def parse_fault_spec(text: str) -> FaultSpec:
    """``"reset_mid_stream=3"`` -> :class:`FaultSpec`; raises :class:`FaultSpecError`."""
    name, _, value = text.strip().partition("=")
    name, value = name.strip(), value.strip()
    if name not in FAULT_NAMES:
        raise FaultSpecError(f"unknown fault {name!r} (known: {', '.join(FAULT_NAMES)})")
    if name == "error":
        status = _number(name, value, int, 400) if value else 500
        if status > 599:
            raise FaultSpecError(f"fault error: status {status} is not 4xx or 5xx")
        return FaultSpec(name, status=status)
    if name == "rate_limit":
        return FaultSpec(name, retry_after_s=_number(name, value, float, 0) if value else 1.0)
    if name == "slow_first_token":
        return FaultSpec(name, delay_ms=_number(name, value, float, 0) if value else 1000.0)
    if name in ("reset_mid_stream", "malformed_chunk"):
        return FaultSpec(name, after_chunks=_number(name, value, int, 0) if value else 1)
    if name == "stall_mid_stream":
        after, _, ms = value.partition(":")
        return FaultSpec(
            name,
            after_chunks=_number(name, after, int, 0) if after else 1,
            stall_ms=_number(name, ms, float, 0) if ms else None,
        )
    if name == "length":
        return FaultSpec(name, tokens=_number(name, value, int, 1) if value else 3)
    if value:
        raise FaultSpecError(f"fault {name} takes no value")
    return FaultSpec(name)


def parse_fault_specs(text: str) -> list[FaultSpec]:
    """``"slow_first_token=200, reset_mid_stream=3"`` -> specs, in order (empty parts skipped)."""
    return [parse_fault_spec(part) for part in text.split(",") if part.strip()]


@dataclass
class FaultRule:
    """A fault applied to a model's requests (``model="*"``: every model).

    ``rate`` is the probability per request (drawn from the simulator's seeded RNG);
    ``count`` caps the number of injections (``None``: unlimited).
    """

    model: str
    fault: str
    rate: float = 1.0
    count: int | None = None
    specs: tuple[FaultSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.model:
            raise FaultSpecError("fault rule: model is empty")
        if not 0.0 <= self.rate <= 1.0:
            raise FaultSpecError(f"fault rule: rate {self.rate} is not in [0, 1]")
        if self.count is not None and self.count < 0:
            raise FaultSpecError(f"fault rule: count {self.count} is negative")
        self.specs = tuple(parse_fault_specs(self.fault))
        if not self.specs:
            raise FaultSpecError("fault rule: no fault given")

    def to_dict(self) -> dict[str, Any]:
        """The rule as ``POST /sim/faults`` takes it."""
        return {"model": self.model, "fault": self.fault, "rate": self.rate, "count": self.count}


def parse_fault_rule(text: str) -> FaultRule:
    """``MODEL:SPEC[@RATE][#COUNT]`` (the ``--fault`` syntax) -> :class:`FaultRule`.

    The model is everything before the ``:`` that precedes a fault name, so model
    names that contain ``:`` (``qwen:7b:error=500``) work.
    """
    found = _RULE_RE.match(text.strip())
    if found is None:
        raise FaultSpecError(f"fault rule {text!r}: expected MODEL:SPEC[@RATE][#COUNT]")
    try:
        rate = float(found["rate"]) if found["rate"] is not None else 1.0
        count = int(found["count"]) if found["count"] is not None else None
    except ValueError:
        raise FaultSpecError(f"fault rule {text!r}: bad rate or count") from None
    return FaultRule(model=found["model"], fault=found["spec"], rate=rate, count=count)


class FaultTable:
    """The per-model rules in force, drawn from once per request."""

    def __init__(self, rules: Iterable[FaultRule], rng: random.Random) -> None:
        self.rules: list[FaultRule] = list(rules)
        self.rng = rng

    def draw(self, model: str) -> list[FaultSpec]:
        """The specs of the rules that fire for one request to ``model``."""
        if not self.rules:
            return []
        fired: list[FaultSpec] = []
        spent = False
        for rule in self.rules:
            if rule.model != "*" and rule.model != model:
                continue
            if rule.count is not None and rule.count <= 0:
                continue
            if rule.rate < 1.0 and self.rng.random() >= rule.rate:
                continue
            if rule.count is not None:
                rule.count -= 1
                spent = spent or rule.count == 0
            fired.extend(rule.specs)
        if spent:
            self.rules = [r for r in self.rules if r.count is None or r.count > 0]
        return fired


@dataclass(slots=True)
class FaultPlan:
    """What one request will suffer, merged from its header and the model's rules."""

    names: list[str] = field(default_factory=list)
    reject: FaultSpec | None = None
    slow_first_token_ms: float = 0.0
    reset_after: int | None = None
    stall_after: int | None = None
    stall_ms: float | None = None
    malformed_after: int | None = None
    empty: bool = False
    bad_json: bool = False
    length_tokens: int | None = None

    @property
    def outcome(self) -> str:
        """The outcome a request that ran to its end records: the first fault's name."""
        return self.names[0] if self.names else "completed"


NO_FAULTS = FaultPlan()


def build_plan(specs: Sequence[FaultSpec], generation: bool) -> FaultPlan:
    """Merge ``specs`` into a plan; ``generation=False`` (embeddings) drops the
    faults that only exist while tokens stream. Repeated kinds: the first wins."""
    if not specs:
        return NO_FAULTS
    plan = FaultPlan()
    for spec in specs:
        name = spec.name
        if name in plan.names or (not generation and name in _NOT_FOR_EMBEDDINGS):
            continue
        if name in REJECTING:
            if plan.reject is None:
                plan.reject = spec
            continue
        plan.names.append(name)
        if name == "slow_first_token":
            plan.slow_first_token_ms = spec.delay_ms
        elif name == "reset_mid_stream":
            plan.reset_after = spec.after_chunks
        elif name == "stall_mid_stream":
            plan.stall_after, plan.stall_ms = spec.after_chunks, spec.stall_ms
        elif name == "malformed_chunk":
            plan.malformed_after = spec.after_chunks
        elif name == "empty":
            plan.empty = True
        elif name == "bad_json":
            plan.bad_json = True
        elif name == "length":
            plan.length_tokens = spec.tokens
    if plan.reject is not None:
        # A rejected request never generates: the other faults did not happen.
        plan.names = [plan.reject.name]
    return plan
