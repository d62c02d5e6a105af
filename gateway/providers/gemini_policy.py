"""The load-time checks of a ``provider: gemini`` or ``provider: vertex`` deployment.

Kept apart from the adapter (:mod:`gateway.providers.gemini`) so the policy schema can run
them without importing any adapter (see :mod:`gateway.providers.registry`).
"""

from __future__ import annotations

import re
from typing import Any

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
"""The Gemini API's ``base_url``."""

_VERTEX_PATH = re.compile(r"/v1(beta1)?/projects/[^/]+/locations/[^/]+/publishers/[^/]+$")


def check_google(deployment: Any) -> None:
    """Raise ``ValueError`` (one line saying what to do) when a Gemini or Vertex deployment's
    settings cannot work; any other provider passes."""
    provider = deployment.provider
    if deployment.google_auth != "env" and provider != "vertex":
        raise ValueError("google_auth: metadata needs provider: vertex")
    if provider not in ("gemini", "vertex"):
        return
    base_url: str = deployment.base_url
    if ":generateContent" in base_url or ":streamGenerateContent" in base_url or "/models/" in base_url:
        raise ValueError(
            f"base_url is the API prefix, without /models/...: the gateway adds the model and method "
            f"(provider {provider})"
        )
    if provider == "vertex" and not _VERTEX_PATH.search(base_url):
        raise ValueError(
            "provider vertex: base_url must be https://{region}-aiplatform.googleapis.com/v1/projects/"
            "{project}/locations/{region}/publishers/google"
        )
    if not deployment.api_key_env and deployment.google_auth == "env":
        what = (
            "an OAuth access token (gcloud auth print-access-token), or set google_auth: metadata"
            if provider == "vertex"
            else "the API key"
        )
        raise ValueError(f"provider {provider}: set api_key_env to the variable holding {what}")
    if deployment.responses_api == "native":
        raise ValueError(
            f"provider {provider}: responses_api must be translate (Google serves no /v1/responses)"
        )
