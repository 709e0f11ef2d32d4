"""Seeing other processes' commits: every commit writes a new `<store>/.generation` (LockingMixin._open_gate); a
process that finds another one reopens its Chroma client (chromadb caches one system per path, and its vector
index in memory would answer from before the commit), and the freshness watcher of a long-lived server
(search/freshness.py) does that reopen early, with `warming` keeping queries from reading beside its first reads.

`GenerationMixin` is the part of `Store` that does it; it uses the Store's `settings`, `_client`, `_meta`, `_local`,
`_use`, `_connect_lock`, `_connect`, `_generation`, `_warmed`, `_warmer`, `reopens` and `store_error`.
"""

from __future__ import annotations

import gc
import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger("research_agent.storage.store")

#: The longest a session waits for the freshness watcher's warm-up (search/freshness.py) before reading beside it
#: (seconds): its reopen and first reads took ~3.5 s at 1M chunks; a keyword index rebuilt after a `kb reindex`
#: in another process can take minutes, and a semantic query of another collection should not wait for that.
WARMING_WAIT_SECONDS = 15.0


class GenerationMixin:
    settings: Any
    _client: Any
    _meta: Any
    _local: Any
    _use: Any
    _connect_lock: Any
    _generation: str | None
    _identity: tuple[int, int] | None
    _warmed: threading.Event
    _warmer: int | None
    reopens: int
    _connect: Any
    store_error: Any

    def refresh(self) -> None:
        """See writes committed by other processes (Chroma caches one system per path)."""
        if self.settings.server_mode or self._client is None or getattr(self._local, "shared", 0):
            return  # inside a session the refresh happened on entry
        self._await_warming()
        if self._current():
            return
        self._use.acquire_exclusive()
        try:
            self._reopen_if_stale()
        finally:
            self._use.release_exclusive()
        self._await_warming()  # the reopen this session waited for may have been the watcher's

    def _await_warming(self) -> None:
        if not self._warmed.is_set() and self._warmer != threading.get_ident():
            self._warmed.wait(WARMING_WAIT_SECONDS)

    @contextmanager
    def warming(self) -> Iterator[None]:
        """The freshness watcher's session: if its refresh reopens the client, sessions starting from then until
        this ends wait for it (up to WARMING_WAIT_SECONDS) as they wait for a reopen, instead of reading beside
        its first reads. Measured at 1M chunks: a hybrid query that ran beside them took 25 s (both threads
        loading Chroma's segments on two shared cores), against 7.5 s for the query reopening alone. Armed
        before the watcher enters the read gate, set only once it holds it with the client alone
        (`_reopen_if_stale`): a query never waits for a watcher that waits for another process's writer."""
        self._warmer = threading.get_ident()
        try:
            yield
        finally:
            self._warmer = None
            self._warmed.set()

    @property
    def stale(self) -> bool:
        """Whether another process committed since this client opened (one small file read, no lock: the
        freshness watcher polls it; `refresh` re-checks under the locks).

        Raises StoreUnavailableError when the store folder has gone (moved or deleted), OSError when the file
        cannot be read."""
        if self.settings.server_mode or self._client is None:
            return False
        try:
            now = self._generation_path.read_text()
        except FileNotFoundError as exc:
            if self.settings.store.is_dir():
                return False  # no commit yet
            raise self.store_error(exc) from None
        return now != self._generation or self._store_identity() != self._identity

    def _reopen_if_stale(self) -> None:
        # Called with exclusive use: no other thread is inside a Chroma call.
        if self._client is None or self._current():
            return
        from chromadb.api.shared_system_client import SharedSystemClient

        with self._connect_lock:
            log.debug("store changed on disk; reopening the Chroma client")
            SharedSystemClient.clear_system_cache()
            self._client = None
            self._meta = None
            gc.collect()  # the old system is in a reference cycle: freed now, not at the next full collection
            self._client = self._connect()
            self.reopens += 1
            if self._warmer == threading.get_ident():
                self._warmed.clear()  # the watcher's reopen: its warm-up follows (`warming`)

    @property
    def _generation_path(self) -> Path:
        return self.settings.store / ".generation"

    def _read_generation(self) -> str | None:
        try:
            return self._generation_path.read_text()
        except OSError:
            return None

    def _current(self) -> bool:
        """Whether the open client reads the store as it is now: no other process committed since (the generation)
        and the folder is the one it opened. A store folder put back from a copy keeps its generation, but Chroma
        still holds the old folder's SQLite file open: reads came from it and writes went to it."""
        return self._read_generation() == self._generation and self._store_identity() == self._identity

    def _store_identity(self) -> tuple[int, int] | None:
        """The store folder's (device, inode), None when it is missing (one stat, ~2 us)."""
        try:
            found = self.settings.store.stat()
        except OSError:
            return None
        return found.st_dev, found.st_ino
