"""Our own records (projects, document manifests, write intents, revisions, change log, query history) and keys.

They live in one Chroma collection, META_COLLECTION, so a Chroma server shares them with every client. Each
record is a JSON document under a key of the form `<kind>:...`, with metadata {"record": kind} (and
{"collection": name} when it belongs to one, so a collection's records go with it). Every key format is
built here, by one function per kind: six modules used to spell them out themselves.

`RegistryMixin` is the part of `Store` that reads and writes them; it needs the Store's `client` and
`_connect_lock`, and the Store forgets `_meta` whenever it reopens the client.

Every read decodes through `decode_record`: a record whose document is not a JSON object, an intent whose
versions recovery cannot act on (`parse_intent`), a manifest or project missing a field readers use
(`_manifest`, `_project`), or a change record without its integer `at` is malformed. Reads skip it with one
warning naming its key (anyone who can write to a Chroma server can make one; it made every command fail) and
never delete it: `registry_malformed` lists them, and recovery removes a malformed intent of its collection
(storage/leases.py `remove_malformed_intents`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import uuid
from typing import Any, Iterable

from research_agent.storage import chunks

log = logging.getLogger(__name__)

# Our records' collection. Its name cannot be a user collection name: validate_name refuses the prefix, which
# reindex working copies and backups share (storage/swaps.py).
META_COLLECTION = "research-agent-meta"
RESERVED_PREFIX = "research-agent-"

# Record kinds: the "record" metadata of each record, and the first part of its key.
DOCUMENT = "document"  # a document's manifest: the version readers see (content hash, chunk count, source)
PROJECT = "project"    # a named group of collections
INTENT = "intent"      # a write in progress: the old and new versions of each document it touches
REVISION = "revision"  # a token that changes on every write to a collection (caches compare it)
HISTORY = "history"    # one recent query
CHANGE = "change"      # one write's documents and the revision it bumps to, or a reset (the keyword index's log)

#: How long change records are kept: a write prunes older ones, so the log stays about one record per write of
#: the last day (a busy day of 5,000 batch writes is ~5,000 small records). A keyword index that last caught up
#: longer ago than this (or whose revision no record names) falls back to the full manifest diff.
CHANGE_LOG_SECONDS = 24 * 3600
#: Change records this Store logged whose write has not bumped yet (`_done_mark` marks them then): one per write
#: in flight in this process; past this many (writes that raised before their bump) the memory is dropped.
MAX_UNFINISHED_CHANGES = 1000


def document_key(collection: str, document: str) -> str:
    """The key of a document's manifest; `document` comes from source_name (or research:/note:)."""
    return f"{DOCUMENT}:{collection}:{document}"


def chunk_ids(collection: str, document: str, content_hash: str, count: int) -> list[str]:
    """Ids from (collection, document, content version, chunk number): a new version never overwrites the old."""
    base = hashlib.sha1(f"{collection}\n{document}".encode()).hexdigest()[:16]
    return [f"{base}-{content_hash[:12]}-{i:05d}" for i in range(count)]


def version_ids(collection: str, versions: Iterable[dict[str, Any]]) -> list[str]:
    """The chunk ids of document versions (manifests or an intent's entries: document, content_hash, chunk_count)."""
    return [
        cid for v in versions for cid in chunk_ids(collection, v["document"], v["content_hash"], int(v["chunk_count"]))
    ]


# -- reading records: a malformed one is skipped, never raised on -------------------------------------------
#: The largest pid, chunk count and date an intent may name (pid_t; a million chunks per document; year 9999),
#: and the longest host name or pid namespace (the limits storage/leases.py `parse_record` applies to leases).
PID_MAX = 2**31 - 1
CHUNKS_MAX = 1_000_000
DATE_MAX = 253_402_300_799.0
TEXT_MAX = 255


