"""This process's view of the response cache's keys in Redis, so that a lookup normally
needs no Redis round trip: a key the view does not know is a miss, a key whose entry it
holds is a hit, and only a key known to exist without its bytes is a ``GET``.

The view is kept right by Redis's server-assisted client-side caching (broadcast mode,
see :mod:`gateway.cache.tracking`): every change of a key under the cache's prefix made
by another client (another gateway's store, ``switchyard cache purge``, Redis's own
expiry and eviction, ``FLUSHALL``) arrives as an invalidation; this process's own writes
update the view directly. The view answers only while it is :attr:`complete`: from the
moment tracking is on and the existing keys were scanned, until tracking is lost, and
only while Redis was heard from lately (:meth:`renew`: a frozen or partitioned Redis
looks the same as a quiet one, until a ``PING`` goes unanswered).

Bounds: at most ``max_keys`` keys (past it the view gives up until its next scan, and
lookups ask Redis as without it) and ``max_bytes`` of entries held, least recently used
dropped first (a dropped entry's key stays known: its lookup is a ``GET``). An entry is
held once read from Redis, with the ``PTTL`` read in the same write, and served only before
that deadline (measured from before the command left, so never later than Redis's own).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Final

from gateway.cache.entry import Entry

__all__ = ["ASK", "Ask", "LocalView"]


class Ask:
    """The type of :data:`ASK`."""


ASK: Final = Ask()
"""What :meth:`LocalView.find` returns when Redis must be asked."""

_OFF, _FILLING, _COMPLETE = 0, 1, 2


class LocalView:
    """The keys under the cache's prefix, some with their entries; see the module's doc."""

    def __init__(
        self,
        max_keys: int = 200_000,
        max_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.clock = clock
        self._state = _OFF
        self.generation = 0
        """Bumped by every :meth:`reset` and :meth:`begin`: a scan of an older one is void."""
        self._epoch = 0
        """Bumped by every reset, flush and generation: a fetch of an older one is not kept."""
        self._known: dict[str, None] = {}
        """Keys that exist (or may: changed by another client), their entry not held."""
        self._held: OrderedDict[str, tuple[Entry, float, int]] = OrderedDict()
        """Keys with their entry, its deadline and its size, least recently used first."""
        self._bytes = 0
        self._fetching: dict[str, int] = {}
        """Keys with a ``GET`` in flight, and how many."""
        self._changed: set[str] = set()
        """Keys changed while a ``GET`` of theirs was in flight: its reply is not kept."""
        self.on_reset: Callable[[], None] | None = None
        """Called when the view stops answering (the tracker then sets it up again)."""
        self.overflows = 0
        """Times the view gave up because Redis held more than ``max_keys`` keys."""
        self._lease_until = 0.0

    def renew(self, until: float) -> None:
        """Redis was heard from: the view may answer until ``until`` (its clock) unless heard
        from again (a frozen or partitioned Redis sends no invalidations, nor anything)."""
        self._lease_until = until

    @property
    def complete(self) -> bool:
        """Whether the view answers lookups (else they ask Redis)."""
        return self._state == _COMPLETE and self.clock() < self._lease_until

    @property
    def held_bytes(self) -> int:
        """The size of the entries held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._known) + len(self._held)

    # Lookups

    def find(self, key: str) -> Entry | Ask | None:
        """``key``'s entry when held and not expired, None when Redis has no such key, else
        :data:`ASK`."""
        now = self.clock()
        if self._state != _COMPLETE or now >= self._lease_until:
            return ASK
        held = self._held.get(key)
        if held is not None:
            if now < held[1]:
                self._held.move_to_end(key)
                return held[0]
            self._drop(key)
            self._known[key] = None  # Redis expires it on its own clock: ask it
            return ASK
        return ASK if key in self._known else None

    def fetching(self, key: str) -> tuple[int, float]:
        """Mark ``key`` as being read from Redis; the token to give :meth:`fetched`."""
        self._fetching[key] = self._fetching.get(key, 0) + 1
        return self._epoch, self.clock()

    def fetched(self, key: str, token: tuple[int, float], entry: Entry | None, pttl_ms: int | None) -> None:
        """What the ``GET`` marked by :meth:`fetching` read (None: no such key) and the key's
        ``PTTL`` read with it (None: not read). Not kept when the key changed meanwhile: an
        invalidation may overtake the reply it makes stale (they come on two connections)."""
        if self.abandon(key) or token[0] != self._epoch or self._state == _OFF:
            return
        if entry is None:
            self._known.pop(key, None)
            self._drop(key)
        elif pttl_ms is not None and pttl_ms != -2:
            deadline = token[1] + pttl_ms / 1000 if pttl_ms >= 0 else float("inf")
            self._hold(key, replace(entry, obj=None), deadline)
        elif key not in self._held:
            self._known[key] = None

    def abandon(self, key: str) -> bool:
        """The ``GET`` marked by :meth:`fetching` is over (failed, or :meth:`fetched`):
        whether the key changed meanwhile."""
        left = self._fetching.pop(key, 1) - 1
        changed = key in self._changed
        if left:
            self._fetching[key] = left
        else:
            self._changed.discard(key)
        return changed

    # This process's own writes

    def stored(self, key: str) -> None:
        """This process has just sent ``SET key``: the key exists. Its entry is held only once
        read back (its first hit here is a ``GET``): most stored answers are never asked for
        again, and holding each one would fill the view (and the garbage collector's walks)
        with them."""
        if self._state == _OFF:
            return
        if key in self._fetching:
            self._changed.add(key)
        self._drop(key)
        self._known[key] = None
        self._check_bound()

    def deleted(self, key: str) -> None:
        """This process has just sent ``DEL key``."""
        if key in self._fetching:
            self._changed.add(key)
        self._known.pop(key, None)
        self._drop(key)

    # Invalidations

    def invalidate(self, keys: Iterable[str] | None) -> None:
        """Another client changed ``keys`` (None: a ``FLUSHALL``, or a ``FLUSHDB`` of any
        database, this one's or another's: Redis does not say which, so the view stops
        answering until its next scan, which finds what is left)."""
        if self._state == _OFF:
            return
        if keys is None:
            self.reset()
            return
        fetching, known = self._fetching, self._known
        for key in keys:
            if key in fetching:
                self._changed.add(key)
            if key in self._held:
                self._drop(key)
            known[key] = None
        self._check_bound()

    # Set-up by the tracker

    def reset(self) -> None:
        """Stop answering (tracking lost): every lookup asks Redis until the next scan."""
        was = self._state
        self._state = _OFF
        self._clear()
        if was != _OFF and self.on_reset is not None:
            self.on_reset()

    def begin(self) -> int:
        """Start recording (tracking is being turned on): the generation of the scan."""
        self._state = _FILLING
        self._clear()
        return self.generation

    def fill(self, generation: int, keys: Iterable[str]) -> bool:
        """Keys found by the scan of ``generation``; False when it is void (or over the bound)."""
        if generation != self.generation or self._state != _FILLING:
            return False
        known, held = self._known, self._held
        for key in keys:
            if key not in held:
                known[key] = None
        return self._check_bound()

    def finish(self, generation: int) -> bool:
        """The scan of ``generation`` is done: answer lookups from now on (if not void)."""
        if generation != self.generation or self._state != _FILLING:
            return False
        self._state = _COMPLETE
        return True

    # Internals

    def _clear(self) -> None:
        self.generation += 1
        self._epoch += 1
        self._known.clear()
        self._held.clear()
        self._bytes = 0

    def _check_bound(self) -> bool:
        if len(self._known) + len(self._held) <= self.max_keys:
            return True
        self.overflows += 1
        self.reset()
        return False

    def _hold(self, key: str, entry: Entry, deadline: float) -> None:
        size = len(entry.body)
        self._known.pop(key, None)
        self._drop(key)
        if size > self.max_bytes:
            self._known[key] = None
            return
        self._held[key] = (entry, deadline, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            old, (_, _, old_size) = self._held.popitem(last=False)
            self._bytes -= old_size
            self._known[old] = None
        self._check_bound()

    def _drop(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._bytes -= held[2]
