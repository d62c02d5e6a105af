"""The expected-hit chain: cache_salt, a vLLM deployment's block size and bytes per token."""

from __future__ import annotations

import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cachestats.chain import (
    CHECKPOINT_BYTES,
    CHECKPOINT_TOKENS,
    FINE_BYTES,
    _chain,
    _common_steps,
    _Recent,
    checkpoints,
)
from gateway.cachestats.prefix import Geometries, LocalPrefixes

SYSTEM = "You answer questions about the Switchyard gateway. " * 60  # ~3,000 bytes


def body(user: str, salt: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    }
    if salt is not None:
        out["cache_salt"] = salt
    return out


def test_a_salted_request_only_matches_its_own_salt() -> None:
    prefixes = LocalPrefixes(geometry=Geometries())
    assert prefixes.expect_and_add("d", checkpoints(body("a", salt="tenant-1")), 600) == 0
    assert prefixes.expect_and_add("d", checkpoints(body("b", salt="tenant-2")), 600) == 0
    assert prefixes.expect_and_add("d", checkpoints(body("c")), 600) == 0
    assert prefixes.expect_and_add("d", checkpoints(body("d", salt="tenant-1")), 600) > 0
    assert checkpoints(body("a")) == checkpoints(body("a", salt=""))


def test_openai_deployments_count_in_128_token_checkpoints() -> None:
    prefixes = LocalPrefixes(geometry=Geometries())
    chain = checkpoints(body("first"))
    prefixes.expect_and_add("openai", chain, 600)
    hit = prefixes.expect_and_add("openai", checkpoints(body("second")), 600)
    assert hit == len("<|system|>\n" + SYSTEM + "\n<|user|>\n") // 512 * CHECKPOINT_TOKENS


def test_a_vllm_deployment_counts_in_its_blocks_with_its_calibrated_bytes_per_token() -> None:
    geometry = Geometries()
    geometry.use_vllm("cpu", block_tokens=128)
    geometry.use_vllm("gpu")  # block size not known: vLLM's GPU default
    assert (geometry.block_tokens("cpu"), geometry.block_tokens("gpu")) == (128, 16)
    geometry.use_vllm("cpu")  # a later hint without a size keeps the one learned
    assert geometry.block_tokens("cpu") == 128
    prefixes = LocalPrefixes(geometry=geometry)
    first = checkpoints(body("first"))
    # The tokenizer makes 3 bytes a token: the ratio follows what the deployment reports.
    for _ in range(30):
        geometry.observe("cpu", first, first.prompt_bytes // 3)
    assert abs(geometry.bytes_per_token("cpu") - 3.0) < 0.01
    prefixes.expect_and_add("cpu", first, 600)
    hit = prefixes.expect_and_add("cpu", checkpoints(body("second")), 600)
    shared_bytes = len("<|system|>\n" + SYSTEM + "\n<|user|>\n")
    matched = shared_bytes // FINE_BYTES * FINE_BYTES
    assert hit == int(matched / 3.0 // 128) * 128
    assert hit % 128 == 0 and abs(hit - shared_bytes / 3) <= 128


def test_an_openai_deployment_is_calibrated_too_and_no_estimate_exceeds_the_prompt() -> None:
    geometry = Geometries()
    geometry.observe("openai", [1, 2, 3], 10)  # not a chain: nothing to learn from
    assert geometry.bytes_per_token("openai") == 4.0
    prefixes = LocalPrefixes(geometry=geometry)
    first = checkpoints(body("first"))
    # Its tokenizer makes 6.5 bytes a token (code, JSON): 4 bytes a token would promise
    # more cached tokens than the prompt has.
    for _ in range(40):
        geometry.observe("openai", first, int(first.prompt_bytes / 6.5))
    prompt_tokens = int(first.prompt_bytes / 6.5)
    prefixes.expect_and_add("openai", first, 600)
    hit = prefixes.expect_and_add("openai", first, 600)  # the same prompt again: all of it
    assert 0 < hit <= prompt_tokens
    assert hit % CHECKPOINT_TOKENS == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "tenant"]), st.integers(0, 3), st.integers(0, 2500), st.binary(max_size=40)
        ),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
