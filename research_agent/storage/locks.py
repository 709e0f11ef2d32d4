"""Locking: many threads share one Chroma client, one writer at a time, and readers never see a commit half done.

The primitives are in storage/lock_primitives.py (`SharedExclusiveLock` for this process's threads, `flock`,
and `ReadGate`: reads of every process share `<store>/.read.lock`, a writer takes it alone only around its
commit steps; docs/architecture.md, "Readers and writers across processes").
- `LockingMixin`: the part of `Store` that uses them: `session()` for reads, `write_lock()` for writes (the
  file lock `<store>/.write.lock`), and the gate a writer opens while it fills a reindex copy. It uses the
  Store's `settings`, `client`, `_use`, `_local`, `_lock`, `_connect_lock`, `_gate`, `_readers_admitted`,
  `_generation`, `_generation_path`, `_read_generation`, `_make_store_dir`, `_find_store_dir`, `store_error`,
  `_unpublished`, `unpublished`, `refresh` and `_reopen_if_stale`. Every way out of a write opens the gate,
  whatever raised.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from research_agent.errors import StoreUnavailableError
from research_agent.storage.generation import replace_small
from research_agent.storage.lock_primitives import ReadGate, flock

log = logging.getLogger("research_agent.storage.store")

class LockingMixin:
    """The locking half of `Store` (see the module docstring for what it relies on)."""

    settings: Any
    _gate: ReadGate | None

    @contextmanager
    def session(self) -> Iterator[None]:
        """Use the client from this thread while others may too; stale state is refreshed first.

        Embedded: the thread's outermost session also holds the read gate, so no process commits while it reads.
        """
        gated = not getattr(self._local, "shared", 0) and not getattr(self._local, "writing", 0)
        if gated:
            self._enter_gate()
        try:
            self.refresh()  # after the gate: a commit between the check and the read would go unseen
            self._use.acquire_shared()
        except BaseException:
            if gated:
                self._leave_gate()
            raise
        self._local.shared = getattr(self._local, "shared", 0) + 1
        try:
            yield
        finally:
            self._local.shared -= 1
            self._use.release_shared()
            if gated:
                self._leave_gate()

    # -- the read gate (embedded only; see ReadGate) -------------------------------------------------
    def _read_gate(self) -> ReadGate | None:
        if self.settings.server_mode:
            return None
        if self._gate is None:
            try:
                import fcntl  # noqa: F401 - POSIX only
            except ImportError:  # pragma: no cover - Windows: reads are not gated there
                return None
            if not self._find_store_dir():
                return None  # no store yet: nothing to guard, and a read must not create its folder
            with self._connect_lock:
                self._gate = self._gate or ReadGate(self.settings.store)
        return self._gate

    def _enter_gate(self) -> None:
        gate = self._read_gate()
        if gate is None:
            return
        if not self._gate_step(gate.enter):
            raise StoreUnavailableError(
                f"The store {self.settings.store} stayed busy with another process's write for "
                f"{self.settings.lock_timeout:g} s",
                guidance="Try again in a moment (writes commit in short steps); raise RESEARCH_AGENT_LOCK_TIMEOUT, "
                "or use a Chroma server for many writers.",
            )
        self._local.gated = True

    def _gate_step(self, step: Any) -> bool:
        try:
            return step(self.settings.lock_timeout)
        except OSError as exc:  # the store folder moved away, a lock file unopenable: coded, not a traceback
            raise self.store_error(exc) from None

    def _leave_gate(self) -> None:
        if getattr(self._local, "gated", False):
            self._local.gated = False
            self._read_gate().leave()

    def _close_gate(self) -> None:
        """Wait for reads in flight (every process) to end, then keep new ones out until `_open_gate`."""
        gate = self._read_gate()
        if gate is not None and not self._gate_step(gate.close):
            raise StoreUnavailableError(
                f"Reads of the store {self.settings.store} did not pause within {self.settings.lock_timeout:g} s",
                guidance="Try again in a moment; raise RESEARCH_AGENT_LOCK_TIMEOUT, or use a Chroma server.",
            )

    def _open_gate(self) -> None:
        """Let readers in again; a new generation first, so they reopen the client and see the commit.

        Trigger: the generation write raised (the store folder moved for a second, `.generation` replaced by a
        directory, disk full) and the gate stayed closed: every other process's reads and writes timed out until
        this one exited (finding 4 of the sixth attack pass). Outcome: the gate opens whatever happens.
        """
        try:
            self._publish()
        finally:
            if self._gate is not None:
                self._gate.open()

    def _publish(self) -> None:
        """Write a new `.generation` (never through a symlink: generation.replace_small).

        Trigger: with `.generation` a directory, a write that had committed answered -32001 "Cannot write
        .generation": the client believed nothing was saved (finding 4 of the seventh attack pass). Outcome:
        the write's result stands; other processes not being told is one log warning per distinct failure
        (`unpublished` keeps the last one), and the next write that can publish tells them.
        """
        generation = uuid.uuid4().hex
        try:
            replace_small(self._generation_path, generation)
        except OSError as exc:
            self._generation = self._read_generation()  # what this process finds next: no needless reopen
            said = self._unpublished(exc).message
            if said != self.unpublished:
                log.warning("%s", said)
            self.unpublished = said
            return
        self._generation = generation
        self.unpublished = None

    def admit_readers(self) -> None:
        """Inside a write: let readers (this process and others) read while the writer fills a working copy.

        Trigger: `kb reindex` re-embeds a whole collection under the write lock (minutes with a real model).
        Why: a reader must never wait for a whole ingest. Outcome: reads go on against the live collection,
        which nothing changes until `exclude_readers` closes the gate again for the swap.
        """
        if self.settings.server_mode or self._readers_admitted or not getattr(self._local, "writing", 0):
            return
        if self._use.downgrade():
            # Before the gate opens: if that raises, the write's end must release the shared use it now holds.
            self._readers_admitted = True
            self._open_gate()

    def exclude_readers(self) -> None:
        """Undo `admit_readers`: wait for the reads in flight, then commit alone."""
        if not self._readers_admitted:
            return
        self._close_gate()
        self._use.release_shared()
        self._use.acquire_exclusive()
        self._readers_admitted = False

    # -- writes ------------------------------------------------------------------------------
    @property
    def _lock_path(self) -> Path:
        return self.settings.store / ".write.lock"

    @contextmanager
    def write_lock(self) -> Iterator[None]:
        """Serialize writers across processes; readers then see the write via the generation file.

        Re-entrant: recovery that runs inside a write (a swap restored by `get_collection`) joins it.
        """
        if getattr(self._local, "writing", 0):
            yield
            return
        held = getattr(self._local, "shared", 0)
        gated = getattr(self._local, "gated", False)
        # Give up this thread's shared use (and its place among the readers) while waiting, so a writer never
        # waits on a thread that waits on it; the write itself runs with exclusive use of the client.
        for _ in range(held):
            self._use.release_shared()
        self._local.shared = 0
        if gated:
            self._leave_gate()
        try:
            with self._lock:
                if self.settings.server_mode:
                    self._use.acquire_exclusive()
                    self._local.writing = 1
                    try:
                        yield
                    finally:
                        self._local.writing = 0
                        self._use.release_exclusive()
                    return
                with self._file_lock():
                    yield from self._embedded_write()
        finally:
            try:
                if gated:  # the gate before the client, as in `session` (the other order can deadlock)
                    self._enter_gate()
            finally:
                for _ in range(held):
                    self._use.acquire_shared()
                self._local.shared = held

    def _embedded_write(self) -> Iterator[None]:
        """The body of an embedded write, with the file lock held: readers paused, the client alone."""
        self._close_gate()
        try:
            self._use.acquire_exclusive()
            self._local.writing = 1
            try:
                self._reopen_if_stale()
                yield
            finally:
                self._local.writing = 0
                if self._readers_admitted:
                    self._readers_admitted = False
                    self._use.release_shared()
                else:
                    self._use.release_exclusive()
        finally:
            self._open_gate()  # never raises for the generation: a write that failed keeps its own error

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """`<store>/.write.lock`, one writer process at a time. POSIX: our own flock (lock_primitives.flock: the
        lock filelock takes there, so other versions still exclude this one), which never creates folders:
        filelock made the lock file's missing folder, so a write racing a move of the store re-created it empty at
        the old path (a server then answered "Unknown collections" from it: 1 run in 6 of the moved-store test).
        A write is what creates a new store's folder (reads never do: Store._find_store_dir)."""
        self._make_store_dir()  # the store folder exists before the lock file is made in it
        self.client  # (a client opened before the folder existed is reopened under the lock: `_embedded_write`)
        self._make_store_dir()  # ... and is still there
        try:
            release = self._take_file_lock(time.monotonic() + self.settings.lock_timeout)
        except OSError as exc:
            raise self.store_error(exc) from None
        if release is None:
            raise StoreUnavailableError(
                f"The store {self.settings.store} is locked by another writer "
                f"(waited {self.settings.lock_timeout:g} s)",
                guidance="Wait for the other ingest to finish and retry, raise RESEARCH_AGENT_LOCK_TIMEOUT, "
                "or use a Chroma server for many writers.",
            )
        try:
            yield
        finally:
            release()

    def _take_file_lock(self, deadline: float) -> Any:
        """A function releasing the write lock, or None once `deadline` passed."""
        try:
            import fcntl  # noqa: F401 - POSIX
        except ImportError:  # pragma: no cover - Windows: filelock's lock (msvcrt)
            from filelock import FileLock, Timeout

            lock = FileLock(str(self._lock_path), timeout=max(0.0, deadline - time.monotonic()))
            try:
                lock.acquire()
            except Timeout:
                return None
            return lock.release
        fd = flock(self._lock_path, True, deadline)
        return None if fd is None else (lambda: os.close(fd))


__all__ = ["LockingMixin"]
