"""`switchyard keys` with a Redis it cannot reach: one line that says what to do, no traceback."""

from __future__ import annotations

import pytest

from gateway.cli import main
from gateway.procutil import free_port


@pytest.mark.parametrize("argv", [["keys", "list"], ["keys", "create", "--name", "ci"]])
def test_an_unreachable_redis_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    assert main([*argv, "--redis-url", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("switchyard keys: cannot reach Redis at redis://user:***@127.0.0.1:")
    assert "check REDIS_URL / --redis-url" in err and "s3cret" not in err
