"""Server-mode coordination records: who holds a record (a writer's intent, a reindex's lease) and the reindex lease.

On a Chroma server the store's write lock is per process, so a reindex also holds a lease (a registry record that
server-mode writers check after recording their intent, `check_no_reindex`); storage/swaps.py catches up with
whatever was written anyway before and after its renames.

Dates written by other machines (their clocks may run ahead or behind ours by up to CLOCK_SKEW_SECONDS, 300 s):
  - a lease counts only while `now - renewed` is within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS] (`lease_live`): a
    lease renewed "an hour from now" is a broken clock's and blocks nothing (it refused every write for the hour);
  - an intent is a dead writer's when older than the caller's min_age, when its writer is known gone from this
    machine, or when it is dated more than CLOCK_SKEW_SECONDS ahead (`intent_stale`): recover_interrupted undoes
    it and the drain does not wait for it (a day-ahead intent made each reindex wait 2 x 60 s).
Taking the lease: each reindex writes a claim of its own (`lease:claim:<collection>:<token>`), waits
LEASE_SETTLE_SECONDS, then reads the claims and the lease back. It loses (the coded "already being reindexed"
error, its claim withdrawn) when another live claim or a live lease with another token exists; the winner writes
the lease with its token, then drops its claim. Never two winners, whatever the clocks (`_rivals`); two reindexes
started within the settle both lose. A reindex leaving deletes the lease only while it still holds its token.
A claim left by a reindex that died mid-election blocks the others until it turns LEASE_SECONDS old (counted from
its own date: longer when it is dated ahead of our clock, `blocking_seconds`); the refusal says how long, doctor
lists it. Dead claims are removed by the next election that reads them and by `doctor --repair`, but only when no
machine may still count them live (`claim_removable`: another machine's election may honour a claim our clock
calls dead, and removing it there could let two reindexes win); a lease is never removed but by its holder (its
key is reused: a delete after a read could remove a newer live one).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

from research_agent.errors import StoreUnavailableError
from research_agent.storage.registry import INTENT

log = logging.getLogger(__name__)


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


def blocking_seconds(record: dict[str, Any], now: float | None = None) -> float:
    """How long a lease or claim still blocks if never renewed again (0: it blocks nothing): until now - renewed
    passes LEASE_SECONDS, so LEASE_SECONDS + its lead for a record dated ahead of our clock (within the skew)."""
    now = time.time() if now is None else now
    return max(0.0, LEASE_SECONDS - (now - float(record.get("renewed", 0)))) if lease_live(record, now) else 0.0


def claim_removable(record: dict[str, Any], now: float | None = None) -> bool:
    """A claim no election can count live any more: its holder is known gone from this machine, or it is dead
    to every clock within CLOCK_SKEW_SECONDS of ours (older than LEASE_SECONDS + skew, or dated more than twice
    the skew ahead). Why not merely dead to our clock: a machine whose clock is behind ours still honours it,
    and a claim removed under a rival's read lets that rival win beside the claim's holder."""
    age = (time.time() if now is None else now) - float(record.get("renewed", 0))
    return age > LEASE_SECONDS + CLOCK_SKEW_SECONDS or age < -2 * CLOCK_SKEW_SECONDS or holder_gone(record)


def claim_collection(key: str) -> str | None:
    """The collection of a claim's registry key (None for other keys); tokens hold no colon."""
    prefix = f"{LEASE}:claim:"
    return key[len(prefix):].rsplit(":", 1)[0] if key.startswith(prefix) and key.count(":") >= 3 else None


def remove_dead_claims(store: Any, claims: dict[str, dict[str, Any]]) -> list[str]:
    """Delete those of `claims` (key -> record as read) that are removable; returns their keys. A claim is written
    once under its own token and never renewed, so the record as read is the record as it is (or it is gone)."""
    now = time.time()
    dead = sorted(k for k, v in claims.items() if claim_collection(k) is not None and claim_removable(v, now))
    store.registry_delete(dead)
    return dead


