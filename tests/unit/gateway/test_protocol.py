import pytest

from gateway.api.protocol import ChatCompletionRequest, EmbeddingRequest, validate
from gateway.errors import InvalidRequestError


def error_of(body: dict) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        validate(ChatCompletionRequest, body)
    return info.value


def test_valid_request_with_unknown_fields_passes() -> None:
    validate(
        ChatCompletionRequest,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "foo": {"x": 1}},
    )


def test_missing_parameter_is_named() -> None:
    err = error_of({"model": "m"})
    assert err.param == "messages"
    assert err.message == "Missing required parameter: 'messages'."


def test_wrong_type_is_named_with_its_index() -> None:
    assert error_of(
        {"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "robot"}]}
    ).param == ("messages[1].role")
    assert (
        error_of({"model": "m", "messages": [{"role": "user", "content": 5}]}).param == "messages[0].content"
    )
    assert error_of({"model": "m", "messages": [{"role": "user"}], "max_tokens": "10"}).param == "max_tokens"
    assert error_of({"model": "m", "messages": [{"role": "user"}], "temperature": 3}).param == "temperature"
    assert error_of({"model": "", "messages": [{"role": "user"}]}).param == "model"


def test_embeddings_input_types() -> None:
    validate(EmbeddingRequest, {"model": "e", "input": ["a", "b"]})
    validate(EmbeddingRequest, {"model": "e", "input": [[1, 2], [3]]})
    with pytest.raises(InvalidRequestError) as info:
        validate(EmbeddingRequest, {"model": "e", "input": {"a": 1}})
    assert info.value.param == "input"
