"""The crash-safe write protocol: intents, new versions in before manifests flip, recovery of dead writers.

Every write to a collection, under the store's write lock:
  0. record an intent (`intent:{collection}:{uuid}`) naming the old and the new version of each document;
  1. upsert the new chunks (invisible: no manifest names their content hash yet);
  2. log the change (`change:{collection}:{time}`: the documents it touches and the revision it will bump to,
     read by the keyword index's catch-up, search/keyword_sync.py), then flip the manifests (each document
     switches to its new version at once; a delete logs first and removes them);
  3. delete the old version's chunks; 4. bump the collection's revision; 5. clear the intent.
A kill between any two steps leaves an intent, and the next writer (or `doctor --repair`) deletes whichever
version no manifest points at (`recover_interrupted`), logs the intent's documents as a change and bumps the
revision, so readers see exactly one version at every moment (tests/test_crash_harness.py kills at each of 33
steps) and derived indexes see every flip. The bump comes before the intent is cleared: killed between the
two the other way round, a flipped manifest was never announced by a revision (the keyword index kept the
old text until the next write).

On a Chroma server a write gives up (StoreUnavailableError, nothing written) while another process holds the
collection's reindex lease (storage/leases.py), checked right after step 0. An intent records its writer's host,
pid namespace and pid, so a process on the same machine recovers a dead writer's intent at once instead of
after STALE_INTENT_SECONDS; `doctor --repair` announces the others (`announce_intents`).

The steps are called through `Steps`: ingest/service.py passes its own module globals, because the crash
tests (tests/test_concurrency.py FAKE_CLI, RA_TEST_KILL_AT) replace a step by its name on that module.
What a write contains (chunks, vectors, manifests) is the caller's; this module owns only the order.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from research_agent.storage.leases import check_no_reindex, holder, stale_intents
from research_agent.storage.registry import DOCUMENT, INTENT, document_key, intent_key, version_ids

if TYPE_CHECKING:
    from research_agent.storage.store import Store

log = logging.getLogger(__name__)

# Chroma takes at most ~5,461 records per call (its SQLite variable limit); 1,000 keeps every call small.
WRITE_BATCH = 1000
# In server mode writers from other machines run at the same time as this one, so each write keeps
# its own intent, and only an intent older than this is taken for a crashed writer's.
STALE_INTENT_SECONDS = 600.0


def write_intent(store: Store, collection: str, versions: list[dict[str, Any]]) -> str:
    key = intent_key(collection)
    # The writer's host and pid let a process on the same machine tell a dead writer's intent at once (holder_gone).
    store.registry_put({key: {"versions": versions, "created": time.time(), **holder()}}, INTENT, collection)
    return key


def hold_off_for_reindex(store: Store, col: Any, collection: str, intent: str, steps: Steps) -> Any:
    """Server mode: give up a write (its intent cleared, nothing else done yet) while another process
    reindexes `collection` (storage/leases.py ReindexLease); else the collection to write, looked up again.

    Checked after the intent is recorded: the reindex records its lease, then waits for intents, so one of the
    two always sees the other. Looked up after the intent too: a writer that found the collection before a
    reindex renamed it (one that ignores the lease, or paused) wrote into the backup the reindex then
    dropped, after the reindex's last wait for intents: its removal left chunks no manifest names. Found
    after the intent, the collection is either the old one, and the reindex waits for this write and
    catches up with it (swaps.settle), or the new one."""
    if not store.settings.server_mode:
        return col  # embedded: the store's file write lock already keeps a reindex and writers apart
    try:
        check_no_reindex(store, collection)
        return store.get_collection(collection)
    except BaseException:  # any failure (a refusal, a store error, the collection gone, Ctrl-C): the intent goes too
        steps.clear_intent(store, intent)
        raise


def clear_intent(store: Store, key: str) -> None:
    store.registry_delete([key])


def ensure_dimension(col: Any, dimension: int) -> None:
    meta = dict(col.metadata or {})
    if meta.get("embedding_dimension") != dimension:
        meta["embedding_dimension"] = dimension
        col.modify(metadata={k: v for k, v in meta.items() if not k.startswith("hnsw:")})


def delete_chunks(col: Any, ids: list[str]) -> None:
    for start in range(0, len(ids), WRITE_BATCH):
        col.delete(ids=ids[start:start + WRITE_BATCH])


@dataclass(frozen=True)
class Steps:
    """The protocol's write steps; the defaults are this module's."""

    write_intent: Callable[[Store, str, list[dict[str, Any]]], str] = write_intent
    clear_intent: Callable[[Store, str], None] = clear_intent
    ensure_dimension: Callable[[Any, int], None] = ensure_dimension
    delete_chunks: Callable[[Any, list[str]], None] = delete_chunks


@dataclass
class Versions:
    """The new versions one write commits: their chunks (ids, vectors, texts, metadata, in order) and, per
    manifest key, the manifest without its timestamps (commit stamps `updated_at` and keeps `added_at`)."""

    ids: list[str] = field(default_factory=list)
    vectors: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    metas: list[dict[str, Any]] = field(default_factory=list)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)


def commit(store: Store, col: Any, collection: str, new: Versions, *, dimension: int, now: Callable[[], str],
           steps: Steps = Steps()) -> None:
    """Steps 0-5 of the protocol (the caller holds the write lock and has recovered dead writers first)."""
    old = store.registry_get(list(new.manifests))
    stale = {key: old[key] for key, m in new.manifests.items()
             if key in old and old[key]["content_hash"] != m["content_hash"]}
    # The intent names both versions, so a crash at any step below is undone by the next writer.
    intent = steps.write_intent(store, collection, [*stale.values(), *(
        {"document": m["document"], "content_hash": m["content_hash"], "chunk_count": m["chunk_count"]}
        for m in new.manifests.values())])
    col = hold_off_for_reindex(store, col, collection, intent, steps)
    for start in range(0, len(new.ids), WRITE_BATCH):
        end = start + WRITE_BATCH
        col.upsert(ids=new.ids[start:end], embeddings=new.vectors[start:end], documents=new.texts[start:end],
                   metadatas=new.metas[start:end])
    steps.ensure_dimension(col, dimension)
    stamp = now()
    # Logged right before the flip (not at the start): a reader's catch-up re-reads records of the last
    # SKEW margin, so the log entry and the flip it announces must be close in time; a kill before this
    # point changed nothing a reader sees.
    rev = store.log_change(collection, (m["document"] for m in new.manifests.values()))
    store.registry_put({key: _stamped(m, old.get(key, {}), stamp) for key, m in new.manifests.items()},
                       DOCUMENT, collection)
    steps.delete_chunks(col, version_ids(collection, stale.values()))
    store.bump_revision(collection, rev)
    steps.clear_intent(store, intent)


def _stamped(manifest: dict[str, Any], old: dict[str, Any], stamp: str) -> dict[str, Any]:
    """The manifest as stored: fields in the order stores have always had them, `added_at` kept from the old."""
    head = {k: v for k, v in manifest.items() if k not in ("collection", "extra")}
    return {**head, "updated_at": stamp, "collection": manifest["collection"],
            "added_at": old.get("added_at", stamp), "extra": manifest.get("extra")}


def delete(store: Store, col: Any, collection: str, manifests: dict[str, dict[str, Any]], *,
           steps: Steps = Steps()) -> int:
    """Remove documents (under the write lock): manifests first (invisible at once), then their chunks."""
    versions = list(manifests.values())
    rev = store.log_change(collection, (v["document"] for v in versions))
    intent = steps.write_intent(store, collection, versions)
    col = hold_off_for_reindex(store, col, collection, intent, steps)
    store.registry_delete(list(manifests))
    ids = version_ids(collection, versions)
    steps.delete_chunks(col, ids)
    store.bump_revision(collection, rev)
    steps.clear_intent(store, intent)
    return len(ids)


def recover_interrupted(store: Store, collection: str, col: Any, *, min_age: float,
                        steps: Steps = Steps()) -> int:
    """Undo writes that were killed midway (under the write lock): drop chunks no manifest points at.

    Embedded stores serialize writers, so every intent found is a dead writer's (min_age 0); on a Chroma
    server only intents older than `min_age` (STALE_INTENT_SECONDS) are, or those of a writer on this host
    whose process is gone, or those dated more than CLOCK_SKEW_SECONDS ahead (`intent_stale`: a day-ahead
    intent of a machine with a wrong clock never turned old). The dead writer may have flipped
    manifests without bumping the revision, so each recovered intent's documents are logged as a change and
    the revision is bumped: the keyword index re-applies them (idempotent) instead of serving the old text.
    """
    intents = stale_intents(store, collection, min_age)  # those it cannot act on: removed (never undone) on the way
    removed = 0
    for key, intent in intents.items():
        versions = intent["versions"]
        current = {m["document"]: m["content_hash"] for m in store.registry_get(
            list(dict.fromkeys(document_key(collection, v["document"]) for v in versions))).values()}
        orphans = [v for v in versions if current.get(v["document"]) != v["content_hash"]]
        ids = version_ids(collection, orphans)
        rev = store.log_change(collection, (v["document"] for v in versions))
        steps.delete_chunks(col, ids)
        store.bump_revision(collection, rev)
        steps.clear_intent(store, key)
        removed += len(ids)
        log.warning("recovered an interrupted write to %s: removed %d orphan chunks", collection, len(ids))
    return removed


def announce_intents(store: Store, collection: str) -> int:
    """Announce the documents of every intent left after recovery (server mode: young writes, alive or dead on
    another host) as a change, and bump the revision; returns how many. Deletes and clears nothing.

    Trigger: `doctor --repair` on a Chroma server. Why: a writer killed between its flip and its bump left the
    flip unannounced, and other servers' keyword indexes served the old text until the intent turned 600 s
    old (STALE_INTENT_SECONDS) or another write came. Outcome: readers catch up with the manifests as they
    are now; for a live writer this is harmless (a catch-up re-reading a document it has not flipped yet
    finds nothing new, and the writer announces its own flip), whereas deleting its chunks would not be.
    """
    intents = store.registry_find(INTENT, collection)
    for intent in intents.values():
        rev = store.log_change(collection, (v["document"] for v in intent["versions"]))
        store.bump_revision(collection, rev)
    if intents:
        log.warning("announced %d unfinished writes to %s", len(intents), collection)
    return len(intents)
