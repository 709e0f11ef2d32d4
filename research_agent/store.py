"""The Chroma store: client (embedded or server), the registry of our records, write locking."""

from __future__ import annotations

import json
import logging
import re
import threading
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
                raise StoreUnavailableError(
                    f"Chroma server at {self.location} is unreachable ({type(exc).__name__})",
                    guidance="Start it with `chroma run --path DIR --host HOST --port PORT` or fix --chroma-host/--chroma-port.",
                ) from None
            return client
        try:
            s.store.mkdir(parents=True, exist_ok=True)
            self._generation = self._read_generation()
            return chromadb.PersistentClient(path=str(s.store), settings=chroma_settings)
        except OSError as exc:
            raise ConfigError(f"Cannot open the store at {s.store}: {exc.strerror}", guidance="Pass a writable --store PATH.") from None

    @contextmanager
    def session(self) -> Iterator[None]:
        """Use the client from this thread while others may too; stale state is refreshed first."""
        self.refresh()
        self._use.acquire_shared()
        self._local.shared = getattr(self._local, "shared", 0) + 1
        try:
            yield
        finally:
            self._local.shared -= 1
            self._use.release_shared()

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
        """Serialize writers across processes; readers then see the write via the generation file."""
        held = getattr(self._local, "shared", 0)
        # Give up this thread's shared use while waiting, so a writer never waits on a thread that
        # waits on it; the write itself runs with exclusive use of the client.
        for _ in range(held):
            self._use.release_shared()
        self._local.shared = 0
        try:
            with self._lock:
                if self.settings.server_mode:
                    self._use.acquire_exclusive()
                    try:
                        yield
                    finally:
                        self._use.release_exclusive()
                    return
                with self._file_lock():
                    self._use.acquire_exclusive()
                    try:
                        self._reopen_if_stale()
                        yield
                    finally:
                        generation = uuid.uuid4().hex
                        self._generation_path.write_text(generation)
                        self._generation = generation
                        self._use.release_exclusive()
        finally:
            for _ in range(held):
                self._use.acquire_shared()
            self._local.shared = held

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
    def get_collection(self, name: str) -> Any:
        validate_name(name)
        try:
            col = self.client.get_collection(name, embedding_function=None)
        except Exception:
            raise CollectionError(
                f"Collection {name!r} not found",
                guidance="Run `research-agent collections list`, or create it with `research-agent collections create`.",
                collection=name,
            ) from None
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
        cols = [self.client.get_collection(c.name, embedding_function=None) if not hasattr(c, "metadata") else c
                for c in self.client.list_collections()]
        return sorted((c for c in cols if "ra_schema_version" in (c.metadata or {})), key=lambda c: c.name)

    def delete_collection(self, name: str) -> None:
        self.client.delete_collection(name)

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
