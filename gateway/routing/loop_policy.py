"""The policy settings of the learning loop: the shadow sample, the judge, and the
calibration target the drift warning compares the live strong share with.

All three live under ``routing:``; none is on by default. ``shadow`` stores prompts and
answers in Redis, so it is opt-in (see docs/routing-loop.md).
"""

from __future__ import annotations

from pydantic import Field

from gateway.validation import Seconds, StrictModel


class Shadow(StrictModel):
    """Also send ``share`` of the classifier-routed ``auto`` chat requests to the other tier,
    off the client's path, and store both answers (and escalations) for ``route judge``.

    The block's presence is the opt-in to storing prompts and answers: ``share: 0`` with
    ``escalations: true`` stores escalations only."""

    share: float = Field(0.0, ge=0, le=1, description="Of the non-stream requests the classifier routed.")
    max_per_minute: int = Field(30, ge=0, description="Shadow calls started per minute, per gateway process.")
    budget_per_day_usd: float | None = Field(
        None, ge=0, description="Spend on shadow calls per UTC day, shared through Redis (None: no cap)."
    )
    max_concurrent: int = Field(4, ge=1, description="Shadow calls in flight per gateway process.")
    escalations: bool = Field(True, description="Store escalated answers as labelled pairs too.")
    max_stored: int = Field(2000, ge=1, description="The stored list is trimmed to the newest this many.")
    max_record_bytes: int = Field(65536, ge=1024, description="A larger pair is not stored (counted).")
    retention_s: Seconds = Field(
        7 * 86400.0, gt=0, description="The list expires this long after its last write."
    )


class Judge(StrictModel):
    """The deployment ``switchyard route judge`` asks to grade stored pairs."""

    deployment: str
    max_tokens: int = Field(64, ge=16, description="The grade is a short JSON object.")
    max_chars: int = Field(
        8000, ge=500, description="The prompt and each answer are cut to their head and tail past this."
    )


class Calibration(StrictModel):
    """The strong share the threshold was calibrated for (``route calibrate`` writes it),
    and when the live share counts as drifted from it."""

    strong_share: float | None = Field(
        None, ge=0, le=1, description="The target (None: the live share is reported, never warned about)."
    )
    tolerance: float = Field(0.1, gt=0, le=1, description="Drifted when |live - target| exceeds this.")
    window_s: Seconds = Field(3600.0, gt=0, description="The decisions the live share is taken over.")
    min_decisions: int = Field(200, ge=1, description="Fewer decisions in the window: no verdict.")
    warn_every_s: Seconds = Field(600.0, gt=0, description="At most one drift log line this often.")
