"""What shaping did to one request: :class:`ShapeResult` (the response header, the moves
record, the prefix hash, the segments for the divergence report) and the reasons a unit moved."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ShapeResult:
    """What shaping did to one request."""

    template: str = "-"
    moved: int = 0
    rag_moved: bool = False
    moved_before_user: int = 0
    """Of the moved units, those that went into a system message of their own later in the
    conversation (they change within it): before the newest user turn, or after the last tool
    result (``late_at``); the others went to the end of the system message."""
    late_at: str = "user"
    """Where that message went: ``user`` (before the newest user turn), ``tool`` (after the last
    tool result of the agent step under way) or ``turn`` (after the user's newest message)."""
    moves: list[tuple[str, str, str]] = field(default_factory=list)
    """Per moved unit (the retrieval block included): what it is (``line``, ``list``,
    ``section``, ``<env>``, ``code block``, ``part``, ``retrieved``), why it moved (see
    :data:`REASONS`) and where to (``end``, ``user``, ``tool``, ``instructions``) — for the
    cache stats, which keep it per request."""
    tools_sorted: bool = False
    stable_prefix_tokens: int = 0
    stable_texts: tuple[str | bytes, ...] = ()
    """The stable prefix's text (the tools' JSON, the head's stable units), for counting its
    tokens with the deployment's own tokenizer (:mod:`gateway.shaping.tokens`)."""
    head_stable_chars: int = 0
    """How much of the head system message (after shaping) is the stable part (string content)."""
    head_stable_parts: int = 0
    """How many of the head system message's parts (after shaping) are stable (array content)."""
    prefix_hash: str = ""
    """Hash of the tools and the stable head's lines: the natural ``prompt_cache_key``."""
    segments: list[tuple[str, str, str]] = field(default_factory=list)
    """The shaped prompt's segments, in order: (label, hash, preview) — for the divergence report."""
    rendered_tools: bytes | None = None
    """The shaped tools' prompt bytes, when shaping set them (rendered once per tool set)."""

    def header(self) -> str:
        """The ``x-switchyard-shaping`` value."""
        parts = [f"moved={self.moved}"]
        if self.rag_moved:
            parts.append("rag=moved")
        if self.tools_sorted:
            parts.append("tools=sorted")
        parts.append(f"stable_prefix_tokens={self.stable_prefix_tokens}")
        parts.append(f"template={self.template}")
        if self.moved:
            parts.append(
                f"to=end:{self.moved - self.moved_before_user},{self.late_at}:{self.moved_before_user}"
            )
        return "; ".join(parts)


REASONS = {
    "changes within the conversation": "it differed in the conversation's previous request",
    "same within the conversation": "volatile across conversations, constant within this one",
    "first turn": "volatile; no history yet to keep cached ahead of it",
    "placement": "volatile; the deployments it may reach take system text only at the top",
    "retrieved": "the retrieval block, after the instructions",
    "retrieved anew": "passages new in this conversation's request",
}
"""The reasons a unit moved, as :attr:`ShapeResult.moves` gives them, and what each means."""
