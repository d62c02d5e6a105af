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


# --- #13: the end is the [DONE] event itself; every event is complete JSON -------------


def test_done_inside_content_is_not_the_end_and_nothing_is_held_back() -> None:
    scanner = StreamScanner()
    explaining = chunk('an SSE stream ends with "data: [DONE]\\n\\n" like this: data: [DONE]')
    assert scanner.feed(explaining) == explaining  # forwarded at once
    assert not scanner.done
    later = chunk(" and more")
    assert scanner.feed(later) == later
    assert not scanner.done


def test_done_as_raw_bytes_inside_a_json_string_is_not_the_end() -> None:
    # Even unescaped framing bytes inside a JSON string (an upstream that did not escape
    # them) cannot end the stream: the event is split there and fails the JSON check.
    scanner = StreamScanner()
    out = scanner.feed(b'data: {"choices": [{"delta": {"content": "x\n\ndata: [DONE]\n\n"}}]}\n\n')
    assert not scanner.done
    assert scanner.malformed is not None and out == b""


def test_nothing_after_done_is_forwarded() -> None:
    scanner = StreamScanner()
    stream = chunk("a") + b"data: [DONE]\n\n"
    assert scanner.feed(stream + chunk("late")) == stream
    assert scanner.feed(chunk("later")) == b""
    assert scanner.done and scanner.events == 1


@pytest.mark.parametrize(
    "bad",
    [
        b'data: {"choices": [}\n\n',  # ends in } but is not JSON (the old last-byte check passed it)
        b'data: {"choices": [{"delta": {"content": "cut\n\n',
        b"data: [1, 2]\n\n",  # JSON, but not an object
        b"data: not json\n\n",
    ],
)
def test_an_event_that_is_not_a_json_object_is_malformed_and_not_forwarded(bad: bytes) -> None:
    scanner = StreamScanner()
    good = chunk("a")
    assert scanner.feed(good + bad + chunk("b")) == good
    assert scanner.malformed is not None
    assert scanner.feed(chunk("c")) == b""


def test_comments_and_data_less_events_pass_through() -> None:
    scanner = StreamScanner()
    stream = b": keep-alive\n\nevent: ping\n\n" + chunk("a") + b"data: [DONE]\n\n"
    assert scanner.feed(stream) == stream
    assert scanner.done and scanner.events == 1 and scanner.malformed is None


def test_an_event_with_several_data_lines_is_parsed_whole() -> None:
    scanner = StreamScanner()
    event = b'data: {"choices":\ndata: []}\n\n'
    assert scanner.feed(event) == event
    assert scanner.malformed is None and scanner.events == 1
