"""Lock primitives with no knowledge of the store: a shared/exclusive lock for this process's threads, an flock on a
file with a deadline, and the read gate built from two of those (storage/locks.py puts them to work in `Store`).

- `SharedExclusiveLock`: this process's threads use the client together; reopening it or writing needs it alone.
- `flock`: a shared or exclusive flock on a file, polled until a deadline; it never creates folders, and never
  follows a symlink (`NOFOLLOW`).
- `ReadGate`: across processes (embedded store), reads share `<store>/.read.lock`; a writer takes it alone
  only around its commit steps (docs/architecture.md, "Readers and writers across processes").
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

# How often a reader or writer re-tries a busy read gate (seconds, doubling from the first to the last): a commit
# of one ingest batch takes tens of milliseconds, so the first retries come soon and the poll stays cheap.
_GATE_POLL = (0.001, 0.005)
#: Flags that refuse a symlink as the last part of a path (ELOOP): the store may be a shared folder (team drive,
#: Docker volume), and a lock file replaced by a link, even a dangling one, made O_CREAT create or open the
#: link's target as the user running the writer (finding 1 of the seventh attack pass). 0 where the OS lacks it.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


def flock(path: Path, exclusive: bool, deadline: float) -> int | None:
    """An open descriptor of `path` holding a shared or exclusive flock, or None once `deadline` has passed.

    A symlink at `path` raises OSError(ELOOP) instead of being followed."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o666)
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
            turn = flock(self._turnstile_path, True, deadline)
            if turn is None:
                return False
            try:
                with self._count:
                    if self._holders == 0:
                        self._shared_fd = flock(self._readers_path, False, deadline)
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
        turn = flock(self._turnstile_path, True, deadline)
        if turn is None:
            return False
        try:
            alone = flock(self._readers_path, True, deadline)
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


__all__ = ["NOFOLLOW", "ReadGate", "SharedExclusiveLock", "flock"]