def record_timing(record: dict[str, Any], now: float | None = None) -> tuple[int, int]:
    """A lease's or claim's (age, wait): seconds since its last renewal by our clock (negative: dated ahead of
    it), and seconds it still blocks if never renewed again, rounded up (never quoted shorter than it is)."""
    now = time.time() if now is None else now
    return int(now - float(record.get("renewed", 0))), int(-(-blocking_seconds(record, now) // 1))


def age_words(age: int) -> str:
    """An age from `record_timing` in words."""
    return f"{age} s ago" if age >= 0 else f"at a time {-age} s ahead of this clock"


def intent_stale(record: dict[str, Any], min_age: float, now: float | None = None) -> bool:
    """A dead writer's intent: at least `min_age` old (0: every intent, the embedded rule), its writer known gone
    from this machine, or dated more than CLOCK_SKEW_SECONDS ahead (it would otherwise never turn old)."""
    age = (time.time() if now is None else now) - float(record.get("created", 0))
    return min_age <= 0 or age >= min_age or age < -CLOCK_SKEW_SECONDS or holder_gone(record)


def reindex_lease(store: Any, collection: str) -> dict[str, Any] | None:
    """The live reindex lease of `collection` (None when there is none, or it is dead or absurdly dated)."""
    lease = store.registry_get([lease_key(collection)]).get(lease_key(collection))
    return lease if lease is not None and lease_live(lease) else None


def reindexed_elsewhere(store: Any, collection: str) -> bool:
    """Whether another process holds a live reindex lease on `collection` (this process's own does not count)."""
    lease = reindex_lease(store, collection)
    return lease is not None and _elsewhere(lease)


def _elsewhere(record: dict[str, Any]) -> bool:
    return (record.get("host"), record.get("pid")) != (socket.gethostname(), os.getpid())


def check_no_reindex(store: Any, collection: str) -> None:
    """Refuse a server-mode write while another process reindexes `collection` (called after the write's
    intent is recorded, so the reindex sees the intent or the writer sees the lease: never neither)."""
    lease = reindex_lease(store, collection)
    if lease is None or not _elsewhere(lease):
        return
    started = time.strftime("%H:%M:%S", time.localtime(float(lease.get("started", 0))))
    _, wait = record_timing(lease)
    raise StoreUnavailableError(
        f"Collection {collection!r} is being reindexed (since {started}, by process {lease.get('pid')} on "
        f"{lease.get('host')}); nothing was written",
        guidance=f"Try again when `research-agent kb reindex --collection {collection}` finishes; a reindex that "
                 f"died stops blocking writes {int(LEASE_SECONDS)} s after its last sign of life (this one: in "
                 f"{wait} s unless it renews its lease).", retry_after_seconds=wait)


def _already_reindexed(collection: str, others: list[dict[str, Any]], *, claim: bool) -> StoreUnavailableError:
    """The refusal of a reindex: another holds the lease, or claims it (`claim`); it says when a retry can
    succeed: at once when the other withdraws, else when the longest-blocking of `others` runs out."""
    other = max(others, key=blocking_seconds)
    age, wait = record_timing(other)
    who, when = f"process {other.get('pid')} on {other.get('host')}", age_words(age)
    if claim:
        return StoreUnavailableError(
            f"Collection {collection!r} is already being reindexed: {who} claimed its lease ({when})",
            guidance="Run it again in a few seconds: a reindex taking the lease wins or withdraws within about a "
                     "second (two started within a second both stop). If it died before either, its claim blocks "
                     f"reindexes for {wait} s more; a retry then succeeds (`research-agent doctor` lists claims).",
            retry_after_seconds=wait)
    return StoreUnavailableError(
        f"Collection {collection!r} is already being reindexed by {who} (lease renewed {when})",
        guidance=f"Wait for that reindex to finish; one reindex at a time. If it died, its lease blocks for {wait} "
                 "s more; a retry then succeeds.", retry_after_seconds=wait)


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
            raise _already_reindexed(self.collection, [other], claim=False)
        self.renewed = time.time()
        self.store.registry_put({self.claim: self._record()}, LEASE, self.collection)
        time.sleep(LEASE_SETTLE_SECONDS)
        claims, lease = self._rivals()
        if claims or lease:
            self.store.registry_delete([self.claim])
            raise _already_reindexed(self.collection, claims or lease, claim=bool(claims))
        self._put()
        self.store.registry_delete([self.claim])  # only now: a rival reads claims first, then the lease

    def _rivals(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Other reindexes' live claims, and a live lease with another token (both empty: we won). Claims no
        election can count live any more are removed on the way (`claim_removable`).

        Why any claim loses, not the earliest: claim times come from different clocks. Each reindex writes its
        claim before reading, so if two both read nothing of the other, each claim came after the other's read:
        impossible. Two claims within the settle both lose (run it again). Claims are read before the lease: the
        winner deletes its claim only after writing the lease, so a rival sees one or the other."""
        found = {k: v for k, v in self.store.registry_find(LEASE, self.collection).items()
                 if k.startswith(_claim_prefix(self.collection)) and k != self.claim}
        removed = remove_dead_claims(self.store, found)
        if removed:
            log.info("reindex of %s: removed %d dead claims", self.collection, len(removed))
        claims = [v for k, v in found.items() if k not in removed and lease_live(v)]
        lease = reindex_lease(self.store, self.collection)
        return claims, [lease] if lease is not None and not self._ours(lease) else []

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
            raise _already_reindexed(self.collection, [current], claim=False)
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


__all__ = ["CLOCK_SKEW_SECONDS", "LEASE", "LEASE_RENEW_SECONDS", "LEASE_SECONDS", "ReindexLease", "age_words",
           "blocking_seconds", "check_no_reindex", "claim_collection", "claim_removable", "holder", "holder_gone",
           "intent_stale", "lease_key", "lease_live", "record_timing", "reindex_lease", "reindexed_elsewhere",
           "remove_dead_claims"]
