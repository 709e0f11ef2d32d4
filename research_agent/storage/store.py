"""The Chroma store: one client per process (embedded or server) and the collections in it.

`Store` is built from three mixins, one per concern, so each reads on its own:
- storage/locks.py     `session()`, `write_lock()`, the read gate (LockingMixin)
- storage/swaps.py     reindex swaps and their recovery (SwapMixin)
- storage/registry.py  our own records and revisions (RegistryMixin)
What stays here: connecting (and the retryable error when a Chroma server is unreachable), seeing other
processes' writes (the generation file), and the collections: names, lookup, create, list, delete, rename.
Only a write creates an embedded store's folder: until then reads answer as an empty store (`NoStoreYet`).
Over 400 lines because opening the store is one concern with its failure modes: a server that is down or
stuck, an embedded folder not created yet, moved away, re-created, or with an unusable file of its own;
each error is built beside the check that knows the fact.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import uuid
from typing import Any

from research_agent.config import Settings
from research_agent.errors import CollectionError, ConfigError, StoreUnavailableError
from research_agent.storage.generation import STORE_ID_FILE, GenerationMixin, create_small
from research_agent.storage.lock_primitives import ReadGate, SharedExclusiveLock
from research_agent.storage.locks import LockingMixin
from research_agent.storage.registry import RESERVED_PREFIX, RegistryMixin
from research_agent.storage.swaps import BACKUP_PREFIX, SwapMixin, swap_target

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: The connect probe's deadline is the setting `chroma_connect_timeout` (default 5 s). chromadb 1.5.9's HttpClient
#: builds its httpx.Client with timeout=None and takes no timeout setting, and its constructor already sends
#: requests: a server that accepted and never answered hung the connect, and everything behind `_connect_lock`
#: (/health, every read), for 700 s. A healthy local server answers a heartbeat in milliseconds.
#: Seconds any one request to a Chroma server may wait for its answer once connected (set on chromadb's httpx
#: session): far above a slow query on a large collection, yet a server that stops answering frees the thread.
REQUEST_TIMEOUT = 120.0
_NAME_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9._-]{1,510})[a-zA-Z0-9]$")
MAX_NAMES = 500  # collection names accepted in one call


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


def _bound_requests(client: Any, connect: float) -> None:
    """Give chromadb's httpx session (built with timeout=None) a REQUEST_TIMEOUT read deadline and a `connect`
    one (chroma_connect_timeout); a chromadb without that private attribute keeps its own behaviour."""
    import httpx

    session = getattr(getattr(client, "_server", None), "_session", None)
    if isinstance(session, httpx.Client):
        session.timeout = httpx.Timeout(REQUEST_TIMEOUT, connect=connect)


def _timed_out(exc: BaseException) -> bool:
    try:
        import httpx
    except ImportError:  # pragma: no cover - chromadb depends on httpx
        return isinstance(exc, TimeoutError)
    return isinstance(exc, (TimeoutError, httpx.TimeoutException))


def unreachable(location: str, exc: BaseException, seconds: float | None = None) -> StoreUnavailableError:
    """Retryable; a server that timed out (alive but slow, or stuck) is told apart from one that refused the
    connection, which is down: "start it" sent the outside tester to start a server that was running."""
    if seconds is not None and _timed_out(exc):
        return StoreUnavailableError(
            f"Chroma server at {location} did not answer within {seconds:g} s ({type(exc).__name__})",
            guidance="Check that the server is healthy (not overloaded or stuck), or, if it is only slow, raise "
            "RESEARCH_AGENT_CHROMA_CONNECT_TIMEOUT; then run the command again.",
        )
    return StoreUnavailableError(
        f"Chroma server at {location} is unreachable ({type(exc).__name__})",
        guidance="Start it with `chroma run --path DIR --host HOST --port PORT` (or fix --chroma-host/--chroma-port) "
        "and run the command again: interrupted writes are finished or undone on the next run.",
    )


#: What makes a folder a store (`Store._store_present`): Chroma's database, or the id a write gives a new store first.
STORE_FILES = ("chroma.sqlite3", STORE_ID_FILE)


class NoStoreYet:
    """The client of an embedded store with nothing at its path yet: it reads as an empty store and creates nothing.

    A write does not reach it: the write lock creates the folder and reopens the real client first, with the
    client to itself (LockingMixin._file_lock, GenerationMixin._current). Anything else it is asked (a registry
    write outside the write lock, which only tests do) creates the store and goes to the real client, as before.
    """

    def __init__(self, create: Any) -> None:
        self._create = create  # makes the store folder and returns the real client (Store._create_now)

    def heartbeat(self) -> int:
        return 0

    def list_collections(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def count_collections(self) -> int:
        return 0

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> Any:
        raise CollectionError(f"Collection {name!r} not found", collection=name)

    def get_or_create_collection(self, name: str, *args: Any, **kwargs: Any) -> Any:
        # Only our records' collection is opened this way on a read; a write to it creates the store.
        return _NoRecords(name, lambda: self._create().get_or_create_collection(name, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._create(), name)


class _NoRecords:
    """Our records' collection of a store not created yet: no records; anything else goes to the real one."""

    def __init__(self, name: str, create: Any) -> None:
        self.name, self.id, self.metadata, self._create = name, None, {}, create

    def get(self, *args: Any, include: Any = (), **kwargs: Any) -> dict[str, Any]:
        return {"ids": [], **{field: [] for field in include}}

    def count(self) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._create(), name)


