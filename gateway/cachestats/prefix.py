"""The gateway's expectation of a provider's prefix-cache hit.

The shaped prompt is rendered the way the simulator (and, roughly, a chat template)
renders it, cut into checkpoints of 128 tokens (512 bytes; OpenAI counts hits in
128-token steps), and each checkpoint named by a running CRC of everything before it:
a hash chain, like vLLM's block hashes, so a checkpoint exists only if the whole prefix
up to it was sent before. The expected cached tokens are the leading checkpoints
already seen for the deployment within the cache TTL:

- in this process (:class:`LocalPrefixes`), at once, for the ``x-switchyard-prefix-hit``
  header: this replica's view;
- in Redis (:func:`expect_shared`), off the request path and batched (one round trip
  for all the requests of a flush interval), for the statistics: the view of every
  replica together.

A vLLM deployment counts in its own units (:class:`Geometries`): its KV cache block
size (16 on GPUs, 128 on vLLM's CPU backend; from the policy, the launch's preflight or
its ``/metrics``) and its tokenizer's bytes per token, calibrated from the
``prompt_tokens`` it reports against the rendered prompt's length. For those deployments
the chain is cut finer (:data:`FINE_BYTES`), the matched bytes are converted to tokens
and rounded down to whole blocks, as vLLM counts ``cached_tokens``.

A request's ``cache_salt`` (vLLM's per-tenant cache isolation) seeds its chain, so a
salted request only matches requests with the same salt.
"""

from __future__ import annotations

import sys
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from gateway.prompt_render import render_chat
from gateway.store import eval_each

CHECKPOINT_BYTES = 512
CHECKPOINT_TOKENS = 128
FINE_BYTES = 64
"""Step of the chain of a vLLM deployment: finer than its blocks (16 tokens = ~64 bytes)."""
VLLM_BLOCK_TOKENS = 16
"""vLLM's block size on GPUs, the assumption until the deployment says otherwise."""
KEY_PREFIX = "sy:pfx:"
_FINE_KEY_PREFIX = "sy:pfx64:"
_U32 = "I" if array("I").itemsize == 4 else "L"
if TYPE_CHECKING:
    Checkpoints = array[int]
else:
    Checkpoints = array
"""A chain's values: unsigned 32-bit integers, packed (reading a run of them back costs a
copy of memory, not a Python integer each)."""


def _chain(text: bytes | memoryview, step: int, seed: int) -> Checkpoints:
    out = array(_U32)
    crc = seed
    for start in range(0, len(text) - step + 1, step):
        crc = zlib.crc32(text[start : start + step], crc)
        out.append(crc)
    return out


