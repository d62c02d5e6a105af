"""Which auth mode a bind address gets, and when serving without keys is refused."""

from __future__ import annotations

import pytest

from gateway.config import Settings


def test_auto_is_none_on_loopback_and_keys_elsewhere() -> None:
    assert Settings(host="127.0.0.1").auth_mode() == "none"
    assert Settings(host="localhost").auth_mode() == "none"
    assert Settings(host="::1").auth_mode() == "none"
    assert Settings(host="0.0.0.0").auth_mode() == "keys"
    assert Settings(host="10.1.2.3").auth_mode() == "keys"
    assert Settings(host="127.0.0.1", auth="keys").auth_mode() == "keys"


def test_no_auth_on_a_public_address_needs_the_explicit_flag() -> None:
    with pytest.raises(ValueError, match="insecure-no-auth"):
        Settings(host="0.0.0.0", auth="none").auth_mode()
    assert Settings(host="0.0.0.0", auth="none", insecure_no_auth=True).auth_mode() == "none"
    env = {"SWITCHYARD_HOST": "0.0.0.0", "SWITCHYARD_AUTH": "none", "SWITCHYARD_INSECURE_NO_AUTH": "1"}
    assert Settings.from_env(env).auth_mode() == "none"
