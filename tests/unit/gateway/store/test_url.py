"""Redis URLs: the set-up check and the password kept out of logs."""

from __future__ import annotations

import pytest

from gateway.store import check_url, display_url


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///tmp/r.sock", "redis+cluster://a:1,b:2"],
)
def test_check_url_takes_what_connect_takes(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:6379", "has no scheme: write redis://localhost:6379"),
        ("http://h:6379", "has the scheme 'http'"),
        ("redis://", "names no host or socket"),
        (":pw@h:1", "'***@h:1' has no scheme"),
    ],
)
def test_check_url_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ValueError, match="REDIS_URL") as info:
        check_url(url)
    assert says in str(info.value) and "pw" not in str(info.value)


def test_display_url_hides_the_password() -> None:
    assert display_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert display_url("rediss://user:pw@h:1") == "rediss://user:***@h:1"
    assert display_url("redis://h:1") == "redis://h:1"
