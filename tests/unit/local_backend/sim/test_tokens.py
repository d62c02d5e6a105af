"""The simulator's tokenizer, block-hash chain and prefix cache: the definitions other parts rely on."""

from __future__ import annotations

import json
import time

from local_backend.sim import (
    JSON_MIN_TOKENS,
    PrefixCache,
    answer_text,
    block_hashes,
    cached_token_count,
    is_cacheable,
    json_answer,
    natural_length,
    token_count,
)


def test_tokens_are_four_bytes() -> None:
    assert [token_count(b"x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert token_count("ééé".encode()) == 2  # 6 UTF-8 bytes


def test_block_hash_chain_changes_from_the_first_changed_block() -> None:
    a = bytes(range(256)) * 2  # 512 bytes = 8 blocks of 64
    b = a[:200] + b"X" + a[201:]
    ha, hb = block_hashes(a, 64), block_hashes(b, 64)
    assert len(ha) == 8 and all(len(h) == 16 for h in ha)
    assert ha[:3] == hb[:3]  # byte 200 is in block 3
    assert all(x != y for x, y in zip(ha[3:], hb[3:], strict=True))
    assert block_hashes(a[:127], 64) == ha[:1]  # only full blocks
    # A block's hash names its whole prefix: the same bytes after another prefix differ.
    assert block_hashes(a[64:128], 64)[0] != ha[1]
    assert block_hashes(a, 64, salt=b"tenant")[0] != ha[0]


def test_hashing_a_4000_token_prompt_takes_well_under_a_millisecond() -> None:
    text = bytes(range(256)) * 63  # 16,128 bytes: 4,032 tokens, 252 blocks
    block_hashes(text, 64)
    rounds = 50
    t0 = time.perf_counter()
    for _ in range(rounds):
        block_hashes(text, 64)
    per_call_s = (time.perf_counter() - t0) / rounds
    assert per_call_s < 0.001, per_call_s


def test_vllm_mode_caps_below_the_whole_prompt() -> None:
    assert cached_token_count(10, 160, 16, "vllm") == 144  # 160 tokens: the last block is recomputed
    assert cached_token_count(10, 161, 16, "vllm") == 160
    assert cached_token_count(3, 161, 16, "vllm") == 48
    assert cached_token_count(0, 161, 16, "vllm") == 0
    assert cached_token_count(1, 16, 16, "vllm") == 0
    assert cached_token_count(10, 161, 16, "none") == 0


def test_openai_mode_needs_1024_tokens_and_counts_128s() -> None:
    assert cached_token_count(62, 1000, 16, "openai") == 0  # prompt below 1,024
    assert cached_token_count(75, 1300, 16, "openai") == 1152  # 1,200 matched -> 1,152
    assert cached_token_count(63, 1300, 16, "openai") == 0  # 1,008 matched: below 1,024
    assert cached_token_count(64, 1300, 16, "openai") == 1024
    assert cached_token_count(500, 2006, 16, "openai") == 1920  # OpenAI's documented example
    assert not is_cacheable(1023, "openai") and is_cacheable(1024, "openai")
    assert is_cacheable(1, "vllm") and not is_cacheable(10_000, "none")


def test_lru_evicts_the_tail_of_the_least_recent_chain_first() -> None:
    cache = PrefixCache(capacity_blocks=4)
    first, second = [b"a1", b"a2", b"a3"], [b"b1", b"b2", b"b3"]
    cache.insert(first, 0)
    cache.insert(second, 1)
    assert len(cache) == 4 and cache.usage == 1.0
    assert cache.match(second, 2) == 3
    # The older chain lost two blocks from its tail: its head block still hits.
    assert cache.match(first, 2) == 1
    assert cache.match([b"a1", b"zz", b"a3"], 2) == 1  # a miss ends the match


def test_a_hit_touches_the_chain() -> None:
    cache = PrefixCache(capacity_blocks=4)
    cache.insert([b"a1", b"a2"], 0)
    cache.insert([b"b1", b"b2"], 1)
    cache.insert([b"a1", b"a2"], 2)  # a repeat of the first chain makes it the most recent
    cache.insert([b"c1"], 3)
    assert cache.match([b"a1", b"a2"], 4) == 2
    assert cache.match([b"b1", b"b2"], 4) == 1


def test_ttl_expires_idle_entries() -> None:
    cache = PrefixCache(capacity_blocks=10, ttl_s=5)
    cache.insert([b"a", b"b"], 0)
    assert cache.match([b"a", b"b"], 4) == 2
    cache.insert([b"a"], 4)  # touched: a lives on, b expires
    assert cache.match([b"a", b"b"], 8) == 1
    cache.insert([b"c"], 20)  # inserting drops expired entries
    assert len(cache) == 1


def test_answers_are_deterministic_sentence_text() -> None:
    assert answer_text(7, 40) == answer_text(7, 40)
    assert len(answer_text(7, 40)) == 40
    assert answer_text(7, 40).startswith(answer_text(7, 12))
    assert len(answer_text(3, 100_000)) == 100_000
    assert natural_length(12345, (16, 48)) in range(16, 49)
    assert natural_length(12345, (5, 5)) == 5
    for tokens in (1, JSON_MIN_TOKENS, 30):
        text = json_answer(99, tokens)
        assert set(json.loads(text)) == {"answer"}
        assert len(text) == 4 * max(tokens, JSON_MIN_TOKENS)
