"""Catching up with other processes' writes on notice, not on the next query (issue 16).

Trigger: at 1M chunks, the next query of a long-lived MCP server after another process wrote one document took
3.2-6.0 s (benchmarks/SCALE.md), 3.47 s of it Chroma's first reads after the client reopened (every commit
writes a new `<store>/.generation`; `Store.refresh` then reopens the client, and chromadb 1.5.9 loads a
collection's whole HNSW segment on its first access of any kind, even `get(ids=[...], include=[])`: 1.7 s for the
registry, 2.3 s warm / 11 s cold for the 1M collection, 2.1 GB). Measured first: without the reopen a `get` does
see another process's commit (SQLite), but a vector query does not (the HNSW in memory is the old one), so the
reopen is needed and its cost is Chroma's segment load, which only moving it earlier can hide.

What: `FreshnessWatcher`, a daemon thread of the MCP server (stdio and HTTP; never a CLI one-shot) that reads the
generation file every `POLL_SECONDS` and, when another process's commit landed, does what the next query would
have done, through the same functions: `Store.session()` (its `refresh` reopens the client under the exclusive
lock, held only for the reopen), then for each collection this process has a keyword index open for (every
keyword and hybrid query opens one) the revision read and `keyword_sync.keyword_index` (the catch-up; its first
`get` loads the collection's segments, vectors included, so a hybrid query's dense half is warm too). A query
arriving meanwhile waits on the same locks as before and never sees a half state; one arriving after answers at
warm speed. A write by this process sets the generation it wrote, so it never causes a second reopen.

Server mode (a Chroma server): nothing to reopen (the server keeps its segments loaded), so no watcher; the
query's keyword catch-up is search/keyword_sync.py's and costs what the change costs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: How often the watcher reads `<store>/.generation` (seconds). One stat-sized read of a 32-byte file: ~20 us,
#: so 4 a second cost nothing measurable (benchmarks/scale.py --freshness); a commit is noticed within 0.25 s,
#: small next to the ~3.5 s of Chroma reads it starts at 1M chunks.
POLL_SECONDS = 0.25
#: The longest `stop` waits for a catch-up under way (seconds); the thread is a daemon, so a process exiting
#: after that never hangs on it.
STOP_WAIT_SECONDS = 30.0
#: After a catch-up of d seconds the watcher rests REST_FACTOR * d before looking again: another process ingesting
#: (a commit per batch, every few seconds) then never has this process reloading Chroma's segments and holding the
#: read gate more than half the time (its commits wait for readers); a query in between reopens as before.
REST_FACTOR = 1.0
#: An id no chunk has: looking it up loads a collection's segments and reads nothing.
WARM_ID = "research-agent-freshness-warm-up"


def _said(exc: Exception) -> str:
    """A failure in words: an OSError names its file ("[Errno 21] Is a directory" named none: finding F6 of the H2b
    attack pass)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot read {exc.filename} ({exc.strerror or exc})"
    return str(exc)


class FreshnessWatcher:
    """Reopens the store's client and warms what this process queried, as soon as another process commits."""

    def __init__(self, container: Container, poll: float = POLL_SECONDS) -> None:
        self.container = container
        self.poll = poll
        self.caught_up = 0  # catch-ups done (tests and the benchmark read it)
        self.error: str | None = None  # the last failure, until a look succeeds
        self._stop = threading.Event()
        self._seen = 0  # the store's reopen count this watcher last warmed after
        self.thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start watching (embedded stores only); False when there is nothing to watch."""
        if self.container.settings.server_mode or self.thread is not None:
            return False
        self.thread = threading.Thread(target=self._run, name="store-freshness", daemon=True)
        self.thread.start()
        return True

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> None:
        self._stop.set()
        thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                started = time.monotonic()
                if self.check():
                    self._stop.wait(REST_FACTOR * (time.monotonic() - started))
                self.error = None
            except Exception as exc:  # a store removed or unreadable: the next query reports it; keep watching
                said = _said(exc)
                if said != self.error:  # once per distinct failure, not four times a second
                    log.warning("store freshness watcher: %s", said)
                self.error = said

    def check(self) -> bool:
        """One look: reopen and warm if another process committed; True when it warmed."""
        store = self.container.store
        if not store.stale and store.reopens == self._seen:
            return False
        # Sessions starting meanwhile wait for this (`Store.warming`); the session's refresh on entry reopens the
        # client under the exclusive lock, released as soon as the reopen is done, as for a query.
        with store.warming(), store.session():
            if store.reopens == self._seen:
                return False  # this process's own write, or nothing opened yet
            self._seen = store.reopens
            if self._stop.is_set():
                return False
            self._warm()
        self.caught_up += 1
        return True

    def _warm(self) -> None:
        """Each collection with an open keyword index: its revision and keyword catch-up, then one id lookup
        (Chroma loads the collection's segments, HNSW included, on its first access), as its next query would."""
        from research_agent.search import keyword_sync

        for name in self._queried():
            if self._stop.is_set():
                return
            try:
                col = self.container.store.get_collection(name)
                keyword_sync.keyword_index(self.container, name, col)
                col.get(ids=[WARM_ID], include=[])
            except Exception as exc:  # deleted or renamed since: the next query says so properly
                log.info("store freshness watcher: %s not warmed (%s)", name, exc)

    def _queried(self) -> list[str]:
        """Names of the collections this process has opened a keyword index for (keyword and hybrid queries)."""
        from research_agent.search import keyword_sync

        store = self.container.store
        ids = keyword_sync.opened_collection_ids(store.location)
        if not ids:
            return []
        return sorted(col.name for col in store.client.list_collections() if str(col.id) in ids)


__all__ = ["POLL_SECONDS", "FreshnessWatcher"]
