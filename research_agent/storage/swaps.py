"""Reindex swaps: `kb reindex` fills a working copy, then renames it over the live collection.

The names say whose collections they are, so a crash at any step is recovered from the names alone
(docs/architecture.md, "Reindex swap"). `SwapMixin` is the part of `Store` that runs and recovers swaps; it
calls the Store's collection methods (`_get_raw`, `rename_collection`, `delete_collection`), its write lock
and read gate (`write_lock`, `admit_readers`, `exclude_readers`) and `bump_revision`.

On a Chroma server the write lock is per process, so a reindex also holds a lease (a registry record that
server-mode writers check after recording their intent, `check_no_reindex`) and catches up with whatever was
written anyway before and after the renames (`catch_up`, `settle`): no document keeps a manifest without chunks.

Dates written by other machines (their clocks may run ahead or behind ours by up to CLOCK_SKEW_SECONDS, 300 s):
  - a lease counts only while `now - renewed` is within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS] (`lease_live`): a
    lease renewed "an hour from now" is a broken clock's and blocks nothing (it refused every write for the hour);
  - an intent is a dead writer's when older than the caller's min_age, when its writer is known gone from this
    machine, or when it is dated more than CLOCK_SKEW_SECONDS ahead (`intent_stale`): recover_interrupted undoes
    it and the drain does not wait for it (a day-ahead intent made each reindex wait 2 x 60 s).
Taking the lease: each reindex writes a claim of its own (`lease:claim:<collection>:<token>`), waits
LEASE_SETTLE_SECONDS, then reads the claims and the lease back. It loses (the coded "already being reindexed"
error, its claim withdrawn) when another live claim or a live lease with another token exists; the winner writes
the lease with its token, then drops its claim. Never two winners, whatever the clocks (`_rival`); two reindexes
started within the settle both lose. A reindex leaving deletes the lease only while it still holds its token.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any, Callable

from research_agent.errors import CollectionError, StoreUnavailableError
from research_agent.storage.registry import DOCUMENT, INTENT, RESERVED_PREFIX, version_ids

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


# -- who holds a record: a writer's intent or a reindex's lease ------------------------------------------------
def holder() -> dict[str, Any]:
    """This process, as written into the records it may die holding (intents, the reindex lease)."""
    return {"host": socket.gethostname(), "pidns": _pid_namespace(), "pid": os.getpid()}


def _pid_namespace() -> str | None:
    """Linux: this process's pid namespace; two containers sharing a host name do not share pids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def holder_gone(record: dict[str, Any]) -> bool:
    """True when the record's holder ran on this host and its process no longer exists.

    Why: on a Chroma server an intent younger than STALE_INTENT_SECONDS (600 s) was taken for a live writer's,
    so a writer killed on this very machine stayed unrecovered (and its flip unannounced) for 10 minutes. A
    holder on another host or in another pid namespace (container), or a record of an older version (no pid),
    is never called gone here.
    """
    pid = record.get("pid")
    if (record.get("host"), record.get("pidns")) != (socket.gethostname(), _pid_namespace()):
        return False
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists under another user
        return False
    return False


# -- the reindex lease: server-mode writers of other processes hold off while a reindex copies -----------------
LEASE = "lease"
#: A lease not renewed for this long is a dead reindex's (it renews every LEASE_RENEW_SECONDS while copying);
#: writers then stop waiting for it. 120 s is 12 missed renewals: a busy machine does not lose its lease.
LEASE_SECONDS = 120.0
LEASE_RENEW_SECONDS = 10.0
#: How far another machine's clock may be ahead of ours and its dates still be believed: the keyword index's
#: skew window on servers (search/keyword_sync.py SKEW_SECONDS, 5 minutes; storage may not import search).
CLOCK_SKEW_SECONDS = 300.0
#: How long a reindex waits between writing its claim and reading the claims back, so that a rival's claim
#: written meanwhile is seen (a registry write takes ~10 ms on a local server; 1 s leaves room for a slow one).
#: Every server-mode reindex pays it once.
LEASE_SETTLE_SECONDS = 1.0
#: How long a reindex waits, after taking its lease, for writes already under way (their intents) to finish.
#: Past it the reindex goes on: its catch-up copies whatever they flip (a dead writer's intent never clears).
LEASE_DRAIN_SECONDS = 60.0
LEASE_POLL_SECONDS = 0.2


