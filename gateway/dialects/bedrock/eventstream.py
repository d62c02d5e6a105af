"""The ``application/vnd.amazon.eventstream`` framing ConverseStream answers in, decoded.

A message is ``total length`` (4 bytes, big-endian, the whole message), ``headers length``
(4), the prelude's CRC32 (over those 8 bytes), the headers, the payload, and the message's
CRC32 (over everything before it). A header is a 1-byte name length, the name, a 1-byte
value type and the value (strings and byte arrays with a 2-byte length). Both CRCs are
checked: a corrupt frame is a broken stream, never something to skip.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

_PRELUDE = struct.Struct(">III")
PRELUDE_BYTES = _PRELUDE.size
"""Total length, headers length, prelude CRC."""
OVERHEAD_BYTES = PRELUDE_BYTES + 4
"""The prelude and the message CRC: the smallest message there is."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The format's own limit on one message (a bigger length is a corrupt prelude)."""

# Header value types: size in bytes of the fixed-width ones; 6 (bytes) and 7 (string) carry
# a 2-byte length. 0 and 1 are the booleans true and false, with no value bytes.
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_BYTES, _STRING = 6, 7


class EventStreamError(ValueError):
    """Bytes that are not a valid event stream (a CRC mismatch, impossible lengths)."""


@dataclass(frozen=True, slots=True)
class EventMessage:
    """One decoded message: its headers (string values as ``str``, others as ``bytes``,
    booleans as ``bool``) and its payload."""

    headers: dict[str, str | bytes | bool]
    payload: bytes

    def header(self, name: str) -> str:
        """A string header's value, or ``""``."""
        value = self.headers.get(name)
        return value if isinstance(value, str) else ""


def _headers(data: bytes) -> dict[str, str | bytes | bool]:
    out: dict[str, str | bytes | bool] = {}
    at = 0
    try:
        while at < len(data):
            size = data[at]
            name = data[at + 1 : at + 1 + size].decode()
            at += 1 + size
            kind = data[at]
            at += 1
            if kind in (_BYTES, _STRING):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                at += 2 + length
                out[name] = raw.decode() if kind == _STRING else raw
            elif kind in _FIXED:
                out[name] = kind == 0 if kind in (0, 1) else data[at : at + _FIXED[kind]]
                at += _FIXED[kind]
            else:
                raise EventStreamError(f"header {name!r} has an unknown value type {kind}")
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"the headers are cut or not UTF-8 ({exc})") from None
    if at != len(data):
        raise EventStreamError("the headers overrun their length")
    return out


class EventStreamDecoder:
    """Feeds on bytes as they arrive (a message may be split anywhere across chunks) and
    returns the complete messages; raises :class:`EventStreamError` on a corrupt one."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> bytes:
        """Bytes of a message not complete yet."""
        return bytes(self._buffer)

    def feed(self, chunk: bytes) -> list[EventMessage]:
        """Take ``chunk``; return the messages it completes, in order."""
        buffer = self._buffer
        buffer += chunk
        out: list[EventMessage] = []
        while len(buffer) >= PRELUDE_BYTES:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(buffer)
            if zlib.crc32(buffer[:8]) != prelude_crc:
                raise EventStreamError("prelude CRC mismatch")
            if total < OVERHEAD_BYTES + headers_length or total > MAX_MESSAGE_BYTES:
                raise EventStreamError(f"impossible lengths (total {total}, headers {headers_length})")
            if len(buffer) < total:
                break
            message = bytes(buffer[:total])
            del buffer[:total]
            (message_crc,) = struct.unpack_from(">I", message, total - 4)
            if zlib.crc32(message[:-4]) != message_crc:
                raise EventStreamError("message CRC mismatch")
            headers = _headers(message[PRELUDE_BYTES : PRELUDE_BYTES + headers_length])
            out.append(EventMessage(headers, message[PRELUDE_BYTES + headers_length : -4]))
        return out
