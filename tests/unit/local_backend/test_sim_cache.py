"""The simulator's tokenizer and prefix cache, as other parts of Switchyard rely on them."""

from __future__ import annotations

from local_backend.sim import (
    PrefixCache,
    Sim,
    SimConfig,
    block_hashes,
    parse_fault_rule,
    parse_faults,
    render_chat,
    token_count,
)


def test_render_puts_tools_first_then_messages_in_order() -> None:
    body = {
        "tools": [{"type": "function", "function": {"name": "b"}}],
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "U"}]}],
    }
    assert render_chat(body) == b'{"type":"function","function":{"name":"b"}}<|system|>\nS\n<|user|>\nU\n'


def test_tokens_are_four_bytes() -> None:
    assert token_count(b"") == 0
    assert token_count(b"abcd") == 1
    assert token_count(b"abcde") == 2


def test_block_hash_chain_changes_from_the_first_changed_block() -> None:
    a = bytes(range(256)) * 2  # 512 bytes = 8 blocks of 64
    b = a[:200] + b"X" + a[201:]
    ha, hb = block_hashes(a, 64), block_hashes(b, 64)
    assert len(ha) == 8
    assert ha[:3] == hb[:3]  # byte 200 is in block 3
    assert all(x != y for x, y in zip(ha[3:], hb[3:], strict=False))
    assert block_hashes(a[:100], 64) == ha[:1]  # only full blocks


def sim(**kwargs: object) -> Sim:
    return Sim(SimConfig(**kwargs))  # type: ignore[arg-type]


def test_vllm_mode_counts_whole_blocks_below_the_prompt_length() -> None:
    s = sim()
    text = b"x" * 640  # 160 tokens, 10 blocks
    assert s.cached_tokens(text, 160) == 0
    # vLLM recomputes the last token: at most 144 of 160 are cached.
    assert s.cached_tokens(text, 160) == 144
    longer = text + b"y" * 10
    assert s.cached_tokens(longer, token_count(longer)) == 160


def test_openai_mode_needs_1024_tokens_and_counts_128s() -> None:
    s = sim(cache_model="openai")
    short = b"a" * 4000  # 1,000 tokens
    s.cached_tokens(short, 1000)
    assert s.cached_tokens(short, 1000) == 0
    long = b"b" * 4800  # 1,200 tokens: 75 blocks = 1,200 tokens matched -> 1,152 counted
    s.cached_tokens(long, 1200)
    assert s.cached_tokens(long, 1200) == 1152


def test_none_mode_never_caches() -> None:
    s = sim(cache_model="none")
    s.cached_tokens(b"z" * 640, 160)
    assert s.cached_tokens(b"z" * 640, 160) == 0


def test_lru_evicts_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity_blocks=4, ttl_s=None)
    first, second = [b"a1", b"a2", b"a3"], [b"b1", b"b2", b"b3"]
    cache.insert(first, 0)
    cache.insert(second, 1)
    assert cache.match(second, 2) == 3
    # The older chain lost two blocks, from its tail: its head block is still a hit.
    assert cache.match(first, 2) == 1


def test_ttl_expires_entries() -> None:
    cache = PrefixCache(capacity_blocks=10, ttl_s=5)
    cache.insert([b"a", b"b"], 0)
    assert cache.match([b"a", b"b"], 4) == 2
    assert cache.match([b"a", b"b"], 10) == 0


def test_fault_syntax() -> None:
    assert parse_faults("reset_mid_stream=3, hang") == {"reset_mid_stream": "3", "hang": ""}
    rule = parse_fault_rule("sim-fast:error=503@0.25#10")
    assert (rule.model, rule.fault, rule.rate, rule.count) == ("sim-fast", "error=503", 0.25, 10)


def test_fault_rule_count_and_rate() -> None:
    s = sim(faults=[parse_fault_rule("m:error=500#2")], seed=1)
    assert [bool(s.faults_for("m", None)) for _ in range(4)] == [True, True, False, False]
    s = sim(faults=[parse_fault_rule("*:hang@0.5")], seed=1)
    hits = sum(bool(s.faults_for("any", None)) for _ in range(1000))
    assert 400 < hits < 600
