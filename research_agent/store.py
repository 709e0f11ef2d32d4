"""The Chroma store: client (embedded or server), the registry of our records, write locking."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from research_agent.config import Settings
from research_agent.errors import CollectionError, ConfigError, StoreUnavailableError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Our own records (projects, document manifests, revisions) live in one Chroma collection, so a
# Chroma server shares them with every client. Its name cannot be a user collection name.
META_COLLECTION = "research-agent-meta"
RESERVED_PREFIX = "research-agent-"
_NAME_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9._-]{1,510})[a-zA-Z0-9]$")
_PAGE = 5000
MAX_NAMES = 500  # collection names accepted in one call
# `kb reindex` fills `research-agent-tmp-<8 hex>-<name>`, then renames the live collection to
# `research-agent-old-<8 hex>-<name>` and the copy to `<name>`: the names say whose they are, so a crash at
# any step is recovered from the names alone (28 characters of prefix: names over 484 cannot be reindexed).
TMP_PREFIX = RESERVED_PREFIX + "tmp-"
BACKUP_PREFIX = RESERVED_PREFIX + "old-"
SWAP_PREFIX_CHARS = len(BACKUP_PREFIX) + 9
# How often a reader or writer re-tries a busy read gate (seconds, doubling from the first to the last): a commit
# of one ingest batch takes tens of milliseconds, so the first retries come soon and the poll stays cheap.
_GATE_POLL = (0.001, 0.005)


def validate_name(name: str, what: str = "collection") -> str:
    """Chroma's naming rule (3-512 chars of [a-zA-Z0-9._-], alphanumeric at both ends)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise CollectionError(
            f"Invalid {what} name {name!r}",
            guidance="Use 3-512 characters of letters, digits, '.', '_' or '-', starting and ending "
            "with a letter or digit.",
            name=str(name)[:100],
        )
    if name.startswith(RESERVED_PREFIX):
        raise CollectionError(f"The {what} name prefix {RESERVED_PREFIX!r} is reserved.", guidance="Pick another name.")
    return name


def swap_name(prefix: str, collection: str) -> str:
    """The temporary or backup name of `collection` during a reindex."""
    if len(collection) + SWAP_PREFIX_CHARS > 512:
        raise CollectionError(f"The name of {collection[:60]!r}... is too long to reindex",
                              guidance=f"Names of at most {512 - SWAP_PREFIX_CHARS} characters can be reindexed.")
    return f"{prefix}{uuid.uuid4().hex[:8]}-{collection}"


def swap_target(name: str) -> str | None:
    """The collection a reindex's temporary or backup collection belongs to (None for other names)."""
    for prefix in (TMP_PREFIX, BACKUP_PREFIX):
        if name.startswith(prefix) and len(name) > SWAP_PREFIX_CHARS and name[SWAP_PREFIX_CHARS - 1] == "-":
            return name[SWAP_PREFIX_CHARS:]
    return None


def is_swap_leftover(name: str) -> bool:
    return name.startswith((TMP_PREFIX, BACKUP_PREFIX))


def _is_transport_error(exc: BaseException) -> bool:
    try:
        import httpx
    except ImportError:  # pragma: no cover - chromadb depends on httpx
        return False
    return isinstance(exc, httpx.TransportError)


class _ServerGuard:
    """A Chroma server client (or one of its collections) whose dropped connections are retryable errors.

    Trigger: the server is down or dies mid-run (issue 11 item 14). Why: httpx's errors surfaced as exit 1,
    and `get_collection` took them for "not found" (exit 4, "create it"). Outcome: StoreUnavailableError
    (exit 3, -32001, retryable) at whichever call lost the connection.
    """

    def __init__(self, target: Any, location: str) -> None:
        self._target = target
        self._location = location

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attr(*args, **kwargs)
            except Exception as exc:
                if _is_transport_error(exc):
                    raise unreachable(self._location, exc) from None
                raise
            if hasattr(result, "upsert"):
                return _ServerGuard(result, self._location)
            if isinstance(result, list):
                return [_ServerGuard(r, self._location) if hasattr(r, "upsert") else r for r in result]
            return result

        return call


