"""The ``shaping`` section of a policy: how prompts are reordered for prefix caches."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from gateway.validation import Issue, Seconds, StrictModel

Detector = Literal[
    "iso_date", "written_date", "time", "weekday", "uuid", "hex_id", "base64_id", "epoch", "request_id"
]
DETECTORS: tuple[Detector, ...] = (
    "iso_date", "written_date", "time", "weekday", "uuid", "hex_id", "base64_id", "epoch", "request_id",
)  # fmt: skip


Placement = Literal["end_of_system", "before_last_user", "after_last_tool", "after_last_turn"]
"""Where content that changes within a conversation goes, from the earliest place to the latest
(the later, the more of the conversation before it stays a reusable prefix)."""
PLACEMENTS: tuple[Placement, ...] = (
    "end_of_system",
    "before_last_user",
    "after_last_tool",
    "after_last_turn",
)

PROVIDER_PLACEMENT: dict[str, Placement] = {
    # Chat Completions accepts a system (or developer) message anywhere in the conversation.
    "openai": "after_last_turn",
    # The Messages API takes system text only at the top level; a later system message is
    # sent as a text block of the user turn it sits in, after its text or tool_result blocks.
    "anthropic": "after_last_turn",
    # Gemini (and Vertex) take it the same way: a text part of the user turn it sits in.
    "gemini": "after_last_turn",
    "vertex": "after_last_turn",
    # Converse, like the Messages API, sends a later system message as a text block of its turn.
    "bedrock": "after_last_turn",
    # Many models' chat templates accept a system message only first (they raise otherwise).
    "vllm": "end_of_system",
}
"""The latest placement each provider accepts when its deployment does not say."""


class RagPolicy(StrictModel):
    """Marked retrieval context in the system prompt moves, as one block and with its
    documents in their order, after the instructions (opt-in)."""

    enabled: bool = False
    markers: list[tuple[str, str]] = Field(
        default_factory=lambda: [("<context>", "</context>"), ("<documents>", "</documents>")]
    )


class ShapingPolicy(StrictModel):
    """Prompt shaping (see README "Prompt shaping")."""

    enabled: bool = True
    sort_tools: bool = True
    canonical_json: bool = True
    canonical_arguments: bool = Field(
        False,
        description="Re-serialize tool-call arguments with sorted keys (for clients whose order "
        "varies; otherwise they keep the bytes the model generated, which the provider cached).",
    )
    detectors: list[Detector] = Field(default_factory=lambda: list(DETECTORS))
    volatile_patterns: list[str] = Field(
        default_factory=list, description="Extra regexes that mark a line volatile."
    )
    learn: bool = True
    learn_min_requests: int = Field(8, ge=2, description="Requests of a template before its counts decide.")
    stable_share: float = Field(
        0.8, gt=0, le=1, description="A line in at least this share of them is stable."
    )
    placement: Placement = Field(
        "after_last_turn",
        description="Where content that changes within a conversation goes: the end of the "
        "system message, a system message before the newest user turn, one after the last tool "
        "result of an agent step (else before the newest user turn), or one after the newest "
        "turn (the user's message or a tool result); capped by what each deployment accepts.",
    )
    deployment_placement: dict[str, Placement] = Field(
        default_factory=dict,
        description="Per deployment, the latest placement its API and chat template accept "
        "(default per provider: openai, anthropic and bedrock after_last_turn, vllm end_of_system).",
    )
    rag: RagPolicy = Field(default_factory=RagPolicy)
    prompt_cache_key: bool = True
    cache_ttl_s: Seconds = Field(
        600.0, gt=0, description="How long the gateway expects a provider to keep a prefix."
    )
    report_previews: bool = True

    @field_validator("volatile_patterns")
    @classmethod
    def _regexes(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from None
        return patterns

    def issues(self, providers: dict[str, str]) -> list[Issue]:
        """Cross-reference problems: a ``deployment_placement`` entry for a deployment the
        policy does not have (``providers``: deployment name -> provider)."""
        return [
            Issue(loc=("shaping", "deployment_placement", name), message=f"unknown deployment '{name}'")
            for name in self.deployment_placement
            if name not in providers
        ]