def lease_key(collection: str) -> str:
    return f"{LEASE}:reindex:{collection}"


def _claim_prefix(collection: str) -> str:
    return f"{LEASE}:claim:{collection}:"


def lease_live(record: dict[str, Any], now: float | None = None) -> bool:
    """A lease or claim counts while renewed within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS] of now and its holder
    is not known gone (module docstring: a date further ahead is a broken clock's and never honoured)."""
    age = (time.time() if now is None else now) - float(record.get("renewed", 0))
    return -CLOCK_SKEW_SECONDS <= age <= LEASE_SECONDS and not holder_gone(record)


def intent_stale(record: dict[str, Any], min_age: float, now: float | None = None) -> bool:
    """A dead writer's intent: at least `min_age` old (0: every intent, the embedded rule), its writer known gone
    from this machine, or dated more than CLOCK_SKEW_SECONDS ahead (it would otherwise never turn old)."""
    age = (time.time() if now is None else now) - float(record.get("created", 0))
    return min_age <= 0 or age >= min_age or age < -CLOCK_SKEW_SECONDS or holder_gone(record)


def reindex_lease(store: Any, collection: str) -> dict[str, Any] | None:
    """The live reindex lease of `collection` (None when there is none, or it is dead or absurdly dated)."""
    lease = store.registry_get([lease_key(collection)]).get(lease_key(collection))
    return lease if lease is not None and lease_live(lease) else None


def check_no_reindex(store: Any, collection: str) -> None:
    """Refuse a server-mode write while another process reindexes `collection` (called after the write's
    intent is recorded, so the reindex sees the intent or the writer sees the lease: never neither)."""
    lease = reindex_lease(store, collection)
    if lease is None or (lease.get("host"), lease.get("pid")) == (socket.gethostname(), os.getpid()):
        return
    started = time.strftime("%H:%M:%S", time.localtime(float(lease.get("started", 0))))
    raise StoreUnavailableError(
        f"Collection {collection!r} is being reindexed (since {started}, by process {lease.get('pid')} on "
        f"{lease.get('host')}); nothing was written",
        guidance=f"Try again when `research-agent kb reindex --collection {collection}` finishes; a reindex that "
                 f"died stops blocking writes {int(LEASE_SECONDS)} s after its last sign of life.")


def _already_reindexed(collection: str, other: dict[str, Any]) -> StoreUnavailableError:
    return StoreUnavailableError(f"Collection {collection!r} is already being reindexed by process "
                                 f"{other.get('pid')} on {other.get('host')}",
                                 guidance="Wait for that reindex to finish; one reindex at a time (two started "
                                          "within a second both stop: run it again).")


