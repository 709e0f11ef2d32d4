"""A per-process cache of things derived from a collection (its node index), each stamped with the
collection's revision and rebuilt when that moves. (The keyword index used it until it became a saved tantivy
index caught up per document: search/keyword_sync.py.)

Every write (any process) bumps the collection's revision in the store registry, so a value whose stamp
still equals the current revision is exactly what a fresh build would return. A build reads every chunk,
so concurrent first calls for one key wait for a single build
instead of each doing their own: the node index had no such lock and built twice under two MCP workers.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class RevisionCache(Generic[V]):
    """key -> (stamp, value); a stamp is the revision plus anything else the value depends on (e.g. weights).

    One entry per key: a new stamp replaces the old value, so memory stays one value per collection.
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[Hashable, V]] = {}
        self._lock = threading.Lock()  # guards _entries and _build_locks, never held while building
        self._build_locks: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, stamp: Hashable) -> V | None:
        """The cached value if it was built at `stamp`, else None."""
        with self._lock:
            hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] == stamp else None

    def get_or_build(self, key: Hashable, stamp: Hashable, build: Callable[[], V]) -> V:
        """The value at `stamp`: cached, or built once by `build()` while other callers for `key` wait."""
        value = self.get(key, stamp)
        if value is not None:
            return value
        with self._lock:
            build_lock = self._build_locks.setdefault(key, threading.Lock())
        with build_lock:
            value = self.get(key, stamp)  # a concurrent caller may have built it while we waited
            if value is None:
                value = build()
                with self._lock:
                    self._entries[key] = (stamp, value)
        return value

    def clear(self) -> None:
        """Forget every value (what a new process starts with)."""
        with self._lock:
            self._entries.clear()