def valid_date(value: Any) -> bool:
    """A finite number (never a bool) within years 1970-9999."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and 0.0 <= value <= DATE_MAX


def valid_pid(value: Any) -> bool:
    """An int in 1..PID_MAX, never a bool (2**70 made os.kill raise OverflowError)."""
    return type(value) is int and 0 < value <= PID_MAX


def valid_text(value: Any, *, optional: bool = False) -> bool:
    """A short printable string (or None when optional): a host or pid namespace with a newline, tab, escape or
    format character (U+2028, U+200F) is no machine's name, and it drove the terminal (or forged a line) where
    doctor or a refusal showed it."""
    return (value is None and optional) or (isinstance(value, str) and 0 < len(value) <= TEXT_MAX
                                            and value.isprintable())


def _version_entry(v: Any) -> bool:
    """An intent entry `version_ids` can use: document and content hash non-empty strings, a chunk count."""
    return isinstance(v, dict) and all(isinstance(v.get(f), str) and v[f] for f in ("document", "content_hash")) \
        and type(v.get("chunk_count")) is int and 0 <= v["chunk_count"] <= CHUNKS_MAX


def parse_intent(raw: Any) -> dict[str, Any] | None:
    """A writer's intent (its stored JSON text, or the object) as recovery may act on it; None: malformed in what
    recovery needs (not an object; `versions` not a list of entries `_version_entry` accepts): never acted on.

    Its writer's fields are checked as lease records' are (`created` a finite date within years 1970-9999; `pid`
    an int in 1..PID_MAX, never a bool; `host` a non-empty string, `pidns` one or null, of at most TEXT_MAX
    characters). Malformed ones are dropped from the intent returned and named under "malformed": such an intent
    names no trustworthy writer or date, so it is a dead writer's (storage/leases.py `intent_stale`; an intent
    without `created`, an older version's, always was). Why: `created` null, "x", NaN or a list, or pid 2**70,
    crashed recovery (so every write of the collection), doctor and the reindex drain."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or not isinstance(raw.get("versions"), list) \
            or not all(_version_entry(v) for v in raw["versions"]):
        return None
    checks = {"created": valid_date, "pid": valid_pid, "host": valid_text,
              "pidns": lambda n: valid_text(n, optional=True)}
    bad = sorted(f for f, ok in checks.items() if f in raw and not ok(raw[f]))
    if not bad and "malformed" not in raw:
        return raw
    # A stored "malformed" field (a forgery, or an intent parsed before) keeps the intent untrusted.
    return {**{k: v for k, v in raw.items() if k not in bad}, "malformed": bad or raw["malformed"]}


def decode_record(key: Any, doc: Any, kind: str | None = None) -> dict[str, Any] | None:
    """A registry record as readers use it (`kind`: the kind it was found by, if any); None when malformed (module
    docstring). An intent by its key or by the kind it was found by: a record under another key whose metadata
    says intent (garbled or forged) must not reach recovery unchecked."""
    if str(key).startswith(f"{INTENT}:") or kind == INTENT:
        return parse_intent(doc)
    try:
        record = json.loads(doc) if isinstance(doc, (str, bytes)) else None
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if str(key).startswith(f"{CHANGE}:") and type(record.get("at")) is not int:
        return None  # sorted by it (changes_since)
    if (str(key).startswith(f"{DOCUMENT}:") or kind == DOCUMENT) and not _manifest(record):
        return None
    if (str(key).startswith(f"{PROJECT}:") or kind == PROJECT) and not _project(record):
        return None
    return record


def _project(record: dict[str, Any]) -> bool:
    """A project readers can use: name, description and date strings, its collections and defaults lists of names
    (every version since the first wrote them all); one without them failed `projects list` (ValidationError)."""
    return all(isinstance(record.get(f), str) for f in ("name", "description", "created_at")) and bool(record["name"]) \
        and all(isinstance(record.get(f), list) and all(isinstance(n, str) for n in record[f])
                for f in ("collections", "default_collections"))


#: A manifest's text fields, written by every version since the first (`path` may be null: notes, research).
MANIFEST_TEXT = ("title", "kind", "source", "updated_at")


def _manifest(record: dict[str, Any]) -> bool:
    """A manifest readers can use: its version (`_version_entry`: document, content hash, a chunk count of at most
    CHUNKS_MAX), its text fields strings, its path a string or null. A garbled one raised KeyError, TypeError or
    a ValidationError in listing, queries, doctor and every ingest of its collection, and a chunk count of 2**40
    made a reader build that many chunk ids."""
    return _version_entry(record) and all(isinstance(record.get(f), str) for f in MANIFEST_TEXT) \
        and (record.get("path") is None or isinstance(record["path"], str))


#: Keys already warned about by this process: a malformed record is named once, not by every read.
_WARNED: set[str] = set()


def _warn_malformed(key: str) -> None:
    if key in _WARNED:
        return
    if len(_WARNED) > 10_000:
        _WARNED.clear()
    _WARNED.add(key)
    log.warning("skipped the malformed registry record %r (run `research-agent doctor`)", key)


def _decoded(got: Iterable[tuple[Any, Any]], prefix: str = "", kind: str | None = None) -> dict[str, dict[str, Any]]:
    """{key: record} of (key, document) pairs (found by `kind`), malformed records skipped with one warning each."""
    out: dict[str, dict[str, Any]] = {}
    for rid, doc in got:
        if not str(rid).startswith(prefix):
            continue
        record = decode_record(rid, doc, kind)
        if record is None:
            _warn_malformed(str(rid))
        else:
            out[rid] = record
    return out


