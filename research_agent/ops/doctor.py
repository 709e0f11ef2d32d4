"""Doctor: check the store for what an interrupted write can leave behind, and repair it.

Over 400 lines because each check lives beside its repair and the race argument that makes the repair safe.

On a Chroma server other processes write while doctor runs, and no lock is shared with them, so a scan is
only a list of candidates: every destructive step re-reads each candidate by id right before it acts
(`_confirmed_orphans`, `_confirmed_incomplete`, `_stray_records`), and the working copies and backups of a
collection with a live reindex lease are never touched (the lease is reported in `reindexes`). A live claim on a
reindex lease (a reindex mid-election, or one that died there) blocks other reindexes of its collection: it is
reported in `reindex_claims`; dead claims are leftovers the repair removes (storage/leases.py `claim_removable`).
Lease and claim records are read once (`read_lease_records`, the source elections use); a malformed one blocks
nothing, is listed as a leftover and removed by the repair (a lease only if still malformed when read again).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.ingest.folder import is_gone
from research_agent.ingest.prepare import version_ids
from research_agent.ingest.service import STALE_INTENT_SECONDS, delete_chunks, recover_interrupted
from research_agent.storage.chunks import all_ids, records
from research_agent.storage.leases import (
    CLAIM,
    ELECTION_SECONDS,
    LEASE,
    LEASE_SECONDS,
    LeaseRecord,
    age_words,
    election_live,
    read_lease_records,
    record_timing,
    remove_dead_claims,
    remove_malformed_lease,
)
from research_agent.storage.registry import DOCUMENT, INTENT, document_key
from research_agent.storage.swaps import swap_target
from research_agent.storage.writer import announce_intents

if TYPE_CHECKING:
    from research_agent.container import Container

#: Documents named per collection when their files are gone (the count is always given).
MISSING_EXAMPLES = 5


class CollectionCheck(BaseModel):
    collection: str
    documents: int
    chunks: int
    orphan_chunks: int
    incomplete_documents: list[str]
    # File documents whose recorded file is gone (moved, renamed, deleted): reported, never removed here.
    missing_files: int = 0
    missing_examples: list[str] = []
    # Writes whose intent is still recorded: in progress, or killed (possibly between their manifest flip and
    # the revision bump that tells other processes' keyword indexes). Not healthy until they finish or are undone.
    unfinished_writes: int = 0
    # Who holds each unfinished write ("pid 4242 on host-a, 12 s old"): what to wait for when repair cannot act.
    unfinished_by: list[str] = []


class ReindexInfo(BaseModel):
    """A live reindex lease: writes to `collection` by other processes are refused until it ends."""

    collection: str
    host: str | None = None
    pid: int | None = None
    since: str = ""
    # Seconds since its last renewal by this machine's clock (negative: dated ahead of it, within the skew).
    age_seconds: int = 0
    # How long it still blocks writes if never renewed again (a dead reindex): counted from its own date.
    blocks_for_seconds: int = 0
    # How long it still blocks other reindexes if never renewed again (storage/leases.py `election_live`).
    blocks_reindexes_for_seconds: int = 0

    def summary(self) -> str:
        return (f"{self.collection} (pid {self.pid} on {self.host}, lease renewed {age_words(self.age_seconds)}; "
                f"if it died, blocks writes for {self.blocks_for_seconds} s more, other reindexes for "
                f"{self.blocks_reindexes_for_seconds} s)")


class ReindexClaim(BaseModel):
    """A live claim on a reindex lease (a reindex taking it, or one that died doing so): until it ends, every
    other reindex of `collection` is refused; writes are not."""

    collection: str
    host: str | None = None
    pid: int | None = None
    # Seconds since it was claimed by this machine's clock (negative: dated ahead of it).
    age_seconds: int = 0
    # How long it still blocks other reindexes at most (it is never renewed; its holder withdraws it or wins).
    blocks_for_seconds: int = 0

    def summary(self) -> str:
        return (f"{self.collection} (pid {self.pid} on {self.host}, claimed {age_words(self.age_seconds)}; blocks "
                f"other reindexes for up to {self.blocks_for_seconds} s more)")


class DoctorReport(BaseModel):
    healthy: bool
    repaired: bool
    collections: list[CollectionCheck]
    leftovers: list[str]
    actions: list[str]
    # What to run for what doctor reports but does not repair (documents whose files are gone).
    advice: list[str] = []
    # Reindexes under way (live leases): their working copies and backups are theirs, never touched here.
    reindexes: list[ReindexInfo] = []
    # Live claims on reindex leases: each blocks other reindexes of its collection for blocks_for_seconds at most.
    reindex_claims: list[ReindexClaim] = []


def _check_collection(c: Container, col: Any, repair: bool, actions: list[str]) -> CollectionCheck:
    name = col.name
    if repair:
        _settle_writes(c, name, col, actions)
    manifests = c.store.registry_find("document", name)
    unfinished = c.store.registry_find(INTENT, name)
    # The new chunks of a write still under way (upserted, not flipped yet) are no orphans: deleting them left
    # its manifest, flipped a moment later, without chunks (server mode, where writers run beside doctor).
    expected = set(version_ids(name, [*manifests.values(), *(v for i in unfinished.values() for v in i["versions"])]))
    present = all_ids(col)
    orphans = [cid for cid in present if cid not in expected]
    incomplete = sorted(
        key for key, m in manifests.items() if any(cid not in present for cid in version_ids(name, [m]))
    )
    if repair and orphans and c.store.registry_malformed(DOCUMENT, name):
        # A manifest no read can use may name them (restorable by hand: a note has no file to re-ingest).
        actions.append(f"{name}: kept {len(orphans)} chunks no readable manifest names: manifests of this collection "
                       "that no read can use may name them (fix or delete those records, then repair again)")
        orphans = []
    if repair and (orphans or incomplete):
        _remove_damage(c, name, col, orphans, incomplete, actions)
    missing = _missing_files(manifests)
    return CollectionCheck(
        collection=name,
        documents=len(manifests),
        chunks=len(present),
        orphan_chunks=len(orphans),
        incomplete_documents=[manifests[k]["document"] for k in incomplete],
        missing_files=len(missing),
        missing_examples=missing[:MISSING_EXAMPLES],
        unfinished_writes=len(unfinished),
        unfinished_by=[_writer(i) for i in unfinished.values()],
    )


def _remove_damage(c: Container, name: str, col: Any, orphans: list[str], incomplete: list[str],
                   actions: list[str]) -> None:
    """Delete the orphans and incomplete documents that a fresh read by id confirms, nothing the scan alone
    suggested: on a Chroma server a scan can miss a manifest another process re-added meanwhile (its chunks
    then looked orphaned: 10 deleted in the attack run), and a whole write can land between the manifest scan
    and the chunk scan (its new chunks looked orphaned and its manifest incomplete: the document was deleted)."""
    with c.store.write_lock():
        doomed_orphans = _confirmed_orphans(c, name, col, orphans)
        dropped = _confirmed_incomplete(c, name, col, incomplete)
        # An incomplete document's surviving chunks go too: its manifest is dropped, so the next ingest adds
        # the file again from scratch. Readers can see only the dropped manifests change (no manifest names an
        # orphan, so no index holds one): a record naming those documents, logged before they go (as a delete
        # does), lets each keyword index catch up by the log instead of comparing every manifest (~7 s at 1M).
        doomed = doomed_orphans + sorted(all_ids(col, version_ids(name, dropped.values())))
        rev = c.store.log_change(name, (m["document"] for m in dropped.values()))
        delete_chunks(col, doomed)
        c.store.registry_delete(list(dropped))
        c.store.bump_revision(name, rev)
    kept = len(orphans) - len(doomed_orphans) + len(incomplete) - len(dropped)
    actions.append(f"{name}: removed {len(doomed_orphans)} orphan chunks, {len(dropped)} incomplete documents "
                   "(re-ingest them)" + (f"; left {kept} that a fresh read showed in use or gone" if kept else ""))


def _confirmed_orphans(c: Container, name: str, col: Any, candidates: list[str]) -> list[str]:
    """The candidates still orphaned by a fresh read: intents of the collection FIRST, then, by id, the
    manifests of the candidates' documents; a chunk either names is kept.

    Why this order is race-free with the write protocol (storage/writer.py: 0 intent, 1 chunks, 2 log + flip,
    3 delete old, 4 bump, 5 clear intent): a live write's new chunk exists only after its intent (0 before 1),
    and its intent is cleared only after the manifest names the chunk (2 before 5). Read at time t1, the
    intents either still hold the write (kept), or it cleared before t1, so its flip came before t1 and the
    manifests read after t1 name the chunk (kept) unless a later write has replaced that version (then the
    chunk is a true orphan). Read the other way round, a write flipping and clearing between the two reads
    was in neither, and its live chunks were deleted. Left open: a new write of the very same content
    (same chunk ids) starting between these reads and the delete, milliseconds later.
    """
    if not candidates:
        return []
    intents = c.store.registry_find(INTENT, name)
    meta = {cid: m or {} for cid, m in records(col, ["metadatas"], ids=candidates)}
    docs = {m.get("source_document") for m in meta.values() if m.get("source_document")}
    manifests = c.store.registry_get([document_key(name, d) for d in sorted(docs)])
    named = set(version_ids(name, [*manifests.values(), *(v for i in intents.values() for v in i["versions"])]))
    return [cid for cid in candidates if cid in meta and cid not in named]


def _confirmed_incomplete(c: Container, name: str, col: Any, candidates: list[str]) -> dict[str, dict[str, Any]]:
    """The candidate manifests (keys) a fresh read still shows incomplete: the manifest by id, its chunks by
    id, then the intents (none may name the document), then the manifest again, unchanged.

    Why: a write's chunks are all in before its flip, so a manifest read at t1 has them all until a later write
    replaces that version; that write holds an intent from before its flip to after its delete, so the intents
    read after the chunks show it, or it finished and the second manifest read shows its new version. Left
    open: a write that starts after the last read and flips before the delete (milliseconds).
    """
    if not candidates:
        return {}
    fresh = c.store.registry_get(candidates)
    present = all_ids(col, version_ids(name, fresh.values()))
    short = {k: m for k, m in fresh.items() if any(cid not in present for cid in version_ids(name, [m]))}
    busy = {v["document"] for i in c.store.registry_find(INTENT, name).values() for v in i["versions"]}
    again = c.store.registry_get(list(short))
    return {k: m for k, m in short.items()
            if m["document"] not in busy and again.get(k, {}).get("content_hash") == m["content_hash"]}


def _writer(intent: dict[str, Any]) -> str:
    age = max(0, int(time.time() - float(intent.get("created", 0))))
    return f"pid {intent.get('pid', '?')} on {intent.get('host', 'an unknown host')}, {age} s old"


def _settle_writes(c: Container, name: str, col: Any, actions: list[str]) -> None:
    """Undo dead writers' writes; announce the rest (server mode: intents younger than STALE_INTENT_SECONDS of
    writers not known dead) so every keyword index serves the manifests as they are now, not in 600 s."""
    with c.store.write_lock():
        if recover_interrupted(c, name, col):
            actions.append(f"{name}: undid an interrupted write")
        announced = announce_intents(c.store, name)
    if announced:
        actions.append(f"{name}: announced {announced} unfinished writes to readers (in progress, or their writer "
                       f"died on another machine: undone once {int(STALE_INTENT_SECONDS)} s old)")


def _missing_files(manifests: dict[str, dict[str, Any]]) -> list[str]:
    """File documents whose file lstat reports gone: not damage (the store is consistent), so it does not make
    the store unhealthy and --repair leaves them; `kb prune` decides with its own safety checks."""
    return sorted(m["document"] for m in manifests.values()
                  if m.get("kind") == "document" and m.get("path") and is_gone(Path(m["path"])))


REPAIR_ADVICE = ("run `research-agent doctor --repair` (MCP: check_store with repair=true) to fix the problems "
                 "listed; it never deletes a reindex backup that holds more than its live collection")


def _advice(checks: list[CollectionCheck], repaired: bool) -> list[str]:
    return [f"{ch.collection}: {ch.missing_files} documents whose files are gone "
            f"({', '.join(ch.missing_examples)}{', ...' if ch.missing_files > len(ch.missing_examples) else ''}); "
            f"run `research-agent kb prune --collection {ch.collection} --dry-run`, then without --dry-run, "
            "to remove them" for ch in checks if ch.missing_files] + [
        _unfinished_advice(ch, repaired) for ch in checks if ch.unfinished_writes]


def _unfinished_advice(ch: CollectionCheck, repaired: bool) -> str:
    """After a repair the writes left are ones it may not undo (young, of a process not known dead: on another
    machine, or alive): running it again changes nothing until they finish or turn STALE_INTENT_SECONDS old."""
    who = "; ".join(ch.unfinished_by[:MISSING_EXAMPLES]) + ("; ..." if len(ch.unfinished_by) > MISSING_EXAMPLES else "")
    if repaired:
        return (f"{ch.collection}: {ch.unfinished_writes} unfinished writes ({who}) are in progress or their writer "
                f"died on another machine; wait until they finish, or until they are {int(STALE_INTENT_SECONDS)} s "
                "old, when any write or repair undoes them")
    return (f"{ch.collection}: {ch.unfinished_writes} unfinished writes ({who}; in progress, or their writer was "
            "killed); `research-agent doctor --repair` announces them to readers now and undoes those of writers "
            f"known dead (this machine's, or older than {int(STALE_INTENT_SECONDS)} s)")


def _read_leases(c: Container) -> tuple[dict[str, LeaseRecord], float]:
    """Every lease and claim record, and `now` read after them (a record renewed after an earlier `now` was
    quoted as blocking 121 s)."""
    records = read_lease_records(c.store)
    return records, time.time()


def _live_reindexes(c: Container) -> list[ReindexInfo]:
    """Reindex leases that still block something: writes (`lease_live`) or, longer, other reindexes
    (`election_live`, a lease dated ahead of our clock or up to ELECTION_SECONDS old)."""
    records, now = _read_leases(c)
    return [ReindexInfo(collection=r.collection, host=r.record.get("host"), pid=r.record.get("pid"),
                        since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.record["started"])),
                        **_timing(r.record, now))
            for _, r in sorted(records.items()) if r.kind == LEASE and r.collection is not None
            and r.record is not None and election_live(r.record, now)]


def _timing(record: dict[str, Any], now: float) -> dict[str, int]:
    age, wait = record_timing(record, now)
    return {"age_seconds": age, "blocks_for_seconds": wait,
            "blocks_reindexes_for_seconds": record_timing(record, now, election=True)[1]}


def _live_claims(records: dict[str, LeaseRecord], now: float) -> list[ReindexClaim]:
    """Claims that count for elections (until removable): a claim dated up to 2 x the skew ahead of our clock
    blocks later, so it is listed now (it was called healthy)."""
    return [ReindexClaim(collection=r.collection, host=r.record.get("host"), pid=r.record.get("pid"),
                         age_seconds=record_timing(r.record, now, election=True)[0],
                         blocks_for_seconds=record_timing(r.record, now, election=True)[1])
            for _, r in sorted(records.items()) if r.kind == CLAIM and r.collection is not None
            and r.record is not None and election_live(r.record, now)]


def _dead_claims(c: Container, records: dict[str, LeaseRecord], now: float, repair: bool,
                 actions: list[str]) -> list[str]:
    """Claims no election can count live any more (reindexes that died mid-election), and malformed lease and
    claim records (they block nothing); repair removes them, a malformed lease only if still malformed when read
    again. Claims dead to our clock only are left alone (another machine's may still honour them)."""
    dead = sorted(k for k, r in records.items() if r.kind == CLAIM and r.record is not None
                  and not election_live(r.record, now))
    malformed = sorted(k for k, r in records.items() if r.record is None)
    if repair and (dead or malformed):
        removed = remove_dead_claims(c.store, {k: records[k] for k in [*dead, *malformed]})
        removed += [k for k in malformed if records[k].kind == LEASE and remove_malformed_lease(c.store, k)]
        gone_dead, gone_bad = [k for k in dead if k in removed], [k for k in malformed if k in removed]
        if gone_dead:
            actions.append(f"removed {_claims_of(gone_dead, records)}")
        if gone_bad:
            actions.append(f"removed {_malformed_of(gone_bad)}")
        return []
    return ([f"{_claims_of(dead, records)}: records only, blocking nothing"] if dead else []) + (
        [f"{_malformed_of(malformed)}: blocking nothing"] if malformed else [])


def _claims_of(keys: list[str], records: dict[str, LeaseRecord]) -> str:
    names = ", ".join(sorted({records[k].collection or "" for k in keys}))
    return f"{len(keys)} dead reindex claim{'s' if len(keys) != 1 else ''} (of {names})"


def _malformed_of(keys: list[str]) -> str:
    """Malformed records by key (repr: a key is anyone's text)."""
    shown = ", ".join(repr(k) for k in keys[:MISSING_EXAMPLES]) + (", ..." if len(keys) > MISSING_EXAMPLES else "")
    return f"{len(keys)} malformed reindex lease or claim record{'s' if len(keys) != 1 else ''} ({shown})"


def _reindex_advice(r: ReindexInfo) -> str:
    return (f"{r.collection}: being reindexed since {r.since} by pid {r.pid} on {r.host}; other processes' writes "
            "to it are refused meanwhile and its working copy is left alone; wait for `research-agent kb reindex` "
            f"to finish (a dead reindex stops blocking writes {int(LEASE_SECONDS)} s after its last renewal: this "
            f"one, last renewed {age_words(r.age_seconds)}, in {r.blocks_for_seconds} s unless it renews again; "
            f"other reindexes {int(ELECTION_SECONDS)} s after it: in {r.blocks_reindexes_for_seconds} s)")


def _claim_advice(r: ReindexClaim) -> str:
    return (f"{r.collection}: pid {r.pid} on {r.host} claimed its reindex lease {age_words(r.age_seconds)} and has "
            "neither taken nor withdrawn it; other reindexes of it are refused meanwhile (writes are not): a "
            "reindex taking the lease does either within about a second, one that died there blocks for "
            f"{r.blocks_for_seconds} s more")


def _swap_leftovers(c: Container, repair: bool, actions: list[str], busy: set[str]) -> list[str]:
    """A reindex's working copies and backups; repair restores or drops them, never a backup holding more, and
    never those of a collection in `busy` (a live reindex's: its working copy is filling and its backup is
    still read while it settles; deleting the copy killed the reindex with NotFoundError)."""
    if repair and not busy:
        actions += c.store.recover_swaps(force=True)
    elif repair:  # one target at a time; a name without one waits until the reindexes end
        for target in sorted({swap_target(n) for n in c.store.swap_leftovers()} - busy - {None}):
            actions += c.store.recover_swaps(only=target, force=True)
    left = [n for n in c.store.swap_leftovers() if swap_target(n) not in busy]
    if repair:
        actions += [f"kept {n}: it holds more chunks than {swap_target(n)!r}; check that collection with "
                    f"`research-agent collections info {swap_target(n)}`, delete it if it is incomplete, then run "
                    "`research-agent doctor --repair` again to restore the backup" for n in left]
    return left


def run_doctor(c: Container, repair: bool = False, *, repaired: bool = False) -> DoctorReport:
    """Find orphan chunks, incomplete documents and leftovers of an interrupted reindex; fix them with repair.
    `repaired`: this check follows a repair (its advice then never says to run the repair again)."""
    c.store.refresh()
    actions: list[str] = []
    reindexes = _live_reindexes(c)
    lease_records, now = _read_leases(c)  # leases and claims, live, dead and malformed
    claims = _live_claims(lease_records, now)
    leftovers = _swap_leftovers(c, repair, actions, {r.collection for r in reindexes})
    checks = [_check_collection(c, col, repair, actions) for col in c.store.list_collections()]
    leftovers += _stray_records(c, {r.collection for r in reindexes}, repair, actions)
    leftovers += _dead_claims(c, lease_records, now, repair, actions)
    if repair:
        # Report the store as it is now, not as it was found.
        after = run_doctor(c, repaired=True)
        return after.model_copy(update={"repaired": True, "actions": actions})
    fixable = bool(leftovers) or any(_fixable(ch, repaired) for ch in checks)
    garbled = _garbled_records(c)
    healthy = (not fixable and not reindexes and not claims and not garbled
               and not any(ch.unfinished_writes for ch in checks))
    # The next move goes in the report itself: a script reading --json (or an MCP client) sees no text output.
    return DoctorReport(healthy=healthy, repaired=False, collections=checks, leftovers=leftovers, actions=actions,
                        advice=([REPAIR_ADVICE] if fixable else []) + _advice(checks, repaired)
                        + [_reindex_advice(r) for r in reindexes] + [_claim_advice(r) for r in claims] + garbled,
                        reindexes=reindexes, reindex_claims=claims)


def _garbled_records(c: Container) -> list[str]:
    """Advice on registry records no read can use (storage/registry.py `decode_record`: every read skips them with a
    warning). Never repaired here: a garbled project or manifest may be someone's to restore, so doctor names them
    (repr: a key is anyone's text) and leaves them; lease records are reported with the leases."""
    keys = [k for k in c.store.registry_malformed() if not k.startswith("lease:")]
    if not keys:
        return []
    shown = ", ".join(repr(k) for k in keys[:MISSING_EXAMPLES]) + (", ..." if len(keys) > MISSING_EXAMPLES else "")
    return [f"{len(keys)} registry record{'s' if len(keys) != 1 else ''} that no read can use ({shown}): every "
            "read skips them; restore them from a backup or delete them by id in Chroma's research-agent-meta "
            "collection (doctor never deletes them)"
            + ("; a document's manifest ('document:...') is also replaced by ingesting its file again"
               if any(k.startswith("document:") for k in keys) else "")]


def _fixable(ch: CollectionCheck, repaired: bool) -> bool:
    """What another `doctor --repair` would fix. Right after one, unfinished writes (and the incomplete
    documents they name, kept) are a live or foreign writer's: only waiting helps (`_unfinished_advice`)."""
    if repaired and ch.unfinished_writes:
        return bool(ch.orphan_chunks)
    return bool(ch.orphan_chunks or ch.incomplete_documents or ch.unfinished_writes and not repaired)


def _stray_records(c: Container, busy: set[str], repair: bool, actions: list[str]) -> list[str]:
    """Manifests of collections that are gone. The collections are listed AFTER the manifests are read: a
    manifest is written only into an existing collection, so one created by another process meanwhile is
    listed; and one under reindex (`busy`) is briefly missing between its renames: not strays either."""
    manifests = c.store.registry_find(DOCUMENT)
    known = _existing_collections(c) | busy
    stray = [k for k, m in manifests.items() if m.get("collection") not in known]
    if stray and repair:
        with c.store.write_lock():
            # Again right before deleting: a reindex that took its lease after `busy` was read may be between its
            # renames now (its collection only under the backup name): every record of it looked stray and was
            # removed (the last attack pass).
            known = _existing_collections(c)
            stray = [k for k in stray if manifests[k].get("collection") not in known]
            c.store.registry_delete(stray)
        if stray:
            actions.append(f"removed {len(stray)} records of deleted collections")
    return [f"{len(stray)} document records of deleted collections"] if stray else []


def _existing_collections(c: Container) -> set[str]:
    """Collections that exist now: listed, under a reindex's working or backup name, or under a live lease."""
    return ({col.name for col in c.store.list_collections()} | {swap_target(n) for n in c.store.swap_leftovers()}
            | {r.collection for r in _live_reindexes(c)}) - {None}


__all__ = ["run_doctor", "DoctorReport"]
