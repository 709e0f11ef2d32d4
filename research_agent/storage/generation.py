"""Seeing other processes' commits: every commit writes a new `<store>/.generation` (LockingMixin._open_gate); a
process that finds another one reopens its Chroma client (chromadb caches one system per path, and its vector
index in memory would answer from before the commit), and the freshness watcher of a long-lived server
(search/freshness.py) does that reopen early, with `warming` keeping queries from reading beside its first reads.

`GenerationMixin` is the part of `Store` that does it; it uses the Store's `settings`, `_client`, `_meta`, `_local`,
`_use`, `_connect_lock`, `_connect`, `_generation`, `_warmed`, `_warmer`, `reopens` and `store_error`.

The store's identity is `<store>/.store-id` (a uuid written once, on the first open by this version): a copy of
the folder keeps it, a store re-created at the path gets another one (`_current` refuses that one). An id that is
empty, garbled or not a regular file is unknown, never taken for an id: a process that holds the store's id writes
it back (one warning), one opening the store first writes a new one, and a folder put in the store's place with
no readable id is refused, its message naming the id to write back (`_open_store_id`, `_check_same_store`).
The small files of the store are read and written here without following symlinks (`read_small`,
`replace_small`): anyone who can write into a shared store must not make a writer overwrite their files.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import re
import stat
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from research_agent.errors import StoreUnavailableError
from research_agent.storage.lock_primitives import NOFOLLOW

log = logging.getLogger("research_agent.storage.store")

#: The longest a session waits for the freshness watcher's warm-up (search/freshness.py) before reading beside it
#: (seconds): its reopen and first reads took ~3.5 s at 1M chunks; a keyword index rebuilt after a `kb reindex`
#: in another process can take minutes, and a semantic query of another collection should not wait for that.
WARMING_WAIT_SECONDS = 15.0
#: The store's identity file: a uuid (32 hex digits) written once, kept by a copy of the folder.
STORE_ID_FILE = ".store-id"
#: Bytes read from the store's small files (`.generation`, `.store-id`: 32 hex digits each): a link to /dev/zero
#: or a huge file put there must not fill memory.
SMALL_FILE_LIMIT = 256
#: What `uuid.uuid4().hex` writes; anything else in `.store-id` (empty, garbled, a directory) is no id at all.
_STORE_ID_RE = re.compile(r"[0-9a-f]{32}")


def read_small(path: Path) -> str:
    """The text of one of the store's small files: never through a symlink (OSError ELOOP), never blocking on a
    FIFO put there, at most SMALL_FILE_LIMIT bytes. FileNotFoundError when it is missing; an OSError naming the
    file when it is a directory ("Is a directory") or anything else that is not a regular file (a FIFO read as
    empty, finding F6 of the H2b attack pass)."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.read(fd, SMALL_FILE_LIMIT).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _fresh_file(path: Path, text: str) -> Path:
    """A new temp file beside `path` holding `text` (O_EXCL|O_NOFOLLOW: never an existing file or a link's target)."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode())
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def replace_small(path: Path, text: str) -> None:
    """Write `path` whole with one rename: it replaces a symlink at `path` itself, never its target (finding 1 of
    the seventh attack pass: `Path.write_text` through a link overwrote /etc/passwd from the MCP server), and a
    reader never sees a torn value. No fsync: a value lost in a crash only costs readers one reopen."""
    tmp = _fresh_file(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_small(path: Path, text: str) -> str:
    """Write `path` once (a hard link of a complete temp file: fails if anything, even a link, is there) and
    return what it holds: two processes opening a store for the first time agree on the first one's value."""
    tmp = _fresh_file(path, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return read_small(path)
    finally:
        tmp.unlink(missing_ok=True)
    return text


class GenerationMixin:
    settings: Any
    _client: Any
    _meta: Any
    _local: Any
    _use: Any
    _connect_lock: Any
    _generation: str | None
    _identity: tuple[int, int] | None
    _store_id: str | None
    _absent: bool
    _warned: set[str]
    _warmed: threading.Event
    _warmer: int | None
    reopens: int
    _connect: Any
    _store_present: Any
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
        if self._absent:
            return self._store_present()  # created since: the next session opens it
        try:
            now = read_small(self._generation_path)
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
            was_absent = self._absent
            self._client = self._connect()
            if not (was_absent and getattr(self._local, "writing", 0)):  # not when this process's write made it
                self.reopens += 1
            if self._warmer == threading.get_ident():
                self._warmed.clear()  # the watcher's reopen: its warm-up follows (`warming`)

    @property
    def _generation_path(self) -> Path:
        return self.settings.store / ".generation"

    def _read_generation(self) -> str | None:
        try:
            return read_small(self._generation_path)
        except FileNotFoundError:
            return None  # no commit yet
        except OSError as exc:  # a directory or a link there: other processes' writes go unseen, said once
            if not getattr(self._local, "writing", 0):  # (a writer says it when it cannot write the file)
                self._warn_once(f"Cannot read {self._generation_path} ({exc.strerror or exc}): this process does not "
                                "see other processes' writes; remove it (writers then write it again)")
            return None

    def _current(self) -> bool:
        """Whether the open client reads the store as it is now: no other process committed since (the generation)
        and the folder is the one it opened. A store folder put back from a copy keeps its generation, but Chroma
        still holds the old folder's SQLite file open: reads came from it and writes went to it.

        Raises StoreUnavailableError when another store took the path (`_check_same_store`)."""
        if self._absent:
            # A client standing in for a store not created yet: current while there is still nothing at the path,
            # and for a read that entered no read gate (there was no folder to hold one in), which reads as the
            # store was when it began; a gated read or a write opens the store another process created since.
            gated = getattr(self._local, "gated", False) or getattr(self._local, "writing", 0)
            return not gated or not self._store_present()
        if self._store_identity() != self._identity:
            self._check_same_store()
            return False
        return self._read_generation() == self._generation

    def _read_store_id(self) -> str | None:
        """The store's id, or None when `.store-id` is missing or unusable (`_store_id_on_disk`)."""
        return self._store_id_on_disk()[0]

    def _store_id_on_disk(self) -> tuple[str | None, str | None]:
        """(the id, None), (None, None) when `.store-id` is missing, or (None, what is wrong with it)."""
        path = self.settings.store / STORE_ID_FILE
        try:
            text = read_small(path).strip()
        except FileNotFoundError:
            return None, None
        except OSError as exc:  # a directory, a symlink (never followed), unreadable
            return None, f"{path} cannot be read ({exc.strerror or exc})"
        if _STORE_ID_RE.fullmatch(text):
            return text, None
        return None, f"{path} holds no store id ({'empty' if not text else 'garbled'})"

    def _open_store_id(self) -> str | None:
        """The id of the store folder being opened: the one in `.store-id`, written now if there is none.

        Trigger: an emptied or garbled `.store-id` (finding 2 of the eighth attack pass) dropped the id this
        process held at its next reopen, so a copy of the store put back was refused until a restart. Outcome:
        an unusable id is written again, whole, with the id this process holds (or a new one on a first open),
        with one warning; the id held is never dropped. A valid id is taken as found: this is the folder this
        process opened (`_current` checked), and a process that opened it first may have just repaired it. None
        when no id can be read or written (a read-only store: a folder found at the path later is never taken
        for it).
        """
        known = self._store_id
        found, problem = self._store_id_on_disk()
        if found is not None:
            return found
        path = self.settings.store / STORE_ID_FILE
        fresh = known or uuid.uuid4().hex
        try:
            if problem is None:  # missing: written once, so two processes opening it together agree on one id
                found = create_small(path, fresh).strip()
            else:  # unusable: replaced whole (never through a link); a directory there makes this fail
                replace_small(path, fresh)
        except OSError as exc:
            if problem is not None:
                self._warn_once(f"{problem}; it could not be written again ({exc.strerror or exc}): remove it "
                                "so research-agent writes a new one")
            else:
                log.debug("cannot write the store id in %s: %s", self.settings.store, exc)
            return known
        if problem is not None:
            self._warn_once(f"{problem}; wrote {'the id this process holds' if known else 'a new id'} there")
        found = self._read_store_id() if problem is not None else found
        # Another process may have written it meanwhile (it saw the same folder without a usable id): theirs counts.
        return found if found is not None and _STORE_ID_RE.fullmatch(found) else known

    def _warn_once(self, said: str) -> None:
        """One warning per distinct problem with a small file of the store, not one per session or reopen."""
        if said not in self._warned and len(self._warned) < 100:
            self._warned.add(said)
            log.warning("%s", said)

    def _check_same_store(self) -> None:
        """Another folder at the store's path: a copy of the store (same id) is reopened; any other is refused.

        Trigger: with a server running, `mv store store.mv; research-agent status` made an empty store at the
        path and the server adopted it (a new inode looked like a copy put back): it answered "Collections (0)"
        (finding 3 of the seventh attack pass). Outcome: a coded error until the original is back or a restart.
        A folder whose `.store-id` is missing or unusable cannot be told from a new store: refused too, the
        message naming the id to write back if it is a copy."""
        found, problem = self._store_id_on_disk()
        if (found is not None and found == self._store_id) or self._store_identity() is None:
            return  # a copy; or nothing there, which the reopen reports as a missing store
        raise self._replaced(problem or (None if found else f"{self.settings.store / STORE_ID_FILE} is missing"))

    def _replaced(self, problem: str | None = None) -> StoreUnavailableError:
        path = self.settings.store / STORE_ID_FILE
        if problem is None or self._store_id is None:
            return StoreUnavailableError(
                f"The store at {self.settings.store} is not the one this process opened (it was replaced)",
                guidance=f"Put the original store folder back at {self.settings.store}, or restart this process "
                "(a running MCP server too) to use the new one.",
                store=str(self.settings.store))
        return StoreUnavailableError(
            f"The store at {self.settings.store} is not the one this process opened (it was replaced), or a copy "
            f"of it whose id cannot be read: {problem}",
            guidance=f"If that folder is a copy of the store this process opened, write its id into {path} "
            f"(`printf {self._store_id} > {path}`); otherwise put the original back at {self.settings.store}, or "
            "restart this process (a running MCP server too) to use the new one.",
            store=str(self.settings.store))

    def _store_identity(self) -> tuple[int, int] | None:
        """The store folder's (device, inode), None when it is missing (one stat, ~2 us)."""
        try:
            found = self.settings.store.stat()
        except OSError:
            return None
        return found.st_dev, found.st_ino
