"""OpenAI sampling values an Anthropic model would answer with a 400: refused at the edge,
per the deployment's model, with a clear ``unsupported_parameter``."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dialects.anthropic.request import takes_temperature_with_top_p, to_messages_request
from gateway.errors import InvalidRequestError

ASK = [{"role": "user", "content": "hi"}]


def _translate(model: str, setting: bool | None = None, **sampling: Any) -> dict[str, Any]:
    body = {"model": "x", "messages": ASK, **sampling}
    return to_messages_request(
        body, model=model, default_max_tokens=64, structured_outputs=True, temperature_with_top_p=setting
    )


@pytest.mark.parametrize(
    "model", ["claude-3-5-haiku-latest", "claude-sonnet-4-5", "claude-opus-4-1-20250805"]
)
def test_temperature_above_one_is_refused_naming_anthropics_range(model: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        _translate(model, temperature=1.5)
    assert (info.value.param, info.value.code) == ("temperature", "unsupported_parameter")
    assert "0 to 1" in info.value.message


def test_temperature_up_to_one_is_sent_unchanged() -> None:
    assert _translate("claude-sonnet-4-5", temperature=1)["temperature"] == 1
    assert _translate("claude-sonnet-4-5", temperature=0.2)["temperature"] == 0.2
    assert _translate("claude-sonnet-4-5", top_p=0.9)["top_p"] == 0.9


@pytest.mark.parametrize(
    "model",
    ["claude-opus-4-1-20250805", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5", "claude-sim"],
)
def test_temperature_with_top_p_is_refused_for_recent_models(model: str) -> None:
    assert not takes_temperature_with_top_p(model)
    with pytest.raises(InvalidRequestError) as info:
        _translate(model, temperature=0.5, top_p=0.9)
    assert (info.value.param, info.value.code) == ("top_p", "unsupported_parameter")
    assert model in info.value.message and "temperature_with_top_p" in info.value.message


@pytest.mark.parametrize(
    "model",
    ["claude-3-5-sonnet-20241022", "claude-3-haiku-20240307", "claude-sonnet-4-20250514", "claude-opus-4-0"],
)
def test_older_models_take_both(model: str) -> None:
    assert takes_temperature_with_top_p(model)
    sent = _translate(model, temperature=0.5, top_p=0.9)
    assert (sent["temperature"], sent["top_p"]) == (0.5, 0.9)


def test_the_deployment_setting_overrides_the_model_family() -> None:
    sent = _translate("claude-sonnet-4-5", True, temperature=0.5, top_p=0.9)
    assert (sent["temperature"], sent["top_p"]) == (0.5, 0.9)
    with pytest.raises(InvalidRequestError):
        _translate("claude-3-5-sonnet-20241022", False, temperature=0.5, top_p=0.9)
