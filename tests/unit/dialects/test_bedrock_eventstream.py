"""ConverseStream's binary framing: frames split anywhere across reads, and corrupt frames."""

from __future__ import annotations

import struct
import zlib

import pytest

from gateway.dialects.bedrock.eventstream import EventStreamDecoder, EventStreamError
from tests.fixtures.fake_bedrock import encode_frame, event, exception

FRAMES = [
    event("messageStart", {"role": "assistant"}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hé, ✓"}}),
    exception("throttlingException", "slow down"),
]


def test_frames_split_at_every_byte_decode_the_same() -> None:
    data = b"".join(FRAMES)
    decoder = EventStreamDecoder()
    messages = [m for i in range(len(data)) for m in decoder.feed(data[i : i + 1])]
    assert [m.header(":event-type") or m.header(":exception-type") for m in messages] == [
        "messageStart",
        "contentBlockDelta",
        "throttlingException",
    ]
    assert messages[1].payload.decode() == '{"contentBlockIndex":0,"delta":{"text":"Hé, ✓"}}'
    assert messages[2].header(":message-type") == "exception"
    assert decoder.pending == b""


def test_several_frames_in_one_read_and_a_partial_one_kept() -> None:
    data = b"".join(FRAMES)
    decoder = EventStreamDecoder()
    assert len(decoder.feed(data[:-5])) == 2
    assert decoder.pending == FRAMES[2][:-5]
    assert len(decoder.feed(data[-5:])) == 1


def test_a_bad_message_crc_is_an_error() -> None:
    decoder = EventStreamDecoder()
    decoder.feed(FRAMES[0])
    with pytest.raises(EventStreamError, match="message CRC"):
        decoder.feed(event("contentBlockDelta", {"delta": {"text": "x"}}, corrupt=True))


def test_a_bad_prelude_crc_is_an_error_before_the_lengths_are_trusted() -> None:
    frame = bytearray(FRAMES[0])
    frame[3] ^= 0x01  # the total length
    with pytest.raises(EventStreamError, match="prelude CRC"):
        EventStreamDecoder().feed(bytes(frame[:12]))


def test_impossible_lengths_are_an_error() -> None:
    prelude = struct.pack(">II", 10, 0)
    with pytest.raises(EventStreamError, match="impossible lengths"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_non_string_header_types_are_read() -> None:
    head = b"\x04flag\x00" + b"\x05count\x04" + struct.pack(">i", 7) + b"\x03raw\x06\x00\x02ab"
    prelude = struct.pack(">II", 12 + len(head) + 2 + 4, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + b"{}"
    frame = body + struct.pack(">I", zlib.crc32(body))
    (message,) = EventStreamDecoder().feed(frame)
    assert message.headers == {"flag": True, "count": struct.pack(">i", 7), "raw": b"ab"}
    assert message.payload == b"{}"


def test_an_unknown_header_type_is_an_error() -> None:
    head = b"\x01x\x0f"
    prelude = struct.pack(">II", 12 + len(head) + 4, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head
    with pytest.raises(EventStreamError, match="unknown value type"):
        EventStreamDecoder().feed(body + struct.pack(">I", zlib.crc32(body)))


def test_the_test_encoder_matches_the_format() -> None:
    frame = encode_frame({":event-type": "x"}, b"{}")
    total, headers = struct.unpack(">II", frame[:8])
    assert total == len(frame) and headers == len(frame) - 16 - 2