def test_a_chain_reused_from_a_recent_prompt_equals_one_computed_afresh(
    edits: list[tuple[str, int, int, bytes]], fine_first: bool
) -> None:
    # Prompts that share starts of every length with the recent ones (and repeat them): the
    # incremental chain, and its fine chain, are exactly the chain of the whole prompt.
    recent = _Recent()
    texts = [b"seed prompt " * 300]
    for salt, base, cut, tail in edits:
        old = texts[min(base, len(texts) - 1)]
        text = old[:cut] + tail + old[cut:][: len(tail) * 37]
        texts.append(text)
        seed = zlib.crc32(salt.encode()) if salt else 0
        chain = recent.chain(text, seed)
        if fine_first:
            assert chain.fine == _chain(text, FINE_BYTES, seed)
        assert chain == _chain(text, CHECKPOINT_BYTES, seed)
        assert chain.fine == _chain(text, FINE_BYTES, seed)
        assert chain.prompt_bytes == len(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.lists(st.tuples(st.integers(0, 30_000), st.binary(min_size=1, max_size=12)), max_size=4),
            st.integers(-600, 600),
        ),
        min_size=1,
        max_size=10,
    ),
    st.booleans(),
)
def test_a_chain_carried_over_equal_bytes_equals_one_computed_afresh(
    edits: list[tuple[int, list[tuple[int, bytes]], int]], fine_first: bool
) -> None:
    # Prompts that differ from a recent one in a few values of equal length (a time, a name)
    # anywhere, then in their end: the checkpoints carried over the equal bytes between the
    # values (not hashed again) are exactly the chain of the whole prompt.
    recent = _Recent()
    texts = [bytes(range(256)) * 120]  # 30,720 bytes (60 steps), no step repeating another
    for base, values, end in edits:
        text = bytearray(texts[min(base, len(texts) - 1)])
        for at, value in values:
            text[at : at + len(value)] = value[: max(0, len(text) - at)]
        text = bytes(text[: len(text) + end] if end < 0 else text + bytes(end))
        texts.append(text)
        chain = recent.chain(text, 0)
        if fine_first:
            assert chain.fine == _chain(text, FINE_BYTES, 0)
        assert chain == _chain(text, CHECKPOINT_BYTES, 0)
        assert chain.fine == _chain(text, FINE_BYTES, 0)


def test_the_common_steps_of_two_prompts_are_counted_exactly() -> None:
    # Wherever two prompts first differ (in the first steps, as a new conversation's time does,
    # at the edge of the steps compared first, near the end, or nowhere) the count of the
    # whole steps they share is exact: too few would hash what could be reused, too many
    # would reuse what differs.
    for length in (0, 1, 7, 8, 9, 17, 40):
        old = bytes(range(256)) * 2 * length  # ``length`` steps
        for end in (-600, -1, 0, 1, 600):
            for differs_at in range(length + 2):
                text = bytearray(old + bytes(max(0, end)))
                if differs_at * CHECKPOINT_BYTES + 5 < len(text):
                    text[differs_at * CHECKPOINT_BYTES + 5] ^= 1
                text = text[: len(text) + min(0, end)]
                top = min(len(text), len(old)) // CHECKPOINT_BYTES
                shared = min(differs_at, top)
                for known in {0, 1, 7, 8, 9, shared}:
                    if known <= shared:
                        assert _common_steps(bytes(text), old, known) == shared, (
                            length,
                            end,
                            differs_at,
                            known,
                        )


def test_a_prompt_differing_every_few_steps_has_the_chain_computed_afresh() -> None:
    # Differences every step, every 20 (stretches too short to carry a difference over),
    # every 40 and every 100 (long enough): the chain is the whole prompt's either way.
    base = bytes(range(256)) * 400  # 200 steps
    for every in (1, 20, 40, 100):
        text = bytearray(base)
        for step in range(1, 200, every):
            text[step * CHECKPOINT_BYTES + 7] ^= 1
        recent = _Recent()
        recent.chain(base, 0)
        chain = recent.chain(bytes(text), 0)
        assert chain == _chain(bytes(text), CHECKPOINT_BYTES, 0)
        assert chain.fine == _chain(bytes(text), FINE_BYTES, 0)
