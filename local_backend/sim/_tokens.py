"""The simulator's tokenizer, block-hash prefix cache and canned answers.

The definitions here are the contract the rest of Switchyard builds on (see the
docstring of :mod:`local_backend.sim`); keep them simple and keep them stable. How a
chat body becomes prompt bytes is the gateway's: :mod:`gateway.prompt_render`.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

CacheModel = Literal["vllm", "openai", "none"]

BYTES_PER_TOKEN = 4
OPENAI_MIN_CACHED_TOKENS = 1024
OPENAI_CACHE_INCREMENT_TOKENS = 128
HASH_BYTES = 16


def token_count(text: bytes) -> int:
    """Tokens in ``text``: one per 4 bytes, the last one possibly short (``ceil(len / 4)``)."""
    return -(-len(text) // BYTES_PER_TOKEN)


def block_hashes(text: bytes, block_bytes: int, salt: bytes = b"") -> list[bytes]:
    """The hash chain of the full ``block_bytes`` blocks of ``text``.

    ``h[i] = blake2b(h[i-1] + block_i, digest_size=16)``, with ``h[-1]`` empty (or the
    digest of ``salt``, vLLM's ``cache_salt``), so a block's hash names its whole prefix.
    """
    hashes: list[bytes] = []
    blake = hashlib.blake2b
    parent = blake(salt, digest_size=HASH_BYTES).digest() if salt else b""
    view = memoryview(text)
    for start in range(0, len(text) - block_bytes + 1, block_bytes):
        hasher = blake(parent, digest_size=HASH_BYTES)
        hasher.update(view[start : start + block_bytes])
        parent = hasher.digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """An LRU of block hashes with an optional idle TTL.

    :meth:`match` counts the leading blocks of a chain that are present (and not
    expired); :meth:`insert` touches a chain from its tail back to its head, so the
    head is the most recently used and, as in vLLM, the tail of a prefix goes first.
    """

    def __init__(self, capacity_blocks: int, ttl_s: float | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self._blocks: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Share of the capacity in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return len(self._blocks) / self.capacity_blocks if self.capacity_blocks else 0.0

    def match(self, hashes: Sequence[bytes], now: float) -> int:
        """How many leading blocks of ``hashes`` are cached at time ``now``."""
        blocks = self._blocks
        ttl = self.ttl_s
        matched = 0
        for h in hashes:
            seen = blocks.get(h)
            if seen is None or (ttl is not None and now - seen > ttl):
                break
            matched += 1
        return matched

    def insert(self, hashes: Sequence[bytes], now: float) -> None:
        """Insert or touch every block of ``hashes``, then evict down to the capacity."""
        blocks = self._blocks
        move = blocks.move_to_end
        for h in reversed(hashes):
            if h in blocks:
                move(h)
            blocks[h] = now
        ttl = self.ttl_s
        if ttl is not None:
            # Order is recency, so expired entries sit at the front.
            while blocks:
                oldest = next(iter(blocks.values()))
                if now - oldest <= ttl:
                    break
                blocks.popitem(last=False)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def clear(self) -> None:
        """Forget every block."""
        self._blocks.clear()


def cached_token_count(matched_blocks: int, prompt_tokens: int, block_tokens: int, mode: CacheModel) -> int:
    """The ``cached_tokens`` a server in ``mode`` reports for a prompt whose first
    ``matched_blocks`` blocks were found in its cache.

    Never the whole prompt (the last token is always computed: at most the largest
    multiple of ``block_tokens`` below ``prompt_tokens``); in ``openai`` mode floored to
    128-token steps and zero below 1,024.
    """
    if mode == "none" or prompt_tokens <= 0:
        return 0
    cap_blocks = (prompt_tokens - 1) // block_tokens
    cached = min(matched_blocks, cap_blocks) * block_tokens
    if mode == "openai":
        if prompt_tokens < OPENAI_MIN_CACHED_TOKENS:
            return 0
        cached -= cached % OPENAI_CACHE_INCREMENT_TOKENS
        if cached < OPENAI_MIN_CACHED_TOKENS:
            return 0
    return cached


def is_cacheable(prompt_tokens: int, mode: CacheModel) -> bool:
    """Whether a prompt's blocks are stored at all (OpenAI ignores prompts under 1,024 tokens)."""
    if mode == "none":
        return False
    return mode != "openai" or prompt_tokens >= OPENAI_MIN_CACHED_TOKENS


# --- answers ------------------------------------------------------------------------------

_SENTENCE = (
    "the harbor light turned slowly over the water while gulls circled the old pier and a keeper "
    "wrote careful notes about wind tide and the ships that passed before dawn "
)
_WORD_STARTS = tuple(i for i, ch in enumerate(_SENTENCE) if ch != " " and (i == 0 or _SENTENCE[i - 1] == " "))
_LOOP = _SENTENCE * 64
JSON_PREFIX = '{"answer": "'
JSON_SUFFIX = '"}'
JSON_MIN_TOKENS = -(-(len(JSON_PREFIX) + len(JSON_SUFFIX) + 1) // BYTES_PER_TOKEN)


def prompt_seed(prompt: bytes) -> int:
    """A stable 32-bit seed from the prompt (CRC-32: same value in every process)."""
    return zlib.crc32(prompt)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` (``n`` > 1 or a list of prompts)."""
    return (seed + index * 0x9E3779B1) & 0xFFFFFFFF


def natural_length(seed: int, output_tokens: tuple[int, int]) -> int:
    """The answer length a prompt gets when ``max_tokens`` does not cut it."""
    low, high = output_tokens
    return low + seed % (high - low + 1)


def answer_text(seed: int, chars: int) -> str:
    """``chars`` characters of the vocabulary sentence, read in order from a word chosen by ``seed``."""
    if chars <= 0:
        return ""
    start = _WORD_STARTS[(seed >> 8) % len(_WORD_STARTS)]
    if start + chars <= len(_LOOP):
        return _LOOP[start : start + chars]
    reps = (start + chars) // len(_SENTENCE) + 1
    return (_SENTENCE * reps)[start : start + chars]


def json_answer(seed: int, tokens: int) -> str:
    """A JSON object string ``{"answer": "..."}`` of exactly ``4 * tokens`` bytes (at least
    :data:`JSON_MIN_TOKENS` tokens)."""
    tokens = max(tokens, JSON_MIN_TOKENS)
    filler = tokens * BYTES_PER_TOKEN - len(JSON_PREFIX) - len(JSON_SUFFIX)
    return JSON_PREFIX + answer_text(seed, filler) + JSON_SUFFIX