def unreachable(location: str, exc: BaseException) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"Chroma server at {location} is unreachable ({type(exc).__name__})",
        guidance="Start it with `chroma run --path DIR --host HOST --port PORT` (or fix --chroma-host/--chroma-port) "
        "and run the command again: interrupted writes are finished or undone on the next run.",
    )


class _SharedExclusiveLock:
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
    while True:
        try:
            fcntl.flock(fd, op)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(delay)
            delay = min(delay * 2, _GATE_POLL[1])


class _ReadGate:
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
        alone = _flock(self._readers_path, True, deadline)
        if alone is None:
            os.close(turn)
            return False
        self._writer_fds = (alone, turn)
        return True

    def open(self) -> None:
        if self._writer_fds is not None:
            for fd in self._writer_fds:
                os.close(fd)
            self._writer_fds = None


class Store:
    """One Chroma client per process; writers take a cross-process lock in embedded mode.

    Threads (the MCP server's tool calls) use the client inside `session()`. Reopening the client to
    see another process's writes replaces Chroma's shared system, which breaks any call in flight,
    so it happens only while no session is active; in-process writes are exclusive too.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Any = None
        self._meta: Any = None
        self._generation: str | None = None
        self._lock = threading.RLock()  # this process's writers, one at a time
        self._connect_lock = threading.RLock()  # building the client; never held while waiting for others
        self._use = _SharedExclusiveLock()
        self._local = threading.local()
        self._gate: _ReadGate | None = None
        self._readers_admitted = False  # a reindex fills its copy while readers read the live collection

    # -- client -----------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "server" if self.settings.server_mode else "embedded"

    @property
    def location(self) -> str:
        s = self.settings
        return f"{'https' if s.chroma_ssl else 'http'}://{s.chroma_host}:{s.chroma_port}" if s.server_mode else str(s.store)

    @property
    def client(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._connect_lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> Any:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        s = self.settings
        if s.server_mode:
            try:
                client = chromadb.HttpClient(host=s.chroma_host, port=s.chroma_port, ssl=s.chroma_ssl, settings=chroma_settings)
                client.heartbeat()
            except Exception as exc:
                raise unreachable(self.location, exc) from None
            return _ServerGuard(client, self.location)
        self._make_store_dir()
        try:
            self._generation = self._read_generation()
            return chromadb.PersistentClient(path=str(s.store), settings=chroma_settings)
        except OSError as exc:
            raise self._unopenable(exc) from None

    def _make_store_dir(self) -> None:
        try:
            self.settings.store.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unopenable(exc) from None

    def _unopenable(self, exc: OSError) -> ConfigError:
        return ConfigError(f"Cannot open the store at {self.settings.store}: {exc.strerror}",
                           guidance="Pass a writable --store PATH.")

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

    # -- the read gate (embedded only; see _ReadGate) -------------------------------------------------
    def _read_gate(self) -> _ReadGate | None:
        if self.settings.server_mode:
            return None
        if self._gate is None:
            try:
                import fcntl  # noqa: F401 - POSIX only
            except ImportError:  # pragma: no cover - Windows: reads are not gated there
                return None
            self._make_store_dir()
            with self._connect_lock:
                self._gate = self._gate or _ReadGate(self.settings.store)
        return self._gate

    def _enter_gate(self) -> None:
        gate = self._read_gate()
        if gate is None:
            return
        if not gate.enter(self.settings.lock_timeout):
            raise StoreUnavailableError(
                f"The store {self.settings.store} stayed busy with another process's write for "
                f"{self.settings.lock_timeout:g} s",
                guidance="Try again in a moment (writes commit in short steps); raise RESEARCH_AGENT_LOCK_TIMEOUT, "
                "or use a Chroma server for many writers.",
            )
        self._local.gated = True

    def _leave_gate(self) -> None:
        if getattr(self._local, "gated", False):
            self._local.gated = False
            self._read_gate().leave()

    def _close_gate(self) -> None:
        """Wait for reads in flight (every process) to end, then keep new ones out until `_open_gate`."""
        gate = self._read_gate()
        if gate is not None and not gate.close(self.settings.lock_timeout):
            raise StoreUnavailableError(
                f"Reads of the store {self.settings.store} did not pause within {self.settings.lock_timeout:g} s",
                guidance="Try again in a moment; raise RESEARCH_AGENT_LOCK_TIMEOUT, or use a Chroma server.",
            )

    def _open_gate(self) -> None:
        """Let readers in again; a new generation first, so they reopen the client and see the commit."""
        generation = uuid.uuid4().hex
        self._generation_path.write_text(generation)
        self._generation = generation
        gate = self._read_gate()
        if gate is not None:
            gate.open()

    def admit_readers(self) -> None:
        """Inside a write: let readers (this process and others) read while the writer fills a working copy.

        Trigger: `kb reindex` re-embeds a whole collection under the write lock (minutes with a real model).
        Why: a reader must never wait for a whole ingest. Outcome: reads go on against the live collection,
        which nothing changes until `exclude_readers` closes the gate again for the swap.
        """
        if self.settings.server_mode or self._readers_admitted or not getattr(self._local, "writing", 0):
            return
        if self._use.downgrade():
            self._open_gate()
            self._readers_admitted = True

    def exclude_readers(self) -> None:
        """Undo `admit_readers`: wait for the reads in flight, then commit alone."""
        if not self._readers_admitted:
            return
        self._close_gate()
        self._use.release_shared()
        self._use.acquire_exclusive()
        self._readers_admitted = False

    def refresh(self) -> None:
        """See writes committed by other processes (Chroma caches one system per path)."""
        if self.settings.server_mode or self._client is None or getattr(self._local, "shared", 0):
            return  # inside a session the refresh happened on entry
        if self._read_generation() == self._generation:
            return
        self._use.acquire_exclusive()
        try:
            self._reopen_if_stale()
        finally:
            self._use.release_exclusive()

    def _reopen_if_stale(self) -> None:
        # Called with exclusive use: no other thread is inside a Chroma call.
        if self._client is None or self._read_generation() == self._generation:
            return
        from chromadb.api.shared_system_client import SharedSystemClient

        with self._connect_lock:
            log.debug("store changed on disk; reopening the Chroma client")
            SharedSystemClient.clear_system_cache()
            self._client = None
            self._meta = None
            self._client = self._connect()

    def close(self) -> None:
        with self._connect_lock:
            self._client = None
            self._meta = None

    # -- writes ------------------------------------------------------------------------------
    @property
    def _lock_path(self) -> Path:
        return self.settings.store / ".write.lock"

    @property
    def _generation_path(self) -> Path:
        return self.settings.store / ".generation"

    def _read_generation(self) -> str | None:
        try:
            return self._generation_path.read_text()
        except OSError:
            return None

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
            self._open_gate()

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        from filelock import FileLock, Timeout

        self.client  # the store folder exists before the lock file is made in it
        lock = FileLock(str(self._lock_path), timeout=self.settings.lock_timeout)
        try:
            lock.acquire()
        except Timeout:
            raise StoreUnavailableError(
                f"The store {self.settings.store} is locked by another writer (waited {self.settings.lock_timeout:g} s)",
                guidance="Wait for the other ingest to finish and retry, raise RESEARCH_AGENT_LOCK_TIMEOUT, "
                "or use a Chroma server for many writers.",
            ) from None
        try:
            yield
        finally:
            lock.release()

    # -- Chroma collections -------------------------------------------------------------------
    def _get_raw(self, name: str) -> Any:
        try:
            return self.client.get_collection(name, embedding_function=None)
        except StoreUnavailableError:
            raise
        except Exception:  # chromadb's NotFoundError (embedded: ValueError in older releases)
            return None

    def get_collection(self, name: str) -> Any:
        validate_name(name)
        col = self._get_raw(name)
        if col is None:  # a reindex killed between its renames: the backup takes the name back
            self.recover_swaps(only=name)
            col = self._get_raw(name)
        if col is None:
            raise CollectionError(
                f"Collection {name!r} not found",
                guidance="Run `research-agent collections list` for the names; if a command on it was interrupted, "
                "run `research-agent doctor --repair` (a reindex cut short is restored automatically).",
                collection=name,
            )
        if "ra_schema_version" not in (col.metadata or {}):
            raise CollectionError(f"{name!r} is not a research-agent collection", collection=name)
        return col

    def missing_collections(self, names: list[str]) -> list[str]:
        """The names that are not research-agent collections, in one listing (lists may be long)."""
        if len(names) > MAX_NAMES:
            raise CollectionError(f"{len(names)} collection names given; at most {MAX_NAMES} at once",
                                  guidance="Pass fewer collections, or group them in a project.")
        existing = {c.name for c in self.list_collections()}
        return [n for n in dict.fromkeys(names) if n not in existing]

    def require_collections(self, names: list[str]) -> list[str]:
        """`names` without repeats, or a CollectionError quoting (a few of) the unknown ones."""
        missing = self.missing_collections(names)
        if missing:
            shown = ", ".join(str(n)[:100] for n in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise CollectionError(f"Unknown collections: {shown}", missing=missing[:10],
                                  guidance="Run `research-agent collections list` for the names.")
        return list(dict.fromkeys(names))

    def has_collection(self, name: str) -> bool:
        try:
            self.get_collection(name)
            return True
        except CollectionError:
            return False

    def create_collection(self, name: str, metadata: dict[str, Any]) -> Any:
        validate_name(name)
        if self.has_collection(name):
            raise CollectionError(
                f"Collection {name!r} already exists",
                guidance="Pick another name, or delete the existing one with `research-agent collections delete`.",
                collection=name,
            )
        meta = {"hnsw:space": "cosine", "ra_schema_version": SCHEMA_VERSION, **metadata}
        return self.client.create_collection(name, metadata=meta, embedding_function=None)

    def list_collections(self) -> list[Any]:
        # A reindex's working copies carry the collection's metadata but are never user collections: listing
        # them broke every default-scope query with "prefix reserved" (issue 11 item 9).
        listed = list(self.client.list_collections())
        orphaned = {swap_target(c.name) for c in listed if c.name.startswith(BACKUP_PREFIX)} - {c.name for c in listed}
        if orphaned - {None}:  # a reindex killed between its renames: give the backups their names back first
            for name in sorted(orphaned - {None}):
                self.recover_swaps(only=name)
            listed = list(self.client.list_collections())
        cols = [self.client.get_collection(c.name, embedding_function=None) if not hasattr(c, "metadata") else c
                for c in listed if not c.name.startswith(RESERVED_PREFIX)]
        return sorted((c for c in cols if "ra_schema_version" in (c.metadata or {})), key=lambda c: c.name)

    def delete_collection(self, name: str) -> None:
        self.client.delete_collection(name)

    def rename_collection(self, col: Any, name: str) -> None:
        col.modify(name=name)

    # -- reindex swaps: the live collection is replaced by a re-embedded copy ----------------------
    def create_swap_copy(self, collection: str, metadata: dict[str, Any]) -> Any:
        """An empty working collection for the re-embedded copy of `collection` (under the write lock).

        Readers are let in while the copy fills (nothing they read changes until `swap_in`): see `admit_readers`.
        """
        copy = self.client.create_collection(swap_name(TMP_PREFIX, collection),
                                             metadata={"hnsw:space": "cosine", **metadata}, embedding_function=None)
        self.admit_readers()
        return copy

    def swap_in(self, old: Any, new: Any, collection: str) -> None:
        """Give `new` the name of `old` (under the write lock); a crash between steps is undone by `recover_swaps`.

        1. old -> backup name; 2. new -> the collection's name; 3. the backup is dropped. Killed after 1, the
        collection exists only as its backup, which the next open restores (the complete copy wins).
        """
        backup = swap_name(BACKUP_PREFIX, collection)
        self.exclude_readers()  # a reader never meets the collection missing or half swapped
        self.rename_collection(old, backup)
        self.rename_collection(new, collection)
        self.delete_collection(backup)

    def swap_leftovers(self) -> list[str]:
        """Names of reindex working copies and backups present now."""
        return sorted(c.name for c in self.client.list_collections() if is_swap_leftover(c.name))

    def recover_swaps(self, only: str | None = None, *, force: bool = False) -> list[str]:
        """Finish or undo reindex swaps cut short; returns what was done (empty when nothing was left).

        Trigger: a kill -9 inside `kb reindex` (issue 11 item 5). Why: it may leave the collection only under
        its backup name, and the old advice (`collections create`) made an empty one that `doctor --repair`
        then kept over the backup. Outcome, under the write lock: a backup whose collection is missing or
        empty takes its name back; a backup holding no more than the live collection is dropped; a backup
        holding more is kept (doctor reports it); working copies are dropped. On a Chroma server other
        writers run at the same time, so without `force` only the missing-name case is handled.
        """
        names = self.swap_leftovers()
        if only is not None:
            names = [n for n in names if swap_target(n) == only]
        if not names:
            return []
        force = force or not self.settings.server_mode  # embedded: whatever is found under the lock is dead
        with self.write_lock():
            actions: list[str] = []
            # Looked up again under the lock (another process may have recovered them); backups first, so a
            # working copy is dropped only once its collection is back.
            for name in sorted(set(names) & set(self.swap_leftovers()), key=lambda n: not n.startswith(BACKUP_PREFIX)):
                actions += self._recover_one(name, force=force)
            return actions

    def _recover_one(self, name: str, *, force: bool) -> list[str]:
        target = swap_target(name)
        if name.startswith(TMP_PREFIX) or target is None:
            if not force:
                return []
            self.delete_collection(name)
            return [f"deleted {name}, the working copy of an interrupted reindex"]
        backup, live = self._get_raw(name), self._get_raw(target)
        if backup is None:
            return []
        if live is None or (live.count() == 0 and backup.count() > 0):
            if live is not None:
                self.delete_collection(target)
            self.rename_collection(backup, target)
            self.bump_revision(target)
            log.warning("restored collection %s from the backup of an interrupted reindex", target)
            return [f"restored {target} from its backup {name} (an interrupted reindex)"]
        if force and backup.count() <= live.count():
            self.delete_collection(name)
            return [f"deleted {name}, the backup of a finished reindex"]
        return []

    # -- registry (projects, document manifests, revisions) -------------------------------------
    @property
    def meta(self) -> Any:
        meta = self._meta
        if meta is not None:
            return meta
        with self._connect_lock:
            if self._meta is None:
                self._meta = self.client.get_or_create_collection(
                    META_COLLECTION, metadata={"ra_internal": True}, embedding_function=None
                )
            return self._meta

    def registry_get(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        ids = list(dict.fromkeys(ids))  # Chroma refuses repeated ids
        if not ids:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), _PAGE):
            res = self.meta.get(ids=ids[start:start + _PAGE], include=["documents"])
            for rid, doc in zip(res["ids"], res["documents"]):
                found[rid] = json.loads(doc)
        return found

    def registry_find(self, record: str, collection: str | None = None) -> dict[str, dict[str, Any]]:
        where: dict[str, Any] = {"record": record}
        if collection is not None:
            where = {"$and": [where, {"collection": collection}]}
        out: dict[str, dict[str, Any]] = {}
        offset = 0
        while True:
            res = self.meta.get(where=where, include=["documents"], limit=_PAGE, offset=offset)
            for rid, doc in zip(res["ids"], res["documents"]):
                out[rid] = json.loads(doc)
            if len(res["ids"]) < _PAGE:
                return out
            offset += _PAGE

    def registry_put(self, records: dict[str, dict[str, Any]], record: str, collection: str | None = None) -> None:
        if not records:
            return
        ids = list(records)
        for start in range(0, len(ids), _PAGE):
            page = ids[start:start + _PAGE]
            self.meta.upsert(
                ids=page,
                embeddings=[[1.0]] * len(page),
                documents=[json.dumps(records[i], sort_keys=True) for i in page],
                metadatas=[{"record": record, **({"collection": collection} if collection else {})} for _ in page],
            )

    def registry_delete(self, ids: list[str]) -> None:
        for start in range(0, len(ids), _PAGE):
            self.meta.delete(ids=ids[start:start + _PAGE])

    def registry_delete_collection(self, collection: str) -> None:
        self.meta.delete(where={"collection": collection})

    # -- revisions: a per-collection token that changes on every write ----------------------------
    def revision(self, collection: str) -> str:
        rec = self.registry_get([f"revision:{collection}"])
        return str(rec.get(f"revision:{collection}", {}).get("revision", "0"))

    def bump_revision(self, collection: str) -> str:
        # A fresh random token, not a counter: two writers on a Chroma server cannot lose a bump
        # by both reading N and writing N+1. Caches only ever compare it for equality.
        rev = uuid.uuid4().hex
        self.registry_put({f"revision:{collection}": {"revision": rev}}, "revision", collection)
        return rev
