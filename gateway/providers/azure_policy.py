"""The policy keys of provider ``azure`` (a deployment's ``azure:`` section), checked when the
policy loads; the adapter that reads them is :mod:`gateway.providers.azure`."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field

from gateway.validation import StrictModel

DEFAULT_API_VERSION = "2024-10-21"
"""The ``api-version`` of ``azure.api: deployments`` when the policy sets none (Azure's GA
inference version that has ``stream_options`` and structured outputs)."""

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class AzureSettings(StrictModel):
    """A deployment's ``azure:`` section (provider ``azure`` only)."""

    api: Literal["v1", "deployments"] = Field(
        "v1",
        description="v1: /openai/v1/... with the model in the body; deployments: "
        "/openai/deployments/{deployment}/...?api-version=...",
    )
    deployment: str | None = Field(
        None,
        min_length=1,
        description="The Azure deployment name in the path (api: deployments); "
        "default: the deployment's model.",
    )
    api_version: str | None = Field(
        None,
        min_length=1,
        description=f"The api-version query parameter; default {DEFAULT_API_VERSION} for api: deployments, "
        "none for api: v1 (set e.g. preview to reach preview features).",
    )
    token_env: str | None = Field(
        None,
        pattern=_ENV_NAME,
        description="Environment variable holding a Microsoft Entra ID access token, sent as "
        "Authorization: Bearer (instead of api_key_env's api-key header).",
    )


def check_azure(
    provider: str, settings: AzureSettings | None, api_key_env: str | None, base_url: str
) -> None:
    """Raise ``ValueError`` when a deployment's Azure settings contradict the rest of it."""
    if provider != "azure":
        if settings is not None:
            raise ValueError("azure: needs provider: azure")
        return
    token_env = settings.token_env if settings is not None else None
    if api_key_env and token_env:
        raise ValueError(
            "give api_key_env (the api-key header) or azure.token_env (an Entra ID token), not both"
        )
    if not api_key_env and not token_env:
        raise ValueError(
            "provider azure needs api_key_env (sent as the api-key header) or azure.token_env "
            "(an Entra ID access token)"
        )
    if "/openai" in urlsplit(base_url).path:
        raise ValueError(
            "base_url is the resource endpoint (https://{resource}.openai.azure.com): leave out "
            "/openai/..., the adapter adds the path of azure.api"
        )
