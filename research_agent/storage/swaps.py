"""Reindex swaps: `kb reindex` fills a working copy, then renames it over the live collection.

The names say whose collections they are, so a crash at any step is recovered from the names alone
(docs/architecture.md, "Reindex swap"). `SwapMixin` is the part of `Store` that runs and recovers swaps; it
calls the Store's collection methods (`_get_raw`, `rename_collection`, `delete_collection`), its write lock
and read gate (`write_lock`, `admit_readers`, `exclude_readers`) and `bump_revision`.

On a Chroma server the write lock is per process, so a reindex also holds a lease (storage/leases.py) and
catches up with whatever was written anyway before and after the renames (`catch_up`, `settle`): no document
keeps a manifest without chunks; a recovery never touches the swap of another machine's live reindex.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable

from research_agent.errors import CollectionError, StoreUnavailableError
from research_agent.storage.leases import ReindexLease, reindexed_elsewhere
from research_agent.storage.registry import DOCUMENT, RESERVED_PREFIX, version_ids
from research_agent.storage.writer import delete_chunks

log = logging.getLogger(__name__)

# `kb reindex` fills `research-agent-tmp-<8 hex>-<name>`, then renames the live collection to
# `research-agent-old-<8 hex>-<name>` and the copy to `<name>`: the names say whose they are, so a crash at
# any step is recovered from the names alone (28 characters of prefix: names over 484 cannot be reindexed).
TMP_PREFIX = RESERVED_PREFIX + "tmp-"
BACKUP_PREFIX = RESERVED_PREFIX + "old-"
SWAP_PREFIX_CHARS = len(BACKUP_PREFIX) + 9


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


# -- the catch-up: what other processes wrote while a reindex copied ---------------------------------------
#: Rounds of catch-up before a reindex gives up (writers that ignore the lease and never pause).
CATCH_UP_ROUNDS = 20


def catch_up(store: Any, collection: str, copied: dict[str, dict[str, Any]], target: Any,
             copy: Callable[[dict[str, Any]], int]) -> int:
    """Make `target` hold the chunks of the manifests as they are now; returns the documents recopied.

    Trigger: a server-mode writer (other process, other machine) wrote the collection while the reindex copied
    it. Why: the swap drops the old collection, so a document flipped meanwhile kept its manifest and lost its
    chunks (23 of 2,000 documents in the attack run). Outcome: documents whose manifest changed since they were
    copied (`copied`: key -> manifest copied, updated in place) are copied again by `copy`, removed ones are
    deleted from `target`; repeated until a round finds nothing new (at most CATCH_UP_ROUNDS).
    """
    recopied = 0
    for _ in range(CATCH_UP_ROUNDS):
        now = store.registry_find(DOCUMENT, collection)
        changed = {k: m for k, m in now.items() if copied.get(k, {}).get("content_hash") != m["content_hash"]}
        gone = [k for k in copied if k not in now]
        if not changed and not gone:
            return recopied
        stale = [copied[k] for k in [*gone, *changed] if k in copied]
        delete_chunks(target, version_ids(collection, stale))
        for k in gone:
            del copied[k]
        for k, m in changed.items():
            copy(m)
            copied[k] = m
        recopied += len(changed) + len(gone)
        log.info("reindex of %s caught up with %d changed, %d removed documents", collection, len(changed),
                 len(gone))
    raise _kept_changing(collection)


def settle(store: Any, collection: str, copied: dict[str, dict[str, Any]], target: Any,
           copy: Callable[[dict[str, Any]], int], lease: ReindexLease) -> None:
    """The last catch-up, after the renames and before the backup is dropped: catch up, wait for a moment with
    no write under way (a writer looks the collection up after recording its intent, writer.hold_off_for_reindex:
    one that found the backup has recorded its intent by then, or it finds the new collection), then catch up
    with what those writes flipped."""
    catch_up(store, collection, copied, target, copy)
    lease.drain()
    catch_up(store, collection, copied, target, copy)


def _kept_changing(collection: str) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"Collection {collection!r} kept changing during its reindex ({CATCH_UP_ROUNDS} rounds of catch-up)",
        guidance="Stop the other writers of this collection (they ignore the reindex lease: an older version?) "
                 "and run the reindex again; the collection is unchanged.")


class SwapMixin:
    """The reindex half of `Store`: the working copy, the swap, and recovery after a kill."""

    def create_swap_copy(self, collection: str, metadata: dict[str, Any]) -> Any:
        """An empty working collection for the re-embedded copy of `collection` (under the write lock).

        Readers are let in while the copy fills (nothing they read changes until `swap_in`): see `admit_readers`.
        """
        copy = self.client.create_collection(swap_name(TMP_PREFIX, collection),
                                             metadata={"hnsw:space": "cosine", **metadata}, embedding_function=None)
        self.admit_readers()
        return copy

    def swap_in(self, old: Any, new: Any, collection: str, settle: Callable[[], None] | None = None) -> None:
        """Give `new` the name of `old` (under the write lock); a crash between steps is undone by `recover_swaps`.

        1. old -> backup name; 2. new -> the collection's name; 3. `settle()` (the server-mode catch-up: a
        writer that resolved the collection before step 1 still writes into the backup); 4. the backup is
        dropped. Killed after 1, the collection exists only as its backup, which the next open restores.
        """
        backup = swap_name(BACKUP_PREFIX, collection)
        self.exclude_readers()  # a reader never meets the collection missing or half swapped
        self.rename_collection(old, backup)
        self.rename_collection(new, collection)
        if settle is not None:
            settle()
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
        if self.settings.server_mode and reindexed_elsewhere(self, target):
            return []  # another machine's live reindex, between its renames or settling: its backup, not a leftover
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


__all__ = ["BACKUP_PREFIX", "SWAP_PREFIX_CHARS", "TMP_PREFIX", "SwapMixin", "catch_up", "is_swap_leftover", "settle",
           "swap_name", "swap_target"]
