"""Doctor: check the store for what an interrupted write can leave behind, and repair it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.ingest.folder import is_gone
from research_agent.ingest.prepare import version_ids
from research_agent.ingest.service import STALE_INTENT_SECONDS, delete_chunks, recover_interrupted
from research_agent.storage.chunks import all_ids
from research_agent.storage.registry import INTENT
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


class DoctorReport(BaseModel):
    healthy: bool
    repaired: bool
    collections: list[CollectionCheck]
    leftovers: list[str]
    actions: list[str]
    # What to run for what doctor reports but does not repair (documents whose files are gone).
    advice: list[str] = []


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
    if repair and (orphans or incomplete):
        # An incomplete document's surviving chunks go too: its manifest is dropped, so the next
        # ingest adds the file again from scratch.
        doomed = orphans + [cid for cid in version_ids(name, [manifests[k] for k in incomplete]) if cid in present]
        with c.store.write_lock():
            # Readers can see only the dropped manifests change (no manifest names an orphan, so no index
            # holds one): a record naming those documents, logged before they go (as a delete does), lets each
            # keyword index catch up by the log instead of comparing every manifest (~7 s at 1M documents).
            rev = c.store.log_change(name, (manifests[k]["document"] for k in incomplete))
            delete_chunks(col, doomed)
            c.store.registry_delete(incomplete)
            c.store.bump_revision(name, rev)
        actions.append(f"{name}: removed {len(orphans)} orphan chunks, {len(incomplete)} incomplete documents "
                       "(re-ingest them)")
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
    )


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


def _advice(checks: list[CollectionCheck]) -> list[str]:
    return [f"{ch.collection}: {ch.missing_files} documents whose files are gone "
            f"({', '.join(ch.missing_examples)}{', ...' if ch.missing_files > len(ch.missing_examples) else ''}); "
            f"run `research-agent kb prune --collection {ch.collection} --dry-run`, then without --dry-run, "
            "to remove them" for ch in checks if ch.missing_files] + [
        f"{ch.collection}: {ch.unfinished_writes} unfinished writes (in progress, or their writer was killed); "
        "`research-agent doctor --repair` announces them to readers now and undoes those of writers known dead "
        f"(this machine's, or older than {int(STALE_INTENT_SECONDS)} s)" for ch in checks if ch.unfinished_writes]


def _swap_leftovers(c: Container, repair: bool, actions: list[str]) -> list[str]:
    """A reindex's working copies and backups; repair restores or drops them, never a backup holding more."""
    if not repair:
        return c.store.swap_leftovers()
    actions += c.store.recover_swaps(force=True)
    left = c.store.swap_leftovers()
    actions += [f"kept {n}: it holds more chunks than {swap_target(n)!r}; check that collection with "
                f"`research-agent collections info {swap_target(n)}`, delete it if it is incomplete, then run "
                "`research-agent doctor --repair` again to restore the backup" for n in left]
    return left


def run_doctor(c: Container, repair: bool = False) -> DoctorReport:
    """Find orphan chunks, incomplete documents and leftovers of an interrupted reindex; fix them with repair."""
    c.store.refresh()
    actions: list[str] = []
    leftovers = _swap_leftovers(c, repair, actions)
    checks = [_check_collection(c, col, repair, actions) for col in c.store.list_collections()]
    known = {ch.collection for ch in checks}
    stray = [k for k, m in c.store.registry_find("document").items() if m.get("collection") not in known]
    if stray:
        if repair:
            with c.store.write_lock():
                c.store.registry_delete(stray)
            actions.append(f"removed {len(stray)} records of deleted collections")
        leftovers.append(f"{len(stray)} document records of deleted collections")
    if repair:
        # Report the store as it is now, not as it was found.
        after = run_doctor(c, repair=False)
        return DoctorReport(healthy=after.healthy, repaired=True, collections=after.collections,
                            leftovers=after.leftovers, actions=actions, advice=after.advice)
    healthy = not leftovers and all(not ch.orphan_chunks and not ch.incomplete_documents and not ch.unfinished_writes
                                    for ch in checks)
    # The next move goes in the report itself: a script reading --json (or an MCP client) sees no text output.
    repair_first = [] if healthy else [REPAIR_ADVICE]
    return DoctorReport(healthy=healthy, repaired=False, collections=checks, leftovers=leftovers, actions=actions,
                        advice=repair_first + _advice(checks))


__all__ = ["run_doctor", "DoctorReport"]
