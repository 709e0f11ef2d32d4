"""Reindex swaps: `kb reindex` fills a working copy, then renames it over the live collection.

The names say whose collections they are, so a crash at any step is recovered from the names alone
(docs/architecture.md, "Reindex swap"). `SwapMixin` is the part of `Store` that runs and recovers swaps; it
calls the Store's collection methods (`_get_raw`, `rename_collection`, `delete_collection`), its write lock
and read gate (`write_lock`, `admit_readers`, `exclude_readers`) and `bump_revision`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from research_agent.errors import CollectionError
from research_agent.storage.registry import RESERVED_PREFIX

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


__all__ = ["BACKUP_PREFIX", "SWAP_PREFIX_CHARS", "TMP_PREFIX", "SwapMixin", "is_swap_leftover", "swap_name",
           "swap_target"]
