"""Server-mode coordination records: who holds a record (a writer's intent, a reindex's lease) and the reindex lease.

Over 400 lines because the lease's records, their validation, the election and its refusals are one protocol:
split, the rules below would be stated in one module and applied in another.

On a Chroma server the store's write lock is per process, so a reindex also holds a lease (a registry record that
server-mode writers check after recording their intent, `check_no_reindex`); storage/swaps.py catches up with
whatever was written anyway before and after its renames.

Every lease and claim record is read through `parse_record` (`read_lease_records`, `reindex_lease`): a record that
is not JSON, not an object, or whose fields have the wrong type (dates: finite numbers within years 1970-9999;
pid: an int in 1..2**31-1, never a bool; host, pidns, token: short strings) is malformed. A malformed record is
never live: it blocks no write and no reindex, doctor lists it, `doctor --repair` removes it (a claim at once; a
lease after reading it again by key: no holder can renew it validly, and a holder's valid renewal replaces it),
and the next election of its collection removes a malformed claim. A claim is a record whose registry key is
`lease:claim:<collection>:<token>` for the `collection` its metadata names (how elections find it) and a token
without ':'; any other claim key is malformed (one source for elections and doctor).

Dates written by other machines (their clocks may run ahead or behind ours by up to CLOCK_SKEW_SECONDS, 300 s):
  - for writes, a lease counts only while `now - renewed` is within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS]
    (`lease_live`): a lease renewed "an hour from now" is a broken clock's and blocks nothing;
  - for elections, a lease or claim counts while any clock within CLOCK_SKEW_SECONDS of ours may count it live:
    `now - renewed` within [-2 x CLOCK_SKEW_SECONDS, LEASE_SECONDS + CLOCK_SKEW_SECONDS] and its holder not known
    gone (`election_live`; `claim_removable` is its negation for claims). So a dead claim or lease stops blocking
    reindexes LEASE_SECONDS + CLOCK_SKEW_SECONDS (420 s) after its own date, sooner when its holder is known gone
    from this machine, and two reindexes never both win while their clocks differ by less than 420 s (with the
    narrow window two machines 350 s apart both won);
  - an intent is a dead writer's when older than the caller's min_age, when its writer is known gone from this
    machine, or when it is dated more than CLOCK_SKEW_SECONDS ahead (`intent_stale`).
Taking the lease: each reindex writes a claim of its own (`lease:claim:<collection>:<token>`), waits
LEASE_SETTLE_SECONDS, then reads the claims and the lease back. It loses (the coded "already being reindexed"
error) when another claim or a lease with another token counts for elections; the winner writes the lease with
its token, then drops its claim. Its claim is withdrawn on every way out of the election (an error, a kill signal
raised as an exception), and its lease is released when anything fails after it won but before the body runs.
Records of this very process are never a rival's (leftovers of its earlier attempts
whose withdrawal failed: the election removes such claims once MID_ELECTION_SECONDS old). Never two winners,
whatever the clocks within the bound above (`_rivals`); two reindexes started within the settle both lose. A
reindex leaving deletes the lease only while it still holds its token; one that lost its lease meanwhile and
then failed ends with the coded "lost its lease" error, not the store's own exception.
A refusal quotes how long the blocking record still counts (from its own date, `election_seconds`), or about
MID_ELECTION_SECONDS (3 x the settle) for a claim that young whose holder is alive on this machine. Dead claims
are removed by the next election that reads them and by `doctor --repair`; a lease is never removed but by its
holder, or by repair when malformed (its key is reused: a delete after a read could remove a newer live one).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from research_agent.errors import ResearchAgentError, StoreUnavailableError
from research_agent.storage import chunks
from research_agent.storage.registry import INTENT, parse_intent, valid_date, valid_pid, valid_text

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


def _here(record: dict[str, Any]) -> bool:
    return (record.get("host"), record.get("pidns")) == (socket.gethostname(), _pid_namespace())


def holder_gone(record: dict[str, Any]) -> bool:
    """True when the record's holder ran on this host and its process no longer exists.

    Why: on a Chroma server an intent younger than STALE_INTENT_SECONDS (600 s) was taken for a live writer's,
    so a writer killed on this very machine stayed unrecovered (and its flip unannounced) for 10 minutes. A
    holder on another host or in another pid namespace (container), or a record of an older version (no pid),
    or one whose pid is no pid (a bool, a float, 2**70: OverflowError), is never called gone here.
    """
    if not isinstance(record, dict) or not _here(record):
        return False
    pid = record.get("pid")
    if not valid_pid(pid) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # EPERM: it exists under another user
        return False
    return False


def _ours_by_process(record: dict[str, Any]) -> bool:
    """A record written by this very process (host, pid namespace and pid)."""
    return _here(record) and record.get("pid") == os.getpid()


# -- the records: every lease and claim is read through parse_record --------------------------------------------
# The limits (pid, date, text) are storage/registry.py's, shared with writers' intents.
def _date(value: Any) -> float | None:
    return float(value) if valid_date(value) else None


def parse_record(raw: Any) -> dict[str, Any] | None:
    """A lease or claim record (its stored JSON text, or the object) with its fields checked; None: malformed.

    Checked: an object; `renewed` a finite date (`started` too, when present: default `renewed`); `pid`, when
    present, an int in 1..PID_MAX (not a bool); `host` and `token`, when present, non-empty strings of at most
    TEXT_MAX characters; `pidns` such a string or null. Why: forged or garbled records ('renewed': null, NaN,
    "yesterday"; pid 2**70; not JSON) crashed doctor, every reindex and the write check of their collection.
    """
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    renewed = _date(raw.get("renewed"))
    started = _date(raw.get("started", renewed))
    if renewed is None or started is None:
        return None
    if "pid" in raw and not valid_pid(raw["pid"]):
        return None
    if not all(valid_text(raw[f], optional=False) for f in ("host", "token") if f in raw):
        return None
    if not valid_text(raw.get("pidns"), optional=True):
        return None
    return {**raw, "renewed": renewed, "started": started}


@dataclass(frozen=True)
class LeaseRecord:
    """One record of kind LEASE as stored: a lease (`lease:reindex:<collection>`) or a claim; `record` is the
    parsed record, None when malformed (then `collection` is None when the key names none)."""

    key: str
    kind: str  # "lease" or "claim"
    collection: str | None
    record: dict[str, Any] | None


def _classify(key: str, meta: Any, doc: Any) -> LeaseRecord:
    if key.startswith(lease_key("")):
        collection: str | None = key[len(lease_key("")):]
        return LeaseRecord(key, LEASE, collection, parse_record(doc))
    named = meta.get("collection") if isinstance(meta, dict) else None
    token = key[len(_claim_prefix(named)):] if isinstance(named, str) and key.startswith(_claim_prefix(named)) else ""
    if not token or ":" in token:  # the key and the metadata elections find it by disagree: no one's claim
        return LeaseRecord(key, CLAIM, None, None)
    return LeaseRecord(key, CLAIM, named, parse_record(doc))


def read_lease_records(store: Any, collection: str | None = None, *,
                       keys: list[str] | None = None) -> dict[str, LeaseRecord]:
    """Every lease and claim record (of `collection`, by its metadata; or those of `keys`), parsed.

    Read from the registry's collection directly, not through `registry_find`: a record that is not JSON made
    that raise, and a claim is found by its metadata, which only this read returns."""
    where: dict[str, Any] = {"record": LEASE}
    if collection is not None:
        where = {"$and": [where, {"collection": collection}]}
    fields = ["documents", "metadatas"]

    def scan() -> dict[str, LeaseRecord]:
        got = chunks.records(store.meta, fields, ids=keys) if keys is not None else \
            chunks.records(store.meta, fields, where=where)
        return {str(k): _classify(str(k), meta, doc) for k, doc, meta in got
                if keys is not None or str(k).startswith(f"{LEASE}:")}

    return scan() if keys is not None else chunks.rescanning(scan)


# -- the reindex lease: server-mode writers of other processes hold off while a reindex copies -----------------
LEASE = "lease"
CLAIM = "claim"
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
#: A claim younger than this may belong to an election still under way (one settle before ours began, ours, and
#: room for slow registry calls): a retry after it succeeds unless that reindex won.
MID_ELECTION_SECONDS = 3 * LEASE_SETTLE_SECONDS
#: How long a reindex waits, after taking its lease, for writes already under way (their intents) to finish.
#: Past it the reindex goes on: its catch-up copies whatever they flip (a dead writer's intent never clears).
LEASE_DRAIN_SECONDS = 60.0
LEASE_POLL_SECONDS = 0.2
#: How long after its own date a record counts for elections at most (module docstring).
ELECTION_SECONDS = LEASE_SECONDS + CLOCK_SKEW_SECONDS


def lease_key(collection: str) -> str:
    return f"{LEASE}:reindex:{collection}"


def _claim_prefix(collection: str) -> str:
    return f"{LEASE}:{CLAIM}:{collection}:"


def _age(record: dict[str, Any], now: float | None) -> float:
    return (time.time() if now is None else now) - record["renewed"]


def lease_live(record: Any, now: float | None = None) -> bool:
    """A lease counts for writes while renewed within [-CLOCK_SKEW_SECONDS, LEASE_SECONDS] of now and its holder
    is not known gone (module docstring: a date further ahead is a broken clock's and never honoured); a
    malformed record never counts."""
    parsed = parse_record(record)
    return parsed is not None and -CLOCK_SKEW_SECONDS <= _age(parsed, now) <= LEASE_SECONDS \
        and not holder_gone(parsed)


def election_live(record: Any, now: float | None = None) -> bool:
    """A lease or claim counts for elections while some clock within CLOCK_SKEW_SECONDS of ours may count it live
    (renewed within [-2 x CLOCK_SKEW_SECONDS, ELECTION_SECONDS] of now) and its holder is not known gone."""
    parsed = parse_record(record)
    return parsed is not None and -2 * CLOCK_SKEW_SECONDS <= _age(parsed, now) <= ELECTION_SECONDS \
        and not holder_gone(parsed)


def claim_removable(record: Any, now: float | None = None) -> bool:
    """A claim no election can count live any more (`election_live` false): malformed, its holder known gone
    from this machine, or dead to every clock within CLOCK_SKEW_SECONDS of ours. Why not merely dead to our
    clock: a machine whose clock is behind ours still honours it, and a claim removed under a rival's read lets
    that rival win beside the claim's holder."""
    return not election_live(record, now)


def blocking_seconds(record: Any, now: float | None = None) -> float:
    """How long a lease still blocks writes if never renewed again (0: it blocks nothing): until now - renewed
    passes LEASE_SECONDS, so LEASE_SECONDS + its lead for a record dated ahead of our clock (within the skew)."""
    now = time.time() if now is None else now
    return max(0.0, LEASE_SECONDS - _age(parse_record(record) or {}, now)) if lease_live(record, now) else 0.0


def election_seconds(record: Any, now: float | None = None) -> float:
    """How long a lease or claim still blocks reindexes if never renewed again: until ELECTION_SECONDS old."""
    now = time.time() if now is None else now
    return max(0.0, ELECTION_SECONDS - _age(parse_record(record) or {}, now)) if election_live(record, now) else 0.0


def _ceil(seconds: float) -> int:
    return int(-(-seconds // 1))


def record_timing(record: Any, now: float | None = None, *, election: bool = False) -> tuple[int, int]:
    """A lease's or claim's (age, wait): seconds since its last renewal by our clock (negative: dated ahead of
    it), and seconds it still blocks writes (`election`: reindexes) if never renewed again, rounded up (never
    quoted shorter than it is) but never past the longest it can block (call it with `now` read after the
    record: a record renewed after `now` was read quoted 121 s)."""
    now = time.time() if now is None else now
    parsed = parse_record(record)
    if parsed is None:
        return 0, 0
    age = now - parsed["renewed"]
    longest = (ELECTION_SECONDS if election else LEASE_SECONDS) + max(0, -int(age))  # the lead as shown
    wait = election_seconds(parsed, now) if election else blocking_seconds(parsed, now)
    return int(age), min(_ceil(wait), int(longest))


def age_words(age: int) -> str:
    """An age from `record_timing` in words."""
    return f"{age} s ago" if age >= 0 else f"at a time {-age} s ahead of this clock"


def intent_stale(record: Any, min_age: float, now: float | None = None) -> bool:
    """A dead writer's intent: at least `min_age` old (0: every intent, the embedded rule), its writer known gone
    from this machine, dated more than CLOCK_SKEW_SECONDS ahead (it would otherwise never turn old), or naming
    its writer or date malformed (`parse_intent`: no live writer writes one; one malformed in what recovery needs
    is stale too, but recovery only removes it, `stale_intents`). Never raises."""
    parsed = parse_intent(record)
    if parsed is None or "malformed" in parsed:
        return True
    age = (time.time() if now is None else now) - float(parsed.get("created", 0))
    return min_age <= 0 or age >= min_age or age < -CLOCK_SKEW_SECONDS or holder_gone(parsed)


def stale_intents(store: Any, collection: str, min_age: float) -> dict[str, dict[str, Any]]:
    """{key: intent} of the dead writers' intents of `collection` (`intent_stale`), parsed, for recovery to undo;
    intents it cannot act on are deleted on the way (one scan for both). Call it under the write lock.

    Trigger: recovery (`recover_interrupted`: every write first, and `doctor --repair`). Why a malformed intent
    (not a JSON object, or versions `parse_intent` refuses) is removed, never undone: undoing deletes the chunks
    an intent names, and a live document's chunks must never go on a garbled record's word. Outcome: the record
    goes with a warning naming it; chunks its writer left are orphans that `doctor --repair` removes after its
    own checks; a reset is logged and the revision bumped, so keyword indexes compare every manifest once (its
    writer may have flipped manifests before dying, and which is unknown). A live writer never writes such a
    record and an intent's key is never reused, so nothing live is removed."""
    where = {"$and": [{"record": INTENT}, {"collection": collection}]}
    prefix = f"{INTENT}:{collection}:"  # a record under another key (a manifest with garbled metadata) is no intent
    found = chunks.rescanning(lambda: {str(rid): parse_intent(doc) for rid, doc in
                                       chunks.records(store.meta, ["documents"], where=where)
                                       if str(rid).startswith(prefix)})
    bad = sorted(k for k, v in found.items() if v is None)
    if bad:
        store.registry_delete(bad)
        store.bump_revision(collection)
        log.warning("removed %d malformed write intents of %s without undoing them (%s); `research-agent doctor "
                    "--repair` removes chunks they left", len(bad), collection,
                    ", ".join(repr(k) for k in bad[:5]) + (", ..." if len(bad) > 5 else ""))
    return {k: v for k, v in found.items() if v is not None and intent_stale(v, min_age)}


def _lease_record(store: Any, collection: str) -> dict[str, Any] | None:
    """The lease of `collection` as stored, parsed (None: none, or malformed)."""
    found = read_lease_records(store, keys=[lease_key(collection)]).get(lease_key(collection))
    return found.record if found is not None else None


def reindex_lease(store: Any, collection: str) -> dict[str, Any] | None:
    """The reindex lease of `collection` live for writes (None when there is none, or it is dead, absurdly
    dated or malformed)."""
    lease = _lease_record(store, collection)
    return lease if lease is not None and lease_live(lease) else None


def reindexed_elsewhere(store: Any, collection: str) -> bool:
    """Whether another process holds a live reindex lease on `collection` (this process's own does not count)."""
    lease = reindex_lease(store, collection)
    return lease is not None and _elsewhere(lease)


def _elsewhere(record: dict[str, Any]) -> bool:
    """Whether another process holds the record: host, pid namespace and pid, as `_ours_by_process` decides (two
    containers sharing a host name often share small pids: comparing host and pid let each write through the
    other's reindex lease). A record of an older version without a pid namespace is ours by host and pid."""
    if (record.get("host"), record.get("pid")) != (socket.gethostname(), os.getpid()):
        return True
    return record.get("pidns") is not None and record.get("pidns") != _pid_namespace()


def check_no_reindex(store: Any, collection: str, done: str = "written") -> None:
    """Refuse a server-mode write while another process reindexes `collection` (called after the write's
    intent is recorded, so the reindex sees the intent or the writer sees the lease: never neither); `done`
    names what the refused operation would have done ("nothing was deleted")."""
    lease = reindex_lease(store, collection)
    if lease is None or not _elsewhere(lease):
        return
    started = time.strftime("%H:%M:%S", time.localtime(lease["started"]))
    _, wait = record_timing(lease)
    raise StoreUnavailableError(
        f"Collection {collection!r} is being reindexed (since {started}, by process {lease.get('pid')} on "
        f"{lease.get('host')}); nothing was {done}",
        guidance=f"Try again when `research-agent kb reindex --collection {collection}` finishes; a reindex that "
                 f"died stops blocking writes {int(LEASE_SECONDS)} s after its last sign of life (this one: in "
                 f"{wait} s unless it renews its lease).", retry_after_seconds=wait)


def _retry_after(record: dict[str, Any], now: float, *, claim: bool) -> int:
    """Seconds until a retry of a refused reindex can succeed: a claim younger than MID_ELECTION_SECONDS whose
    holder is alive on this machine wins or withdraws within about the settle (quoting 120 s sent callers away
    for nothing); otherwise until the record stops counting for elections."""
    age = now - record["renewed"]
    if claim and 0 <= age < MID_ELECTION_SECONDS and _here(record) and valid_pid(record.get("pid")) \
            and not holder_gone(record):
        return max(1, _ceil(MID_ELECTION_SECONDS - age))
    return record_timing(record, now, election=True)[1]


def _already_reindexed(collection: str, others: list[dict[str, Any]], *, claim: bool) -> StoreUnavailableError:
    """The refusal of a reindex: another holds the lease, or claims it (`claim`); it says when a retry can
    succeed: at once when the other withdraws, else when the longest-blocking of `others` runs out."""
    now = time.time()
    other = max(others, key=lambda r: _retry_after(r, now, claim=claim))
    wait = _retry_after(other, now, claim=claim)
    who, when = f"process {other.get('pid')} on {other.get('host')}", age_words(int(now - other["renewed"]))
    if claim:
        return StoreUnavailableError(
            f"Collection {collection!r} is already being reindexed: {who} claimed its lease ({when})",
            guidance="Run it again in a few seconds: a reindex taking the lease wins or withdraws within about a "
                     "second (two started within a second both stop). If it died before either, its claim blocks "
                     f"reindexes for {wait} s more; a retry then succeeds (`research-agent doctor` lists claims).",
            retry_after_seconds=wait)
    return StoreUnavailableError(
        f"Collection {collection!r} is already being reindexed by {who} (lease renewed {when})",
        guidance=f"Wait for that reindex to finish; one reindex at a time. If it died, its lease blocks other "
                 f"reindexes for {wait} s more; a retry then succeeds.", retry_after_seconds=wait)


def _lost_lease(collection: str) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"The reindex of {collection!r} lost its lease: it went unrenewed past {int(LEASE_SECONDS)} s (paused or "
        "stalled) and the collection changed meanwhile; nothing was swapped in by this reindex",
        guidance=f"Run `research-agent doctor`, then `research-agent kb reindex --collection {collection}` again "
                 "if its model still differs.")


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
        try:
            self.drain()
        except BaseException:  # won, but the body never runs: the lease would block everyone for 120 s
            self._leave(quiet=True)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        current = self._leave(quiet=exc is not None)
        if exc is not None and not isinstance(exc, ResearchAgentError) and isinstance(exc, Exception) \
                and current is not None and not self._ours(current.record):
            raise _lost_lease(self.collection) from exc

    def _leave(self, *, quiet: bool) -> LeaseRecord | None:
        """Withdraw our claim and delete the lease while it holds our token; returns the lease as read (None:
        none). `quiet`: a failure here is logged, never raised over the error that got us here."""
        try:
            current = read_lease_records(self.store, keys=[self.key]).get(self.key)
            self.store.registry_delete([self.claim, *([self.key] if current and self._ours(current.record) else [])])
            return current or LeaseRecord(self.key, LEASE, self.collection, None)
        except Exception:
            if not quiet:
                raise
            log.warning("reindex of %s: could not withdraw its lease records", self.collection, exc_info=True)
            return None

    def _ours(self, lease: dict[str, Any] | None) -> bool:
        return lease is not None and lease.get("token") == self.token

    def _record(self) -> dict[str, Any]:
        return {"started": self.started, "renewed": self.renewed, "token": self.token, **holder()}

    def _take(self) -> None:
        """Claim, settle, read back: raises the coded error (our claim withdrawn) when another reindex wins. Our
        claim is withdrawn on every way out (a store error, Ctrl-C); a lease we wrote is released on an error."""
        try:
            lease = self._rival_lease()
            if lease:
                raise _already_reindexed(self.collection, lease, claim=False)
            self.renewed = time.time()
            self.store.registry_put({self.claim: self._record()}, LEASE, self.collection)
            time.sleep(LEASE_SETTLE_SECONDS)
            claims, lease = self._rivals()
            if claims or lease:
                raise _already_reindexed(self.collection, claims or lease, claim=bool(claims))
            self._put()
        except BaseException:
            self._leave(quiet=True)
            raise
        self.store.registry_delete([self.claim])  # only now: a rival reads claims first, then the lease

    def _rival_lease(self) -> list[dict[str, Any]]:
        """The lease of another reindex (not ours, not this process's) that counts for elections."""
        lease = _lease_record(self.store, self.collection)
        rival = lease is not None and election_live(lease) and not self._ours(lease) and not _ours_by_process(lease)
        return [lease] if rival and lease is not None else []

    def _rivals(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Other reindexes' claims and another's lease that count for elections (both empty: we won). Removable
        claims (malformed, or no election can count them live) are removed on the way.

        Why any claim loses, not the earliest: claim times come from different clocks. Each reindex writes its
        claim before reading, so if two both read nothing of the other, each claim came after the other's read:
        impossible. Two claims within the settle both lose (run it again). Claims are read before the lease: the
        winner deletes its claim only after writing the lease, so a rival sees one or the other."""
        found = {k: r for k, r in read_lease_records(self.store, self.collection).items()
                 if r.kind == CLAIM and k != self.claim}
        removed = remove_dead_claims(self.store, found)
        # This process's own claims under other tokens are leftovers of its earlier elections whose withdrawal
        # failed (the server was down): removed once older than any election of ours still under way.
        now = time.time()
        leftovers = sorted(k for k, r in found.items() if k not in removed and r.record is not None
                           and _ours_by_process(r.record) and now - r.record["renewed"] > MID_ELECTION_SECONDS)
        self.store.registry_delete(leftovers)
        removed += leftovers
        if removed:
            log.info("reindex of %s: removed %d dead or malformed claims", self.collection, len(removed))
        claims = [r.record for k, r in found.items() if k not in removed and r.record is not None
                  and not _ours_by_process(r.record) and election_live(r.record)]
        return claims, self._rival_lease()

    def _put(self) -> None:
        self.renewed = time.time()
        self.store.registry_put({self.key: self._record()}, LEASE, self.collection)

    def renew(self) -> None:
        """Every LEASE_RENEW_SECONDS: renewed, unless another reindex holds the lease now, or held it and ended
        (this one went unrenewed past the election window, paused or stalled: the lease is gone or another's):
        then the coded error, before this copy is swapped in over theirs. Only the holder deletes its lease, so
        ours missing means it was taken over."""
        if time.time() - self.renewed < LEASE_RENEW_SECONDS:
            return
        current = _lease_record(self.store, self.collection)
        if current is not None and not self._ours(current) and lease_live(current):
            raise _already_reindexed(self.collection, [current], claim=False)
        if not self._ours(current):  # gone, or another's dead one: another reindex took it over and ended
            raise _lost_lease(self.collection)
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


def remove_dead_claims(store: Any, claims: dict[str, LeaseRecord]) -> list[str]:
    """Delete those of `claims` (key -> record as read) that are malformed or removable; returns their keys. A
    claim is written once under its own token and never renewed, so the record as read is the record as it is
    (or it is gone)."""
    now = time.time()
    dead = sorted(k for k, r in claims.items() if r.kind == CLAIM and (r.record is None
                                                                       or claim_removable(r.record, now)))
    store.registry_delete(dead)
    return dead


def remove_malformed_lease(store: Any, key: str) -> bool:
    """Delete the lease record `key` if, read again now, it is still malformed (a holder's valid renewal replaces
    a malformed record under the same key and must not be deleted); True when deleted. Left open: a valid lease
    written between this read and the delete (milliseconds): its holder's next renewal finds it gone and the
    reindex ends with the coded "lost its lease" error, nothing lost (an attack pass stretched the window to hit
    it; it needs a malformed lease record, which no version of ours writes)."""
    found = read_lease_records(store, keys=[key]).get(key)
    if found is None or found.record is not None:
        return False
    store.registry_delete([key])
    return True


__all__ = ["CLAIM", "CLOCK_SKEW_SECONDS", "ELECTION_SECONDS", "LEASE", "LEASE_RENEW_SECONDS", "LEASE_SECONDS",
           "LeaseRecord", "ReindexLease", "age_words", "blocking_seconds", "check_no_reindex", "claim_removable",
           "election_live", "election_seconds", "holder", "holder_gone", "intent_stale", "lease_key", "lease_live",
           "parse_record", "read_lease_records", "record_timing", "reindex_lease", "reindexed_elsewhere",
           "remove_dead_claims", "remove_malformed_lease", "stale_intents"]
