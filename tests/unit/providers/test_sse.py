import orjson
import pytest

from gateway.providers.sse import StreamScanner


def chunk(content: str, usage: object = "absent", choices: bool = True, model: str = "up-model") -> bytes:
    obj: dict[str, object] = {"id": "c1", "object": "chat.completion.chunk", "model": model}
    obj["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}] if choices else []
    if usage != "absent":
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


USAGE = {
    "prompt_tokens": 10,
    "completion_tokens": 3,
    "total_tokens": 13,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def test_events_split_across_reads_are_forwarded_whole() -> None:
    scanner = StreamScanner()
    stream = chunk("Hel") + chunk("lo") + b"data: [DONE]\n\n"
    outs = [scanner.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)]
    assert b"".join(outs) == stream
    assert scanner.done
    # A chunk is an upstream read that completed at least one event.
    assert scanner.chunks == sum(1 for out in outs if out) == 3


def test_partial_event_is_held_back_until_complete() -> None:
    scanner = StreamScanner()
    first = chunk("a")
    assert scanner.feed(first[:-3]) == b""
    assert scanner.feed(first[-3:]) == first
    assert scanner.pending == b""


def test_usage_chunk_is_read_and_stripped_when_the_gateway_asked_for_it() -> None:
    scanner = StreamScanner(strip_usage=True)
    out = scanner.feed(chunk("x", usage=None) + chunk("", usage=USAGE, choices=False) + b"data: [DONE]\n\n")
    assert scanner.usage == USAGE
    assert b'"usage":{' not in out
    assert out.endswith(b"data: [DONE]\n\n")
    assert out.startswith(chunk("x", usage=None))


def test_usage_chunk_is_kept_when_the_client_asked() -> None:
    scanner = StreamScanner(strip_usage=False)
    usage_event = chunk("", usage=USAGE, choices=False)
    assert scanner.feed(usage_event) == usage_event
    assert scanner.usage == USAGE


def test_model_rewrite_changes_only_the_model_field() -> None:
    scanner = StreamScanner(model_from="up-model", model_to="fast")
    out = scanner.feed(chunk("up-model is here"))
    data = orjson.loads(out[len(b"data: ") : -2])
    assert data["model"] == "fast"
    assert data["choices"][0]["delta"]["content"] == "up-model is here"


def test_crlf_framing() -> None:
    scanner = StreamScanner()
    stream = b'data: {"a":1}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert scanner.feed(stream) == stream
    assert scanner.done


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"error": {"message": "boom", "type": "server_error", "code": "x"}}\n\n',
        b'data: {"object": "error", "message": "boom", "code": 500}\n\n',
    ],
)
def test_error_event_is_noticed(event: bytes) -> None:
    scanner = StreamScanner()
    assert scanner.feed(event) == event
    assert scanner.error is not None
    assert scanner.error["message"] == "boom"


def test_usage_and_done_are_found_at_the_end_of_a_large_block() -> None:
    scanner = StreamScanner(strip_usage=True)
    content = b"".join(chunk(f"t{i}", usage=None) for i in range(40))
    out = scanner.feed(content + chunk("", usage=USAGE, choices=False) + b"data: [DONE]\n\n")
    assert out == content + b"data: [DONE]\n\n"
    assert scanner.usage == USAGE and scanner.done
