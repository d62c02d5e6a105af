"""Embeddings: deterministic unit vectors, the same numbers in float and base64."""

from __future__ import annotations

import base64
import math
import struct

import openai
import pytest

from local_backend.sim import SimControl


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_base64_and_float_decode_to_the_same_unit_vectors(client: openai.OpenAI) -> None:
    sdk_default = client.embeddings.create(model="m", input=["alpha", "beta"])  # the SDK asks for base64
    floats = client.embeddings.create(model="m", input=["alpha", "beta"], encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1] and floats.object == "list" and floats.model == "m"
    for a, b in zip(sdk_default.data, floats.data, strict=True):
        assert a.embedding == b.embedding  # float32 both ways: exactly equal
        assert len(b.embedding) == 64
        assert norm(b.embedding) == pytest.approx(1.0, abs=1e-6)
    assert floats.data[0].embedding != floats.data[1].embedding
    # Little-endian float32, as the SDK decodes it.
    raw = client.embeddings.with_raw_response.create(model="m", input="alpha", encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    decoded = list(struct.unpack("<64f", base64.b64decode(encoded)))
    assert decoded == floats.data[0].embedding


def test_embeddings_are_deterministic_and_honour_dimensions(client: openai.OpenAI) -> None:
    once = client.embeddings.create(model="m", input="alpha", encoding_format="float").data[0].embedding
    again = client.embeddings.create(model="m", input="alpha", encoding_format="float").data[0].embedding
    assert once == again
    other_model = client.embeddings.create(model="timed", input="alpha", encoding_format="float")
    assert other_model.data[0].embedding != once
    short = client.embeddings.create(model="m", input="alpha", dimensions=8, encoding_format="float")
    vector = short.data[0].embedding
    assert len(vector) == 8 and norm(vector) == pytest.approx(1.0, abs=1e-6)
    # A shortened embedding is the full one's head, renormalised.
    head = once[:8]
    assert vector == pytest.approx([x / norm(head) for x in head], abs=1e-6)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="m", input="alpha", dimensions=65)


def test_embedding_usage_and_inputs(client: openai.OpenAI, control: SimControl) -> None:
    reply = client.embeddings.create(model="m", input=["abcd", "abcde"], encoding_format="float")
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (3, 3)
    ids = client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]], encoding_format="float")
    assert ids.usage.prompt_tokens == 5 and len(ids.data) == 2
    for bad in ("", [], [""]):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="m", input=bad)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")
    record = control.stats()["recent"][0]
    assert (record["endpoint"], record["prompt_tokens"], record["outcome"]) == (
        "/v1/embeddings",
        3,
        "completed",
    )
