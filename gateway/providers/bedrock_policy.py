"""A Bedrock deployment's policy keys (``bedrock:``), checked when the policy loads.

``base_url`` is derived: the endpoint override, else the region's public endpoint
(``https://bedrock-runtime.{region}.amazonaws.com``); ``model`` is the model id (or an
inference profile id or ARN) that goes into the request path.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from pydantic import Field, field_validator

from gateway.validation import StrictModel

INSTALL_HINT = "pip install 'switchyard[bedrock]'"
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


class BedrockSettings(StrictModel):
    """Where and as whom a Bedrock deployment signs its requests."""

    region: str = Field(
        description="The AWS region of the Bedrock runtime (us-east-1 ...); also signs the requests."
    )
    profile: str | None = Field(
        None,
        description="A profile of ~/.aws/config to take credentials from; default: the standard chain "
        "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, AWS_PROFILE, the config files, "
        "the container or instance role).",
    )
    endpoint_url: str | None = Field(
        None,
        description="Another endpoint than the region's public one (a VPC endpoint, a test server); "
        "requests are still signed for region.",
    )

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.match(value):
            raise ValueError(f"not an AWS region: {value!r} (e.g. us-east-1)")
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/") if value is not None else None

    def url(self) -> str:
        """The endpoint requests go to."""
        return self.endpoint_url or f"https://bedrock-runtime.{self.region}.amazonaws.com"


def fill_bedrock_defaults(data: Any) -> Any:
    """Before a deployment is validated: a Bedrock deployment's ``base_url`` is its endpoint."""
    if not isinstance(data, dict) or data.get("provider") != "bedrock" or "base_url" in data:
        return data
    settings = data.get("bedrock")
    endpoint = settings.get("endpoint_url") if isinstance(settings, dict) else None
    region = settings.get("region") if isinstance(settings, dict) else None
    # A missing or bad region is reported by the bedrock section's own check, not as base_url.
    url = (
        endpoint
        if isinstance(endpoint, str)
        else f"https://bedrock-runtime.{region or 'unset'}.amazonaws.com"
    )
    return {**data, "base_url": url}


def check_bedrock(provider: str, base_url: str, settings: BedrockSettings | None) -> None:
    """Raise ``ValueError`` when a deployment's ``bedrock:`` section and provider disagree, or
    when botocore (which signs the requests) is not installed."""
    if provider != "bedrock":
        if settings is not None:
            raise ValueError("bedrock: needs provider: bedrock")
        return
    if settings is None:
        raise ValueError(
            "provider bedrock needs a bedrock: section with its region (bedrock: {region: us-east-1})"
        )
    if base_url != settings.url():
        raise ValueError(
            "a bedrock deployment takes its URL from bedrock.endpoint_url or bedrock.region: "
            "leave base_url out"
        )
    if importlib.util.find_spec("botocore") is None:
        raise ValueError(
            f"provider bedrock signs its requests with botocore, which is not installed: {INSTALL_HINT}"
        )