def _continued(
    text: bytes, step: int, seed: int, known: Checkpoints, common_bytes: int, old: bytes | None = None
) -> Checkpoints:
    """The chain of ``text``, reusing ``known`` (the chain of ``old``, a prompt whose first
    ``common_bytes`` bytes are the same): its checkpoints inside the common bytes are this
    prompt's too, and the CRC runs on from the last of them over what follows. Where, after
    that, ``text`` has the very bytes ``old`` has at the same places (a prompt that differs
    from it in a few values of equal length: a time, an id, a name), those checkpoints
    follow from ``old``'s without hashing the bytes again (:func:`_shifted`)."""
    reused = min(common_bytes // step, len(known))
    top = min(len(text), len(old) if old is not None else 0) // step
    top = min(top, len(known))
    if top - reused <= _MIN_RUN:
        if not reused:
            return _chain(text, step, seed)
        return known[:reused] + _chain(memoryview(text)[reused * step :], step, known[reused - 1])
    assert old is not None  # top is 0 without it
    out = known[:reused]
    crc = out[-1] if out else seed
    view = memoryview(old)
    i, misses = reused, 0
    end = top * step
    while i < top and misses < _MAX_MISSES:
        at = i * step
        if i + _MIN_RUN <= top and text.startswith(view[at : at + _MIN_RUN * step], at):
            # Equal for long enough to carry the difference (one compare says whether); mostly
            # up to the end (a value near the top changed, nothing after it).
            if text.startswith(view[at + _MIN_RUN * step : end], at + _MIN_RUN * step):
                run = min(top - i, _MAX_CARRIED)
            else:
                run = min(_common_steps(text, old, i + _MIN_RUN, step, top, False) - i, _MAX_CARRIED)
            _shifted(out, known, i, run, crc ^ (known[i - 1] if i else seed), step)
            crc = out[-1]
            i += run
            continue
        misses += 1
        crc = zlib.crc32(text[at : at + step], crc)
        out.append(crc)
        i += 1
    out += _chain(memoryview(text)[i * step :], step, crc)
    return out


_MIN_RUN = 32
"""An equal stretch of fewer steps than this is hashed. Carrying a difference costs a few
microseconds whatever the length, hashing ~0.35 µs a step; measured in the bench, carrying
it over the 20 equal steps of a 16 KB prompt made a request slower, not faster."""
_MAX_MISSES = 8
"""Steps not starting a long enough equal stretch before the rest is hashed without looking
further (a prompt that differs from the old one every few steps costs a few compares more
than hashing, no more)."""
_MAX_CARRIED = 2048
"""Steps a difference is carried over at once (a longer equal stretch takes a few): bounds
:func:`_columns`' tables, 128 integers of this many 32-bit values per step size (1 MB)."""
_COLUMNS: dict[int, tuple[int, list[int]]] = {}


def _columns(step: int, steps: int) -> list[int]:
    """The differences that a difference of two CRCs makes after ``step``, 2 ``step``, ...
    equal bytes (at least ``steps`` of them), packed 32 bits each into one integer: per
    4-bit digit of the difference (8 of them) and value of the digit (16), 128 integers.
    Computed once per step, grown as longer prompts need."""
    held = _COLUMNS.get(step)
    if held is not None and held[0] >= steps:
        return held[1]
    have = min(max(steps, 2 * held[0] if held is not None else 128), _MAX_CARRIED)
    zeros = bytes(step)
    offset = zlib.crc32(zeros, 0)
    bits = []
    for bit in range(32):
        values = array(_U32)
        value = 1 << bit
        for _ in range(have):
            value = zlib.crc32(zeros, value) ^ offset
            values.append(value)
        bits.append(int.from_bytes(values.tobytes(), "little"))
    columns = []
    for digit in range(8):
        for nibble in range(16):
            column = 0
            for k in range(4):
                if nibble >> k & 1:
                    column ^= bits[4 * digit + k]
            columns.append(column)
    _COLUMNS[step] = (have, columns)
    return columns


def _shifted(out: Checkpoints, known: Checkpoints, at: int, run: int, difference: int, step: int) -> None:
    """Append to ``out`` ``known[at : at + run]`` for a prompt with the same bytes there whose
    checkpoint before them differs from ``known``'s by ``difference`` (XOR).

    zlib's CRC-32 of the same bytes from two starting values differs by a linear function
    of the starting values' difference that depends only on the length: ``crc32(d, a) ^
    crc32(d, b) == crc32(z, a ^ b) ^ crc32(z, 0)``, ``z`` as many zero bytes as ``d``. So the
    differences at all the later checkpoints are the XOR of :func:`_columns`' for the digits
    of ``difference``: eight XORs of big integers for any number of checkpoints, whose
    values are exactly those of hashing the bytes."""
    c = _columns(step, run)
    d = difference
    spread = (
        c[d & 15]
        ^ c[16 | d >> 4 & 15]
        ^ c[32 | d >> 8 & 15]
        ^ c[48 | d >> 12 & 15]
        ^ c[64 | d >> 16 & 15]
        ^ c[80 | d >> 20 & 15]
        ^ c[96 | d >> 24 & 15]
        ^ c[112 | d >> 28 & 15]
    )
    spread &= (1 << 32 * run) - 1
    packed = int.from_bytes(memoryview(known)[at : at + run], "little") ^ spread
    out.frombytes(packed.to_bytes(4 * run, "little"))


class PrefixChain(Checkpoints):
    """The checkpoint chain of a prompt (an ``array`` of :data:`CHECKPOINT_BYTES` steps), with
    the prompt's length and, computed on first use, the :data:`FINE_BYTES` chain that vLLM
    deployments are looked up with."""

    __slots__ = ("_common", "_fine", "_fine_known", "_old", "_seed", "_text", "prompt_bytes")

    _text: bytes | None
    _seed: int
    _fine: Checkpoints | None
    _fine_known: Checkpoints | None
    _old: bytes | None
    _common: int
    prompt_bytes: int

    def __new__(
        cls,
        text: bytes,
        seed: int,
        known: PrefixChain | None = None,
        common_bytes: int = 0,
        old: bytes | None = None,
    ) -> PrefixChain:
        """``known``: the chain of ``old``, a prompt whose first ``common_bytes`` bytes are
        this one's (see :func:`_continued`)."""
        if known is None:
            values = _chain(text, CHECKPOINT_BYTES, seed)
        else:
            values = _continued(text, CHECKPOINT_BYTES, seed, known, common_bytes, old)
        self = super().__new__(cls, _U32, values)
        self._text = text
        self._seed = seed
        self._fine = None
        # The fine chain of the prompt this one starts like, if it was computed: reused too
        # (and that prompt, to reuse it past where they differ).
        self._fine_known = known._fine if known is not None else None
        self._old = old if self._fine_known is not None else None
        self._common = common_bytes
        self.prompt_bytes = len(text)
        return self

    @property
    def fine(self) -> Checkpoints:
        """The chain in :data:`FINE_BYTES` steps."""
        if self._fine is None:
            text = self._text or b""
            if self._fine_known is not None:
                self._fine = _continued(
                    text, FINE_BYTES, self._seed, self._fine_known, self._common, self._old
                )
            else:
                self._fine = _chain(text, FINE_BYTES, self._seed)
            self._text = self._old = None  # not needed any more: keep queued chains small
            self._fine_known = None
        return self._fine


class _Recent:
    """The last prompts rendered and their chains (a few, the most recent first). A template's
    requests share their start (tools, the shaped system prompt, the history), so a prompt is
    compared with them (a few ``startswith`` over memory, no hashing) and only the bytes after
    the longest common start are hashed: the cost follows what is new, not the prompt's length.
    After the common start, the stretches where the prompt has the very bytes of the one it
    is compared with, at the same places, are not hashed either (see :func:`_continued`): a
    new conversation's prompt differs from the last in a few values (a time, a name) and
    its newest turn."""

    KEPT = 8
    KEPT_MAX_BYTES = 1 << 22  # a longer prompt is not kept (eight of them stay a few MB at most)
    PROBED = 3  # at most this many candidates are measured (the most recent that start alike)

    def __init__(self) -> None:
        self._entries: list[tuple[int, bytes, PrefixChain]] = []

    def chain(self, text: bytes, seed: int) -> PrefixChain:
        """``text``'s chain, computed from the best match among the recent prompts."""
        best: PrefixChain | None = None
        best_text: bytes | None = None
        best_common = 0
        probed = 0
        head = memoryview(text)[:CHECKPOINT_BYTES]
        whole = len(text) // CHECKPOINT_BYTES * CHECKPOINT_BYTES
        for entry_seed, old, old_chain in self._entries:
            if entry_seed != seed or len(old) < CHECKPOINT_BYTES or not old.startswith(head):
                continue
            probed += 1
            # Measured only if it starts like this prompt for longer than the best so far (one
            # memory compare says whether): the recent prompts of a template mostly share
            # just as much, and measuring each would compare the prompt a few times over.
            beat = best_common + CHECKPOINT_BYTES
            if (
                best is None
                or (
                    beat <= len(old)
                    # The checkpoint that would beat the best first (where prompts of a template
                    # differ), then everything before it.
                    and text.startswith(memoryview(old)[best_common:beat], best_common)
                    and text.startswith(memoryview(old)[:best_common])
                )
            ):
                common = _common_steps(text, old, (best_common // CHECKPOINT_BYTES) + (best is not None))
                common *= CHECKPOINT_BYTES
                if common > best_common:
                    best, best_text, best_common = old_chain, old, common
                if common == whole:
                    break
            if probed == self.PROBED:
                break
        if best is None:
            # None starts alike (a value that changed in the first checkpoint): the most recent
            # one may still have the same bytes after it, at the same places.
            recent = next((entry for entry in self._entries if entry[0] == seed), None)
            if recent is not None:
                best_text, best = recent[1], recent[2]
        chain = PrefixChain(text, seed, best, best_common, best_text)
        if len(text) <= self.KEPT_MAX_BYTES:
            entries = self._entries
            entries.insert(0, (seed, text, chain))
            del entries[self.KEPT :]
        return chain


def _common_steps(
    text: bytes,
    old: bytes,
    at_least: int = 0,
    step: int = CHECKPOINT_BYTES,
    top: int | None = None,
    to_top: bool = True,
) -> int:
    """How many whole checkpoint steps ``text`` and ``old`` share from the start, knowing they
    share ``at_least`` (a memory compare per probe, no copy). Prompts that start alike mostly
    differ near their end: the probes go down from there by doubling gaps, then halve the
    last gap (a few compares instead of a binary search over the whole length); those of a
    template that differ in an early value (a time, a name near the top) are found among the
    first :data:`_EARLY_STEPS` steps instead (one compare says whether). Each probe
    compares only the bytes after what is known to be shared (so, given ``at_least`` steps
    that are not shared, it measures the equal stretch from there). ``step``: the step in
    bytes; ``top``: the most steps to count; ``to_top`` False: they are known to differ
    before it (not compared up to it first)."""
    view = memoryview(old)
    if top is None:
        top = min(len(text), len(old)) // step
    low, high = at_least, top  # they share low steps; high, if they do, is the answer
    if to_top and text.startswith(view[low * step : top * step], low * step):
        return top  # a repeat, or this prompt continues that one
    early = min(low + _EARLY_STEPS, high)
    if not text.startswith(view[low * step : early * step], low * step):
        high = early  # an early value that changed: a time, a name
    else:
        low, gap = early, 1
        while high - gap > low:
            probe = high - gap
            if text.startswith(view[low * step : probe * step], low * step):
                low = probe
                break
            high = probe
            gap *= 2
    while high - low > 1:
        mid = (low + high) // 2
        if text.startswith(view[low * step : mid * step], low * step):
            low = mid
        else:
            high = mid
    return low


_EARLY_STEPS = 8
"""The steps :func:`_common_steps` compares first, from the start, when prompts do not simply
continue: if they differ there, the difference is found among them."""
_RECENT = _Recent()


def checkpoints(body: Mapping[str, Any], rendered_tools: bytes | None = None) -> PrefixChain:
    """The chain of checkpoint hashes of a chat body's rendered prompt (full checkpoints only),
    seeded by its ``cache_salt``. ``rendered_tools``: its tools' prompt bytes, when known."""
    salt = body.get("cache_salt")
    seed = zlib.crc32(salt.encode("utf-8", "surrogatepass")) if isinstance(salt, str) and salt else 0
    return _RECENT.chain(render_chat(body, rendered_tools), seed)


class Geometries:
    """How each vLLM deployment counts cached tokens: block size and bytes per token.

    Deployments not named here are counted like OpenAI (128-token steps of 512 bytes).
    The bytes-per-token ratio (of every deployment) starts at 4 and follows the
    ``prompt_tokens`` the deployment reports (an exponential average over requests), off
    the request path.
    """

    RATIO_WEIGHT = 0.2

    def __init__(self) -> None:
        self._block_tokens: dict[str, int] = {}
        self._bytes_per_token: dict[str, float] = {}

    def use_vllm(self, deployment: str, block_tokens: int | None = None) -> None:
        """Count ``deployment`` as vLLM does; ``block_tokens`` when known (policy, discovered)."""
        if block_tokens is not None and block_tokens > 0:
            self._block_tokens[deployment] = block_tokens
        else:
            self._block_tokens.setdefault(deployment, VLLM_BLOCK_TOKENS)

    def is_vllm(self, deployment: str) -> bool:
        """Whether ``deployment`` is counted in vLLM's blocks."""
        return deployment in self._block_tokens

    def block_tokens(self, deployment: str) -> int:
        """The deployment's cache block (or checkpoint) size in tokens."""
        return self._block_tokens.get(deployment, CHECKPOINT_TOKENS)

    def bytes_per_token(self, deployment: str) -> float:
        """Prompt bytes per token of the deployment's tokenizer (calibrated; 4 until then)."""
        return self._bytes_per_token.get(deployment, CHECKPOINT_BYTES / CHECKPOINT_TOKENS)

    def observe(self, deployment: str, chain: Sequence[int] | None, prompt_tokens: int | None) -> None:
        """Calibrate bytes per token from a finished request's rendered prompt and usage."""
        if not isinstance(chain, PrefixChain) or not prompt_tokens:
            return  # every deployment: an estimate in its own tokens never exceeds its prompt
        if chain.prompt_bytes < 256:  # too short: the chat template's own tokens dominate
            return
        sample = chain.prompt_bytes / prompt_tokens
        before = self._bytes_per_token.get(deployment)
        self._bytes_per_token[deployment] = (
            sample if before is None else before + self.RATIO_WEIGHT * (sample - before)
        )

    def lookup_chain(self, deployment: str, chain: Sequence[int]) -> tuple[Sequence[int], int]:
        """The chain to look ``deployment`` up with, and its step in bytes."""
        if isinstance(chain, PrefixChain) and deployment in self._block_tokens:
            return chain.fine, FINE_BYTES
        return chain, CHECKPOINT_BYTES

    def tokens(self, deployment: str, matched_steps: int, step_bytes: int, prompt_bytes: int = 0) -> int:
        """Expected cached tokens for ``matched_steps`` leading steps of ``step_bytes``, in the
        deployment's tokens (bytes per token calibrated by its replies; 4 until then) and
        whole blocks (128-token steps for a deployment counted like OpenAI); never more than
        the prompt's own estimate (``prompt_bytes``, when known)."""
        block = self.block_tokens(deployment)
        ratio = self.bytes_per_token(deployment)
        matched = matched_steps * step_bytes
        if prompt_bytes:
            matched = min(matched, prompt_bytes)
        return int(matched / ratio // block) * block

    def estimate(self, deployment: str, prompt_bytes: int) -> int:
        """A byte count in the deployment's tokens (calibrated, as :meth:`tokens`)."""
        return int(prompt_bytes / self.bytes_per_token(deployment))


GEOMETRY = Geometries()
"""This process's view of its vLLM deployments (learned from policies, launches, replies)."""


class LocalPrefixes:
    """Checkpoints seen per deployment in this process, expiring after ``ttl_s`` (bounded LRU)."""

    def __init__(self, capacity: int = 200_000, geometry: Geometries | None = None) -> None:
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._capacity = capacity
        self.geometry = GEOMETRY if geometry is None else geometry

    def expect_and_add(self, deployment: str, chain: Sequence[int], ttl_s: float) -> int:
        """Expected cached tokens for this chain; then remember it."""
        size = chain.prompt_bytes if isinstance(chain, PrefixChain) else 0
        chain, step = self.geometry.lookup_chain(deployment, chain)
        now = time.monotonic()
        seen = self._seen
        hits = 0
        for crc in chain:
            at = seen.get((deployment, crc))
            if at is None or now - at > ttl_s:
                break
            hits += 1
        for crc in chain:
            key = (deployment, crc)
            seen[key] = now
            seen.move_to_end(key)
        while len(seen) > self._capacity:
            seen.popitem(last=False)
        return self.geometry.tokens(deployment, hits, step, size)


_EXPECT_LUA = """
-- KEYS[1], KEYS[2]: the prefixes of one deployment's checkpoint keys, coarse and fine (one
-- hash tag: one slot). ARGV, per chain: its TTL in ms, 0 (coarse) or 1 (fine), and its
-- checkpoints as little-endian uint32s. Returns per chain how many leading checkpoints
-- were there (in Redis before this call, or in a chain before it); then sets every key to
-- expire after the longest TTL that asked for it.
local chains, order, ttl = {}, {}, {}
for a = 1, #ARGV, 3 do
  local ms, prefix, blob, keys = tonumber(ARGV[a]), KEYS[tonumber(ARGV[a + 1]) + 1], ARGV[a + 2], {}
  for p = 1, #blob, 4 do
    local key = prefix .. string.format('%08x', (struct.unpack('<I4', blob, p)))
    keys[#keys + 1] = key
    local had = ttl[key]
    if not had then order[#order + 1] = key end
    if not had or had < ms then ttl[key] = ms end
  end
  chains[#chains + 1] = keys
end
local found, seen, out = {}, {}, {}
for i = 1, #order, 1000 do  -- unpack() of many keys would overflow Lua's stack
  local got = redis.call('MGET', unpack(order, i, math.min(i + 999, #order)))
  for j = 1, #got do found[order[i + j - 1]] = got[j] end
end
for c = 1, #chains do
  local keys, hits = chains[c], 0
  for k = 1, #keys do
    if found[keys[k]] or seen[keys[k]] then hits = hits + 1 else break end
  end
  for k = 1, #keys do seen[keys[k]] = true end
  out[c] = hits
end
for key, ms in pairs(ttl) do redis.call('SET', key, '1', 'PX', ms) end
return out
"""
"""One deployment's lookups and writes of a batch in one call, its chains sent as bytes:
no Python work per checkpoint, one reply for redis-py to parse. As a pipeline of an MGET
per chain and a SET per checkpoint, a batch of 20 requests with ~60 checkpoints each held
the event loop for ~20 ms (bench/README.md, "Redis writes as scripts")."""


def _packed(steps: Sequence[int]) -> bytes:
    """A chain as little-endian uint32s."""
    values = steps if isinstance(steps, array) else array(_U32, steps)
    if sys.byteorder == "big":
        values = array(_U32, values)
        values.byteswap()
    return values.tobytes()


async def expect_shared(
    redis: Redis, batch: list[tuple[str, Sequence[int], float]], geometry: Geometries | None = None
) -> list[int]:
    """Expected cached tokens for each ``(deployment, chain, ttl_s)``, from the checkpoints any
    replica recorded, in one round trip; records the chains. Within the batch, a chain also
    sees the ones before it (as if they had been looked up one after the other); identical
    chains (a busy template) are looked up once. One script call per deployment
    (:data:`_EXPECT_LUA`; a deployment's keys share a hash tag, so this holds on a Redis
    Cluster too)."""
    geometry = GEOMETRY if geometry is None else geometry
    args: dict[str, list[int | bytes]] = {}
    looked_up: dict[tuple[str, bytes], int] = {}
    # Per request: its deployment, its step, and its chain's place in the deployment's
    # script call (-1: the same chain earlier in the batch, so every checkpoint is there).
    places: list[tuple[str, int, int, int]] = []
    for deployment, chain, ttl_s in batch:
        steps, step = geometry.lookup_chain(deployment, chain)
        packed = _packed(steps)
        place = looked_up.get((deployment, packed))
        if place is not None:
            places.append((deployment, step, -1, len(steps)))
            continue
        calls = args.setdefault(deployment, [])
        looked_up[deployment, packed] = place = len(calls) // 3
        calls += (max(1, int(ttl_s * 1000)), int(step != CHECKPOINT_BYTES), packed)
        places.append((deployment, step, place, len(steps)))
    # One hash tag per deployment: on Redis Cluster all of its keys share a slot.
    per_deployment = [((f"{KEY_PREFIX}{{{d}}}:", f"{_FINE_KEY_PREFIX}{{{d}}}:"), a) for d, a in args.items()]
    hits_of = dict(zip(args, await eval_each(redis, _EXPECT_LUA, per_deployment), strict=True))
    sizes = [chain.prompt_bytes if isinstance(chain, PrefixChain) else 0 for _, chain, _ in batch]
    return [
        geometry.tokens(deployment, length if place < 0 else int(hits_of[deployment][place]), step, size)
        for (deployment, step, place, length), size in zip(places, sizes, strict=True)
    ]
