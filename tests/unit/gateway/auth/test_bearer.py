"""The one bearer parser: the scheme is case-insensitive (RFC 7235), the token is trimmed."""

from __future__ import annotations

import pytest

from gateway.auth.bearer import bearer_token


@pytest.mark.parametrize("header", ["Bearer tok", "bearer tok", "BEARER tok", "Bearer  tok "])
def test_any_case_of_the_scheme_gives_the_token(header: str) -> None:
    assert bearer_token(header) == "tok"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic tok", "Bearertok", "tok"])
def test_a_header_without_a_bearer_token_gives_none(header: str | None) -> None:
    assert bearer_token(header) is None
