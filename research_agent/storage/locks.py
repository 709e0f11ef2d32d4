"""Locking: many threads share one Chroma client, one writer at a time, and readers never see a commit half done.

- `SharedExclusiveLock`: this process's threads use the client together; reopening it or writing needs it alone.
- `ReadGate`: across processes (embedded store), reads share `<store>/.read.lock`; a writer takes it alone
  only around its commit steps (docs/architecture.md, "Readers and writers across processes").
- `LockingMixin`: the part of `Store` that uses them: `session()` for reads, `write_lock()` for writes (the
  file lock `<store>/.write.lock`), and the gate a writer opens while it fills a reindex copy. It uses the
  Store's `settings`, `client`, `_use`, `_local`, `_lock`, `_connect_lock`, `_gate`, `_readers_admitted`,
  `_generation`, `_generation_path`, `_read_generation`, `_make_store_dir`, `store_error`, `_unpublished`,
  `refresh` and `_reopen_if_stale`. Every way out of a write opens the gate, whatever raised.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from research_agent.errors import StoreUnavailableError

log = logging.getLogger("research_agent.storage.store")

# How often a reader or writer re-tries a busy read gate (seconds, doubling from the first to the last): a commit
# of one ingest batch takes tens of milliseconds, so the first retries come soon and the poll stays cheap.
_GATE_POLL = (0.001, 0.005)


class SharedExclusiveLock:
    """Many threads use the Chroma client at once (shared); reopening it or writing needs it alone (exclusive)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._owner: int | None = None
        self._depth = 0

    def acquire_shared(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._owner is not None and self._owner != me:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            while self._owner is not None or self._readers > 0:
                self._cond.wait()
            self._owner, self._depth = me, 1

    def release_exclusive(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def downgrade(self) -> bool:
        """Exclusive to shared in one step (no other thread can take it exclusively in between).

        False, and nothing changes, unless this thread holds it exclusively exactly once.
        """
        with self._cond:
            if self._owner != threading.get_ident() or self._depth != 1:
                return False
            self._depth, self._owner = 0, None
            self._readers += 1
            self._cond.notify_all()
            return True


def _flock(path: Path, exclusive: bool, deadline: float) -> int | None:
    """An open descriptor of `path` holding a shared or exclusive flock, or None once `deadline` has passed."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    delay = _GATE_POLL[0]
    try:
        while True:
            try:
                fcntl.flock(fd, op)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(delay)
                delay = min(delay * 2, _GATE_POLL[1])
    except BaseException:  # any other failure (or an interrupt) must not leave the descriptor, and its lock, open
        os.close(fd)
        raise
    os.close(fd)
    return None


class ReadGate:
    """Reads of the embedded store (any process) share this gate; a writer's commit steps take it alone.

    Trigger: a long-lived reader (the MCP server) queried while `kb add-folder` / `remove-document` / `reindex`
    ran in another process (issue 11 item 9: 3 of 110 queries failed with -32000). Why: embedded Chroma is not
    process-safe for readers either: a query met chunk ids its in-memory vector index still held but another
    process had deleted (metadata None; "Error finding id"), and collections a reindex had just dropped ("does
    not exist"); 46 of 400 reads failed in the reproduction. Outcome: a read runs while no commit does, and
    sees the store as the last commit left it (the generation check on entry reopens the client after it).

    Two flock files in the store: `.read.lock` is held shared by every process with a read in flight and
    exclusively by a committing writer; `.read.turnstile` is taken by a writer before it waits for the readers,
    and passed through by readers, so overlapping reads cannot starve a writer. A writer holds the gate only for
    its commit steps (one ingest batch; a reindex's swap), never while it parses or embeds.
    """

    def __init__(self, folder: Path) -> None:
        self._readers_path = folder / ".read.lock"
        self._turnstile_path = folder / ".read.turnstile"
        self._entry = threading.Lock()  # this process's readers pass the turnstile one at a time
        self._count = threading.Lock()
        self._holders = 0  # threads of this process inside a read
        self._shared_fd: int | None = None
        self._writer_fds: tuple[int, int] | None = None

    def enter(self, timeout: float) -> bool:
        """Join the readers (False when a writer kept the gate past `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        with self._entry:
            turn = _flock(self._turnstile_path, True, deadline)
            if turn is None:
                return False
            try:
                with self._count:
                    if self._holders == 0:
                        self._shared_fd = _flock(self._readers_path, False, deadline)
                        if self._shared_fd is None:
                            return False
                    self._holders += 1
                    return True
            finally:
                os.close(turn)

    def leave(self) -> None:
        with self._count:
            self._holders -= 1
            if self._holders == 0 and self._shared_fd is not None:
                os.close(self._shared_fd)  # closing the descriptor drops its lock
                self._shared_fd = None

    def close(self, timeout: float) -> bool:
        """Take the gate alone once reads in flight end (False when they kept it past `timeout`)."""
        if self._writer_fds is not None:
            return True
        deadline = time.monotonic() + timeout
        turn = _flock(self._turnstile_path, True, deadline)
        if turn is None:
            return False
        try:
            alone = _flock(self._readers_path, True, deadline)
        except BaseException:  # `.read.lock` unopenable: the turnstile held would keep every reader out for good
            os.close(turn)
            raise
        if alone is None:
            os.close(turn)
            return False
        self._writer_fds = (alone, turn)
        return True

    def open(self) -> None:
        fds, self._writer_fds = self._writer_fds, None
        for fd in fds or ():
            os.close(fd)


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
            self._make_store_dir()
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

    def _open_gate(self, report: bool = True) -> None:
        """Let readers in again; a new generation first, so they reopen the client and see the commit.

        Trigger: the generation write raised (the store folder moved for a second, `.generation` replaced by a
        directory, disk full) and the gate stayed closed: every other process's reads and writes timed out until
        this one exited (finding 4 of the sixth attack pass). Outcome: the gate opens whatever happens; the
        failure is a StoreUnavailableError (`report`), or a log line when the write is already failing.
        """
        try:
            generation = uuid.uuid4().hex
            self._generation_path.write_text(generation)
            self._generation = generation
        except OSError as exc:
            self._generation = self._read_generation()  # what this process finds next: no needless reopen
            error = self._unpublished(exc)
            if report:
                raise error from None
            log.warning("%s", error)
        finally:
            if self._gate is not None:
                self._gate.open()

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
        done = False
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
            done = True
        finally:
            self._open_gate(report=done)  # a failing write keeps its own error

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        from filelock import FileLock, Timeout

        self.client  # the store folder exists before the lock file is made in it
        self._make_store_dir()  # ... and is still there: filelock would recreate a moved store's folder
        lock = FileLock(str(self._lock_path), timeout=self.settings.lock_timeout)
        try:
            lock.acquire()
        except Timeout:  # (a TimeoutError, so an OSError: caught first)
            raise StoreUnavailableError(
                f"The store {self.settings.store} is locked by another writer "
                f"(waited {self.settings.lock_timeout:g} s)",
                guidance="Wait for the other ingest to finish and retry, raise RESEARCH_AGENT_LOCK_TIMEOUT, "
                "or use a Chroma server for many writers.",
            ) from None
        except OSError as exc:
            raise self.store_error(exc) from None
        try:
            yield
        finally:
            lock.release()


__all__ = ["LockingMixin", "ReadGate", "SharedExclusiveLock"]