def import_client_library() -> None:
    """Import chromadb (0.4-0.8 s on 2 cores) ahead of connecting: a CLI query does it in a thread while it
    loads its models when the store is a server (Container.open_store_in_background)."""
    import chromadb  # noqa: F401


class Store(GenerationMixin, LockingMixin, SwapMixin, RegistryMixin):
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
        self.reopens = 0  # clients reopened to see another process's commit (search/freshness.py watches it)
        self._warmed = threading.Event()  # clear while the freshness watcher reopens and warms (`warming`)
        self._warmed.set()
        self._warmer: int | None = None
        self._lock = threading.RLock()  # this process's writers, one at a time
        self._connect_lock = threading.RLock()  # building the client; never held while waiting for others
        self._use = SharedExclusiveLock()
        self._local = threading.local()
        self._gate: ReadGate | None = None
        self._readers_admitted = False  # a reindex fills its copy while readers read the live collection
        self._opened = False  # an embedded store this process opened: never recreated empty if it goes away
        self._identity: tuple[int, int] | None = None  # the store folder the client opened (device, inode)
        self._store_id: str | None = None  # its `.store-id` (GenerationMixin._check_same_store)
        self._absent = False  # the client is a NoStoreYet: nothing at the store's path when it was opened
        self._warned: set[str] = set()  # problems with the store's small files already logged (one warning each)
        self.unpublished: str | None = None  # the last failure to write `.generation` (LockingMixin._publish)

    # -- client -----------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "server" if self.settings.server_mode else "embedded"

    @property
    def location(self) -> str:
        s = self.settings
        if not s.server_mode:
            return str(s.store)
        return f"{'https' if s.chroma_ssl else 'http'}://{s.chroma_host}:{s.chroma_port}"

    @property
    def client(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._connect_lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    @property
    def exists(self) -> bool:
        """False for an embedded store with no store at its path yet: nothing there, or a folder holding no store
        (reads answer as an empty store; the first write creates it). Never connects."""
        return self.settings.server_mode or self._store_present()

    def _store_present(self) -> bool:
        """Whether something a read must open is at the store's path: a folder holding a store (its
        `chroma.sqlite3` or `.store-id`), or anything that is not a folder (a file, a link to nothing: an error).

        Trigger: `--store ~/myproject` (or `--store ''`, the working folder) on a read wrote chroma.sqlite3, .store-id
        and the read locks into a folder that held no store (finding F2 of the H2b attack pass). Outcome: such a
        folder reads as no store yet, and a write makes the store there (`_make_store_dir` claims it)."""
        store = self.settings.store
        if not os.path.lexists(store):
            return False
        if not store.is_dir():
            return True
        return any(os.path.lexists(store / name) for name in STORE_FILES)

    @property
    def connected(self) -> bool:
        """Whether a client is open, without connecting (the MCP warm-up's state re-checks it)."""
        return self._client is not None

    def _connect(self) -> Any:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        s = self.settings
        if s.server_mode:
            try:
                self._probe()
                client = chromadb.HttpClient(host=s.chroma_host, port=s.chroma_port, ssl=s.chroma_ssl,
                                             settings=chroma_settings)
                _bound_requests(client, s.chroma_connect_timeout)
                client.heartbeat()
            except Exception as exc:
                raise unreachable(self.location, exc, s.chroma_connect_timeout) from None
            return _ServerGuard(client, self.location)
        if not self._find_store_dir():
            self._absent, self._generation, self._identity = True, None, None
            return NoStoreYet(self._create_now)
        identity = self._store_identity()
        store_id = self._open_store_id()  # before Chroma opens it: a store re-created at the path is refused
        try:
            self._generation = self._read_generation()
            client = chromadb.PersistentClient(path=str(s.store), settings=chroma_settings)
        except OSError as exc:
            raise self._unopenable(exc) from None
        self._opened, self._absent, self._identity, self._store_id = True, False, identity, store_id
        return client

    def _probe(self) -> None:
        """One heartbeat with a chroma_connect_timeout deadline before chromadb's own (unbounded) requests: a
        server that does not answer it is unreachable now, not a hang. Any HTTP answer will do (chromadb judges
        it)."""
        import httpx

        httpx.get(f"{self.location}/api/v2/heartbeat", timeout=self.settings.chroma_connect_timeout)

    def client_within(self, seconds: float) -> Any:
        """`client`, or StoreUnavailableError when another thread is still connecting after `seconds`: /health
        must answer while a connect is under way, never queue behind it."""
        if self._client is not None:
            return self._client
        if not self._connect_lock.acquire(timeout=seconds):
            raise unreachable(self.location, TimeoutError(f"still connecting after {seconds:g} s"), seconds)
        try:
            return self.client
        finally:
            self._connect_lock.release()

    def _make_store_dir(self) -> None:
        """Create the store folder of a new store; a store this process opened that has gone is an error.

        Trigger: the store folder moved away under a running MCP server (finding 6 of the sixth attack pass).
        Why: recreating it would put an empty store at the old path, answer "no such collection" from it, and
        block moving the real one back (the path is taken). Outcome: StoreUnavailableError naming the path until
        the folder is back; the process then reads it again without a restart.
        """
        store = self.settings.store
        if self._opened and not store.is_dir():
            raise self._store_gone()
        if os.path.lexists(store) and not store.is_dir():
            raise self._not_a_folder()
        try:
            store.mkdir(parents=True, exist_ok=True)
            if not self._opened and not self._store_present():  # a new or empty folder: this write claims it
                create_small(store / STORE_ID_FILE, uuid.uuid4().hex)  # (readers now open it: `_store_present`)
        except OSError as exc:
            raise self._unopenable(exc) from None

    def _not_a_folder(self) -> ConfigError:
        """A store path that is a file or a link to nothing, said so (finding F5 of the H2b attack pass: "Cannot
        open the store at X: File exists")."""
        store = self.settings.store
        if store.is_symlink() and not store.exists():
            cause = f"it is a symbolic link to a missing {os.path.join(store.parent, os.readlink(store))}"
            fix = "Put the store back where the link points, or pass --store the store folder itself."
        else:
            cause = "it is a file, not a folder"
            fix = "Pass --store a folder (a new one is created by the first write), not a file."
        return ConfigError(f"Cannot open the store at {store}: {cause}", guidance=fix, store=str(store))

    def _create_now(self) -> Any:
        """Create the store folder and open the real client in place of a NoStoreYet (outside the write lock,
        only a bare registry write gets here: tests)."""
        with self._connect_lock:
            if self._absent:
                self._make_store_dir()
                self._client = self._meta = None
                self._client = self._connect()
            return self._client

    def _find_store_dir(self) -> bool:
        """Whether the store folder is there (a read's check: it creates nothing, not even parents).

        Trigger: `research-agent status` with the store moved away made an empty store at its path, and the
        user's `mv store.mv store` then put the real store inside it (finding 3 of the eighth attack pass). Why:
        the folder was made by any first use. Outcome: reads answer as an empty store, without creating it;
        writes create it (`_make_store_dir`); a folder this process opened that has gone is still an error.
        """
        store = self.settings.store
        if self._opened or self._store_present():
            self._make_store_dir()  # a store folder gone since this process opened it, or a file at the path: coded
            return True
        found = store  # the nearest part of the path that exists: a file there means no store can ever be
        while not os.path.lexists(found) and found != found.parent:
            found = found.parent
        if not found.is_dir():
            raise self._unopenable(NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(found)))
        return False

    def _unopenable(self, exc: OSError) -> ConfigError:
        return ConfigError(f"Cannot open the store at {self.settings.store}: {exc.strerror}",
                           guidance="Pass a writable --store PATH.")

    def _store_gone(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"The store folder {self.settings.store} is missing (moved, renamed or deleted since this process "
            "opened it)",
            guidance=f"Put the store folder back at {self.settings.store} (running servers then use it again "
            "without a restart), or point --store at its new place.",
            store=str(self.settings.store))

    def store_error(self, exc: OSError) -> ConfigError:
        """The coded error for an OSError on the store's own files (lock files, `.generation`)."""
        if not self.settings.store.is_dir():
            return self._store_gone()
        if self._read_only(exc):
            return ConfigError(f"Cannot open the store at {self.settings.store}: read-only file system",
                               guidance="Pass a writable --store PATH.", store=str(self.settings.store))
        if exc.errno == errno.ELOOP:
            return self._linked(exc)
        if exc.filename is not None and os.path.dirname(os.fspath(exc.filename)) == os.fspath(self.settings.store):
            return self._bad_small_file(exc)
        return self._unopenable(exc)

    def _read_only(self, exc: OSError) -> bool:
        """Whether `exc` comes from a store on a read-only file system: EROFS, or a lock file that is not there
        and cannot be made there (finding F4 of the H2b attack pass: that said to make the lock file writable)."""
        if exc.errno == errno.EROFS:
            return True
        if exc.errno not in (errno.ENOENT, errno.EACCES, errno.EPERM):
            return False
        try:
            return bool(os.statvfs(self.settings.store).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):
            return False

    def _bad_small_file(self, exc: OSError) -> ConfigError:
        """One of the store's lock files cannot be opened: named, with what to do (finding 1 of the eighth attack
        pass: a directory at `.read.lock` said only "Cannot open the store")."""
        path = os.fspath(exc.filename)
        if not os.path.lexists(path):  # cannot be created there: the folder is not writable by this user
            return ConfigError(f"Cannot open the store at {self.settings.store}: cannot create {path} "
                               f"({exc.strerror or exc})", guidance=f"Make {self.settings.store} writable by this "
                               "user, or pass a writable --store PATH.", store=str(self.settings.store))
        if exc.errno in (errno.EACCES, errno.EPERM):
            fix = f"Make {path} readable and writable by this user, or remove it (research-agent re-creates it)."
        else:  # a directory, a socket or a device where a lock file belongs
            fix = f"Remove {path} (research-agent re-creates it as a file), then run the command again."
        return ConfigError(f"Cannot open {path}, a lock file of the store: {exc.strerror or exc}", guidance=fix,
                           store=str(self.settings.store))

    def _linked(self, exc: OSError) -> StoreUnavailableError:
        """A lock file of the store is a symlink: never followed (lock_primitives.NOFOLLOW), said plainly."""
        return StoreUnavailableError(
            f"{exc.filename or self.settings.store} is a symbolic link; research-agent never opens the store's "
            "own files through one",
            guidance=f"Remove that link (writers re-create the file), and check who can write into "
            f"{self.settings.store}: a link there could make writers overwrite other files.",
            store=str(self.settings.store))

    def _unpublished(self, exc: OSError) -> ConfigError:
        """The coded error for a generation that could not be written: the store folder gone, or the file."""
        if not self.settings.store.is_dir():
            return self._store_gone()
        return StoreUnavailableError(
            f"Cannot write {self._generation_path} ({exc.strerror}): other processes are not told of this "
            "process's writes",
            guidance=f"Make {self._generation_path} a writable file (free disk space, fix permissions, remove a "
            "folder of that name), then write again or restart long-running servers so they see this write.")

    def close(self) -> None:
        with self._connect_lock:
            self._client = None
            self._meta = None
            self._opened = self._absent = False
            self._store_id = self._identity = None


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
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            shown = ", ".join(str(n)[:100] for n in missing[:10]) + more
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


__all__ = ["MAX_NAMES", "REQUEST_TIMEOUT", "SCHEMA_VERSION", "NoStoreYet", "Store", "import_client_library",
           "unreachable", "validate_name"]