def project_key(name: str) -> str:
    return f"{PROJECT}:{name}"


def intent_key(collection: str) -> str:
    """A new intent's key: a random suffix, so two writers on a Chroma server never share one."""
    return f"{INTENT}:{collection}:{uuid.uuid4().hex}"


def revision_key(collection: str) -> str:
    return f"{REVISION}:{collection}"


def change_key(collection: str, at_ns: int) -> str:
    """A change record's key: zero-padded nanoseconds sort in time order, the suffix keeps two writers apart."""
    return f"{CHANGE}:{collection}:{at_ns:020d}-{uuid.uuid4().hex[:8]}"


def history_key() -> str:
    """A new history entry's key: zero-padded nanoseconds sort in time order; the suffix keeps two records in
    one tick apart."""
    return f"{HISTORY}:{time.time_ns():020d}-{uuid.uuid4().hex[:6]}"


class RegistryMixin:
    """The registry half of `Store`: records by key or by kind, and the per-collection revisions."""

    _meta: Any

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
        return _decoded(chunks.records(self.meta, ["documents"], ids=ids))

    def registry_find(self, record: str, collection: str | None = None) -> dict[str, dict[str, Any]]:
        where: dict[str, Any] = {"record": record}
        if collection is not None:
            where = {"$and": [where, {"collection": collection}]}
        return self._scan(where, kind=record)

    def _scan(self, where: dict[str, Any], prefix: str = "", kind: str | None = None) -> dict[str, dict[str, Any]]:
        """{key: record} of every record matching `where` (and whose key starts with `prefix`), scanned again
        (up to SCAN_TRIES) if the scan lost its place (other processes deleting or re-adding many records
        behind it)."""
        return chunks.rescanning(lambda: _decoded(chunks.records(self.meta, ["documents"], where=where), prefix, kind))

    def registry_malformed(self, record: str | None = None, collection: str | None = None) -> list[str]:
        """The keys of malformed records (of kind `record`, of `collection`; all by default), sorted: what
        reads skip (`decode_record`). Lists only; nothing here deletes them."""
        where: dict[str, Any] | None = {"record": record} if record is not None else None
        if collection is not None:
            where = {"$and": [where, {"collection": collection}]} if where else {"collection": collection}
        return chunks.rescanning(lambda: sorted(
            str(rid) for rid, doc in chunks.records(self.meta, ["documents"], where=where)
            if decode_record(rid, doc, record) is None))

    def registry_put(self, records: dict[str, dict[str, Any]], record: str, collection: str | None = None) -> None:
        if not records:
            return
        ids = list(records)
        for start in range(0, len(ids), chunks.PAGE):
            page = ids[start:start + chunks.PAGE]
            self.meta.upsert(
                ids=page,
                embeddings=[[1.0]] * len(page),
                documents=[json.dumps(records[i], sort_keys=True) for i in page],
                metadatas=[{"record": record, **({"collection": collection} if collection else {})} for _ in page],
            )

    def registry_delete(self, ids: list[str]) -> None:
        for start in range(0, len(ids), chunks.PAGE):
            self.meta.delete(ids=ids[start:start + chunks.PAGE])

    def registry_delete_collection(self, collection: str) -> None:
        self.meta.delete(where={"collection": collection})

    def current_versions(self, collection: str) -> dict[str, str]:
        """{document: content hash} from the collection's manifests: the versions readers may see."""
        return {m["document"]: m["content_hash"] for m in self.registry_find(DOCUMENT, collection).values()}

    # -- revisions: a per-collection token that changes on every write ----------------------------
    def revision(self, collection: str) -> str:
        rec = self.registry_get([revision_key(collection)])
        return str(rec.get(revision_key(collection), {}).get("revision", "0"))

    def bump_revision(self, collection: str, rev: str | None = None) -> str:
        """Publish a new revision: `rev`, the token a `log_change` record announced, or without one a fresh
        token announced by a reset record (`log_reset`), so that no revision is ever missing from the log.

        A fresh random token, not a counter: two writers on a Chroma server cannot lose a bump by both reading
        N and writing N+1. Caches only ever compare it for equality."""
        rev = rev or self.log_reset(collection)
        rows = {revision_key(collection): ({"revision": rev}, {"record": REVISION, "collection": collection}),
                **self._done_mark(rev)}  # one upsert: the mark costs no extra round trip or SQLite commit
        self.meta.upsert(ids=list(rows), embeddings=[[1.0]] * len(rows),
                         documents=[json.dumps(doc, sort_keys=True) for doc, _ in rows.values()],
                         metadatas=[meta for _, meta in rows.values()])
        return rev

    # -- the change log: which documents each write touched (search/keyword_sync.py reads it) -------
    def log_change(self, collection: str, documents: Iterable[str]) -> str:
        """Record that a write is about to change `documents`; returns the revision token the write must bump
        to (`bump_revision(collection, rev)`). Written before the write's first step, so every manifest
        change is named by a record older than the revision that publishes it."""
        rev = uuid.uuid4().hex
        key, record = self._append_change(collection, {"revision": rev, "documents": sorted(set(documents))})
        logged = self.__dict__.setdefault("_logged_changes", {})
        if len(logged) >= MAX_UNFINISHED_CHANGES:  # writes that raised before their bump: never marked done
            logged.clear()
        logged[rev] = (collection, key, record)
        return rev

    def _done_mark(self, rev: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """{key: (record, metadata)} of the change record announcing `rev` marked done (`"done": true`; empty if
        this Store did not log it), written with the revision bump: its write has flipped its manifests. Why: a
        catch-up may read a record before its write flips (a server has no read gate); it remembers as applied
        only records marked done when read (search/keyword_sync.py), so a record read mid-write is read again.
        A writer killed before its bump, or of an older version, leaves the record unmarked: it is then read
        again by every catch-up of the skew window, as before."""
        entry = self.__dict__.get("_logged_changes", {}).pop(rev, None)
        if entry is None:
            return {}
        collection, key, record = entry
        return {key: ({**record, "done": True}, {"record": CHANGE, "collection": collection, "at": record["at"]})}

    def log_reset(self, collection: str) -> str:
        """Record a change the log cannot name document by document (`kb reindex`'s swap, a restored reindex
        backup: the collection is another Chroma collection; `bump_revision` without a token); returns the
        revision token it announces.

        Why a record at all: a revision no record announces made every reader do a full manifest diff, and
        after its next write a second one (the index's own revision was not in the log either): ~0.7 s per
        100k documents each, ~7 s at 1M. The reset record is read as "compare every manifest once", after
        which the log carries on. Its token is under "reset", not "revision": a reader of the previous version
        then finds the revision unannounced and does the full diff it always did, where an empty "documents"
        under "revision" would have told it that nothing changed."""
        rev = uuid.uuid4().hex
        self._append_change(collection, {"reset": rev, "documents": []})
        return rev

    def _append_change(self, collection: str, record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Write one change record stamped now, and prune records older than CHANGE_LOG_SECONDS (`at` is a
        number so Chroma's `where` can compare it); returns its key and the record."""
        at = time.time_ns()
        record = {**record, "at": at}
        key = change_key(collection, at)
        self.meta.upsert(ids=[key], embeddings=[[1.0]], documents=[json.dumps(record)],
                         metadatas=[{"record": CHANGE, "collection": collection, "at": at}])
        cutoff = at - CHANGE_LOG_SECONDS * 1_000_000_000
        # Every collection's expired records at once: a filter on `collection` made Chroma scan that collection's
        # manifests too (~0.4 s per write at 100k documents); record + time alone touches only change records.
        self.meta.delete(where={"$and": [{"record": CHANGE}, {"at": {"$lt": cutoff}}]})
        return key, record

    def changes_since(self, collection: str, after_ns: int) -> list[dict[str, Any]]:
        """The change records of `collection` stamped after `after_ns`, oldest first."""
        # Selected by record and time only, the collection kept by its key: filtering on `collection` in Chroma
        # scanned every manifest of the collection (0.415 s of a 0.54 s catch-up at 100k documents, 0.017 s now).
        where = {"$and": [{"record": CHANGE}, {"at": {"$gt": int(after_ns)}}]}
        prefix = f"{CHANGE}:{collection}:"  # names cannot hold ':' (validate_name), so the prefix is exact
        return sorted(self._scan(where, prefix).values(), key=lambda r: r["at"])


def announced(record: dict[str, Any]) -> str | None:
    """The revision a change record announces: a write's ("revision") or a reset's ("reset", `log_reset`)."""
    return record.get("revision") or record.get("reset")


def finished(record: dict[str, Any]) -> bool:
    """Whether the change a record names is in the store: a write's record once marked done (`_done_mark`,
    after its flip and bump); a reset's always (`bump_revision` logs it after the change it announces)."""
    return bool(record.get("done") or record.get("reset"))


__all__ = [
    "CHANGE", "CHANGE_LOG_SECONDS", "DOCUMENT", "HISTORY", "INTENT", "META_COLLECTION", "PROJECT", "RESERVED_PREFIX",
    "REVISION", "RegistryMixin",
    "announced", "change_key", "decode_record", "document_key", "finished", "history_key", "intent_key",
    "parse_intent", "project_key", "revision_key", "valid_date",
]
