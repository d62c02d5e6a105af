"""The answering faults (what a broken upstream sends instead of an answer), on the wire."""

from __future__ import annotations

import orjson
import pytest

from local_backend.sim import SimThread
from tests.integration.local_backend.sim.test_fault_injection import raw_chat


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("empty_200", b""),
        ("error_200", b'{"error":'),
        ("invalid_200", b'{"choices": [}'),
    ],
)
def test_non_stream_answering_faults_are_200s_that_are_no_answer(
    sim: SimThread, fault: str, expected: bytes
) -> None:
    raw = raw_chat(sim, fault, stream=False)
    assert raw.status == 200 and raw.body.startswith(expected)
    if fault == "invalid_200":
        assert raw.body.endswith(b"}")  # looks complete by its last byte


def test_truncated_200_is_cut_json(sim: SimThread) -> None:
    raw = raw_chat(sim, "truncated_200", stream=False)
    assert raw.status == 200 and raw.body.startswith(b'{"id":')
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw.body)


def test_stream_answering_faults(sim: SimThread) -> None:
    assert raw_chat(sim, "empty_200").body == b""
    assert raw_chat(sim, "error_200").events[0].startswith(b'{"error":')
    inside = raw_chat(sim, "done_in_content")
    assert b"data: [DONE]" in inside.body and not inside.body.endswith(b"data: [DONE]\n\n")
    invalid = raw_chat(sim, "invalid_200")
    assert b'data: {"choices": [}\n\n' in invalid.body and invalid.body.endswith(b"data: [DONE]\n\n")


def test_done_no_close_and_headers_hang_hold_the_connection(sim: SimThread) -> None:
    kept = raw_chat(sim, "done_no_close", timeout_s=0.5)
    assert kept.body.endswith(b"data: [DONE]\n\n") and isinstance(kept.error, TimeoutError)
    hung = raw_chat(sim, "headers_hang", timeout_s=0.5, stream=False)
    assert hung.status == 200 and hung.body == b"" and isinstance(hung.error, TimeoutError)