class ReindexLease:
    """The lease a server-mode reindex holds on its collection (a registry record other writers check), taken
    by a claim, a settle and a read-back (module docstring), and released only while it holds our token."""

    def __init__(self, store: Any, collection: str, *, stale_intent_seconds: float) -> None:
        self.store, self.collection, self.key = store, collection, lease_key(collection)
        self.stale_intent_seconds = stale_intent_seconds  # intents older than this are dead writers'
        self.started = self.renewed = time.time()
        self.token = uuid.uuid4().hex
        self.claim = _claim_prefix(collection) + self.token

    def __enter__(self) -> ReindexLease:
        self._take()
        self.drain()
        return self

    def __exit__(self, *exc: Any) -> None:
        current = self.store.registry_get([self.key]).get(self.key)
        self.store.registry_delete([self.claim, *([self.key] if self._ours(current) else [])])

    def _ours(self, lease: dict[str, Any] | None) -> bool:
        return lease is not None and lease.get("token") == self.token

    def _record(self) -> dict[str, Any]:
        return {"started": self.started, "renewed": self.renewed, "token": self.token, **holder()}

    def _take(self) -> None:
        """Claim, settle, read back: raises the coded error (our claim withdrawn) when another reindex wins."""
        other = reindex_lease(self.store, self.collection)
        if other is not None:
            raise _already_reindexed(self.collection, other)
        self.renewed = time.time()
        self.store.registry_put({self.claim: self._record()}, LEASE, self.collection)
        time.sleep(LEASE_SETTLE_SECONDS)
        rival = self._rival()
        if rival is not None:
            self.store.registry_delete([self.claim])
            raise _already_reindexed(self.collection, rival)
        self._put()
        self.store.registry_delete([self.claim])  # only now: a rival reads claims first, then the lease

    def _rival(self) -> dict[str, Any] | None:
        """Another reindex's live claim, else a live lease with another token (None: we won).

        Why any claim loses, not the earliest: claim times come from different clocks. Each reindex writes its
        claim before reading, so if two both read nothing of the other, each claim came after the other's read:
        impossible. Two claims within the settle both lose (run it again). Claims are read before the lease: the
        winner deletes its claim only after writing the lease, so a rival sees one or the other."""
        claims = [v for k, v in self.store.registry_find(LEASE, self.collection).items()
                  if k.startswith(_claim_prefix(self.collection)) and k != self.claim and lease_live(v)]
        if claims:
            return claims[0]
        lease = reindex_lease(self.store, self.collection)
        return lease if lease is not None and not self._ours(lease) else None

    def _put(self) -> None:
        self.renewed = time.time()
        self.store.registry_put({self.key: self._record()}, LEASE, self.collection)

    def renew(self) -> None:
        """Every LEASE_RENEW_SECONDS: renewed, unless another reindex holds the lease now (this one went
        unrenewed past LEASE_SECONDS): then the coded error, before this copy is swapped in over theirs."""
        if time.time() - self.renewed < LEASE_RENEW_SECONDS:
            return
        current = reindex_lease(self.store, self.collection)
        if current is not None and not self._ours(current):
            raise _already_reindexed(self.collection, current)
        self._put()

    def drain(self) -> bool:
        """Wait (at most LEASE_DRAIN_SECONDS) for writes under way to clear their intents; False on timeout.

        Taken with the lease: writes that began before it. Before the backup is dropped: a writer that
        resolved the collection before the renames writes into the backup, and its flip must be seen first.
        Logged at INFO: nothing is lost (the catch-up copies what they flip), so a CLI user sees it at -v only.
        """
        deadline = time.monotonic() + LEASE_DRAIN_SECONDS
        while time.monotonic() < deadline:
            live = [k for k, v in self.store.registry_find(INTENT, self.collection).items()
                    if not intent_stale(v, self.stale_intent_seconds)]
            if not live:
                return True
            time.sleep(LEASE_POLL_SECONDS)
        log.info("reindex of %s: writes still under way after %.0f s; the catch-up copies what they flip",
                 self.collection, LEASE_DRAIN_SECONDS)
        return False


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
        for start in range(0, len(stale), 100):
            target.delete(ids=version_ids(collection, stale[start:start + 100]))
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
    no write under way (a writer that resolved the collection before the renames writes into the backup and
    has recorded its intent by then, or it resolves the new one), then catch up with what those writes flipped.
    Left open: a writer that resolved the collection before the renames but records its intent only after
    that moment (milliseconds; a writer honouring the lease gives up instead)."""
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


__all__ = ["BACKUP_PREFIX", "CLOCK_SKEW_SECONDS", "LEASE", "SWAP_PREFIX_CHARS", "TMP_PREFIX", "ReindexLease",
           "SwapMixin", "catch_up", "check_no_reindex", "holder", "holder_gone", "intent_stale", "is_swap_leftover",
           "lease_key", "lease_live", "reindex_lease", "settle", "swap_name", "swap_target"]
