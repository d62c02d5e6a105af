"""The policy's ``responses:`` section: how long stored Responses API responses are kept."""

from __future__ import annotations

from pydantic import Field

from gateway.validation import Seconds, StrictModel


class ResponsesPolicy(StrictModel):
    """Stored responses (``store: true``, the default) for ``previous_response_id`` and
    ``GET /v1/responses/{id}``."""

    store_ttl_s: Seconds = Field(
        30 * 86400.0,
        gt=0,
        description="How long a stored response and its input items are kept in Redis "
        "(OpenAI keeps 30 days).",
    )
