"""Keeping each collection's keyword index in step with the store: catch-up by reconciliation, per document.

Where: one tantivy index per Chroma collection, `persist_folder(c, col)/tantivy-w<title>.<keywords>-a<version>`
(inside an embedded store; for a Chroma server under the user's cache, one folder per server), shared by every
process on the machine. Its state (search/keyword_index.py) says, per document, which content hash it holds
(on the document's own entries), and in one small global entry the collection revision it reflects and the
change-log position it applied, committed with the chunks.

When: a query reads the collection's revision (storage/registry.py, bumped by every write of any process); if
the index's state names another, the index catches up before it answers:
  1. which documents may differ: the change records (storage/registry.py `log_change`, one per write, written
     just before its manifests flip, naming its documents and the revision it bumps to) stamped after the
     index's position minus `SKEW_SECONDS`. The log is used only if its records announce the current
     revision (else some write is not in it: a writer of an older version) AND the index's own revision
     (else the log does not continue from the index: the store was restored from a backup older than the
     index), it holds no reset record since (`log_reset`: a change it cannot name document by document, e.g.
     `kb reindex`'s swap; every revision bump without a change record writes one), and it reaches back to the
     position (records are kept CHANGE_LOG_SECONDS); otherwise every manifest is compared with the state
     (`full diff`, one registry read), once: the reset record then announces the index's revision. The
     position is the time of the record announcing the index's revision (a build or full diff looks it up in
     the log). An index with no state, or saved before its Chroma collection id was kept, is
     built from a full scan; one holding another collection's id (a symlinked or copied folder) is not used.
     Records the index already applied are skipped (`IndexState.applied`, below): right after a bulk load the
     window's records name thousands of documents, and every catch-up of the next 5 minutes read all their
     manifests (6,026 for a one-document write at 10k chunks through a server, 0.63 s).
  2. of those, the documents whose manifest content hash differs from the index's (`versions_of`: only the
     named documents' state is read; the full diff reads every document's, `all_versions`); their entries
     are deleted from the index and their current visible chunks added (fetched from Chroma by id: the
     manifest gives the ids), with their new state and the new global entry, in one commit. A catch-up
     reads and writes what changed, whatever the corpus size: one document writes one chunk and ~200 bytes
     of state (`CatchUp.state_bytes`; layout 2 rewrote every document's hash, ~9 MB at 100k documents).
Why it is correct after anything: the update of a document ("delete its chunks, add its current version's") is
idempotent and judged against the manifests themselves, so it holds for writes by this process, other
processes, other machines on a Chroma server, and after kill -9 anywhere (a catch-up killed before its commit
published nothing and runs again; a writer killed after its flip is recovered by `recover_interrupted`, which
logs the documents and bumps the revision). Re-reading the last `SKEW_SECONDS` of the log covers records that
land late (clock skew between server writers); re-applying a document whose hash already matches is skipped.

Applied records (the skew window's memory): each catch-up (build, diff or log) reads the change records before
the manifests, and commits with its state the ids of those stamped inside the next catch-up's window that were
finished when read (registry `finished`: a write's record is marked done after its flip and bump, a reset's
record is written after its change): their changes were in the manifests it compared. The next catch-up
skips a record whose id it remembers and that is still finished, and reads every other: one that landed late
(stamped inside the window, written after the catch-up), one read before its write flipped (a server has no
read gate: remembered, it would hide that write for good), one a writer of an older version wrote (never
marked done). A remembered record missing from the log means the log does not continue from the index (a
store restored from a backup): full diff; a store restored from a backup taken mid-write holds the record
unfinished, so it is read again. A remembered reset is not taken for a new one (a reset followed by writes
made every catch-up of its window a full diff: ~7 s each at 1M documents on a server). At most MAX_APPLIED
ids (16 hex characters each, <= ~10 KB of state, committed in the same tantivy commit as the chunks: kill -9
never separates them); past that the oldest are forgotten and their documents read again, as before.

Concurrency: tantivy allows one writer per index, so a catch-up holds `<index>.lock` (flock, released by the
OS if the process dies); another process that finds it taken answers from the last committed state if that is
at the current revision, and otherwise waits (polling, up to CATCH_UP_WAIT_SECONDS) for it to get there or for
the lock. Readers never lock: they `reload()` after a commit. A folder that does not open or read back
(truncated, altered, garbage) is removed under the lock and rebuilt, with a warning; a folder that cannot be
written at all (read-only store), or no longer (made read-only or immutable after it was saved: the commit
or its lock fails), leaves the process an in-memory index, caught up the same way, with one warning. Older layouts
are removed on first open and the index built again (once per collection): the bm25s indexes
(`<revision>-w2.3-a1-bm25s0.3.16` folders) and tantivy folders of an older analyzer/layout version
(`tantivy-w2.3-a2`, one state entry with every document's hash), with their lock files.

Over 400 lines because the log, the diff, the lock and the fallbacks are one protocol whose correctness
argument is above: split apart, each half would depend on invariants only the other enforces.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from research_agent.errors import StoreUnavailableError
from research_agent.search.keyword_index import (
    ANALYZER_VERSION,
    Chunk,
    IndexState,
    KeywordIndex,
    field_weights,
    persist_folder,
)
from research_agent.storage import chunks as chunk_pages
from research_agent.storage.leases import CLOCK_SKEW_SECONDS
from research_agent.storage.lock_primitives import flock
from research_agent.storage.registry import (
    CHANGE_LOG_SECONDS,
    DOCUMENT,
    announced,
    document_key,
    finished,
    version_ids,
)

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

#: Change records stamped up to this long before the index's position are read again: on a Chroma server,
#: writers on other machines may run clocks this far apart, and a catch-up may read a write's record before
#: its flip (re-applying a document whose hash matches is skipped, so the cost is reading the manifests the
#: last five minutes' records name). An embedded store's writers share this machine's clock and a catch-up
#: never sees half a commit (the read gate), so there only clock steps matter: 2 s.
SKEW_SECONDS = CLOCK_SKEW_SECONDS  # 300 s: the one clock-skew bound of server mode (storage/swaps.py)
EMBEDDED_SKEW_SECONDS = 2
#: The change records of the skew window an index remembers as applied (their documents are not read again
#: by the next catch-up): the newest this many, by the first APPLIED_ID_CHARS of their tokens (uuid4: 60 random
#: bits, so a new record is mistaken for a remembered one about once in 10^15), <= ~10 KB of state. A bulk load
#: writes one record per 256-500 chunks (10k chunks: 20-40 records; 5 minutes of a 1M load at 195 documents/s:
#: ~230); past the bound the oldest records' documents are read again, as before the memory existed.
MAX_APPLIED = 512
APPLIED_ID_CHARS = 16
#: The longest a query waits for another process's catch-up (a first build at 1M chunks took 60-110 s).
CATCH_UP_WAIT_SECONDS = 600.0
#: How long one try for the catch-up lock waits before checking whether the other process is done.
LOCK_POLL_SECONDS = 0.2

#: The last catch-ups of this process, newest last: what each one touched (tests and `--verbose` read it).
RECENT: deque["CatchUp"] = deque(maxlen=100)

#: (store location, Chroma collection id, field weights) -> the open index.
_open: dict[tuple[str, str, tuple[int, int]], KeywordIndex] = {}
_open_lock = threading.Lock()
_catch_up_locks: dict[tuple[str, str, tuple[int, int]], threading.Lock] = {}


def opened_collection_ids(location: str) -> set[str]:
    """Chroma ids of the collections of the store at `location` this process has a keyword index open for (every
    keyword and hybrid query opens one): what the freshness watcher (search/freshness.py) warms."""
    with _open_lock:
        return {key[1] for key in _open if key[0] == location}

#: The bm25s design's saved folders and half-written saves (removed on first open), and Chroma collection ids.
_OLD_BM25S = re.compile(r"[\w.-]+-w\d+\.\d+-a\d+-bm25s[\w.+-]+|\.tmp-[0-9a-f]{32}")
#: tantivy index folders (and their lock files) by analyzer/layout version: older ones are removed.
_TANTIVY = re.compile(r"tantivy-w\d+\.\d+-a(\d+)(\.lock)?")
_COLLECTION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class CatchUp:
    """One catch-up: how it found the documents ("build", "log" or "diff"), which it updated, chunks added,
    index entries and bytes of state written (keyword_index.Written), manifests read (the cost that follows
    the log: 1 for a one-document write, every document's for a build or full diff) and change records
    skipped as already applied (IndexState.applied)."""

    collection: str
    mode: str
    documents: list[str] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    entries: int = 0
    state_bytes: int = 0
    manifests: int = 0
    skipped: int = 0


def index_path(folder: Path, weights: tuple[int, int]) -> Path:
    return folder / f"tantivy-w{weights[0]}.{weights[1]}-a{ANALYZER_VERSION}"


def keyword_index(c: Container, collection: str, col: Any) -> KeywordIndex:
    """The collection's index at its current revision: as committed if it is there, else after a catch-up
    (this process's, or another's it waited for)."""
    weights = tuple(field_weights(c.settings))
    key = (c.store.location, str(col.id), weights)
    index = _opened(c, col, key)
    rev = c.store.revision(collection)
    if index.state.revision == rev or _reloaded(index, key).state.revision == rev:
        return index
    with _open_lock:
        thread_lock = _catch_up_locks.setdefault(key, threading.Lock())
    with thread_lock:  # this process's threads: one catch-up, the others then find it done
        index = _opened(c, col, key)
        if _reloaded(index, key).state.revision != c.store.revision(collection):
            index = _caught_up(c, collection, col, index, key)
    return index


def _caught_up(c: Container, collection: str, col: Any, index: KeywordIndex,
               key: tuple[str, str, tuple[int, int]]) -> KeywordIndex:
    """`index` caught up; if its folder can no longer be written (made read-only or immutable after it was
    saved: tantivy's commit raised ValueError "A worker thread encountered an error", the lock file
    PermissionError), an in-memory index built from the store, kept for this process, with one warning."""
    try:
        _locked_catch_up(c, collection, col, index)
        return index
    except (OSError, ValueError) as exc:
        if index.path is None:
            raise
        log.warning("could not update the keyword index at %s (%s); using one in memory", index.path, exc)
    memory = KeywordIndex(weights=index.weights)
    catch_up(c, collection, col, memory)
    with _open_lock:
        _open[key] = memory
    return memory


def _reloaded(index: KeywordIndex, key: tuple[str, str, tuple[int, int]]) -> KeywordIndex:
    try:
        if index.path is not None:
            index.reload()
    except Exception as exc:  # the folder was rebuilt or damaged under us: open it again next time
        log.warning("keyword index at %s could not be reloaded (%s); reopening it", index.path, exc)
        with _open_lock:
            _open.pop(key, None)
    return index


def _opened(c: Container, col: Any, key: tuple[str, str, tuple[int, int]]) -> KeywordIndex:
    with _open_lock:
        index = _open.get(key)
    if index is None:
        index = _owned(open_index(persist_folder(c, col), key[2]), str(col.id))
        with _open_lock:
            index = _open.setdefault(key, index)
    return index


def _owned(index: KeywordIndex, collection_id: str) -> KeywordIndex:
    """`index` if it was built from this Chroma collection (or before ids were kept: the next catch-up rebuilds
    it); else an in-memory one. Another collection's index (a symlinked or copied folder) served its chunks
    as ghosts, and rebuilding it in place would wreck that collection's."""
    held = index.state.collection
    if held is None or held == collection_id:
        return index
    log.warning("keyword index at %s belongs to collection %s, not %s; using one in memory", index.path, held,
                collection_id)
    return KeywordIndex(weights=index.weights)


def open_index(folder: Path, weights: tuple[int, int]) -> KeywordIndex:
    """The saved index (created empty if there is none); a damaged one is removed and started again, and an
    unwritable folder gives an in-memory index (each new process then builds it: slower, still correct)."""
    path = index_path(folder, weights)
    link = _linked(folder, path)
    if link is not None:
        log.warning("%s is a symbolic link: the keyword index is kept in memory, never written or pruned through "
                    "it (remove the link to keep the index on disk again)", link)
        return KeywordIndex(weights=weights)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_old_indexes(folder)
        try:
            return KeywordIndex.open(path, weights)
        except OSError:  # the folder cannot be written: nothing to rebuild, the memory fallback below
            raise
        except Exception as exc:  # truncated, altered, garbage: never trusted
            log.warning("keyword index at %s is unusable (%s); rebuilding it", path, exc)
        with _file_lock(folder, weights):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            return KeywordIndex.open(path, weights)
    except OSError as exc:
        log.warning("could not keep the keyword index in %s (%s); using one in memory", folder, exc)
    return KeywordIndex(weights=weights)


def _linked(folder: Path, path: Path) -> Path | None:
    """The first of the index's own folders (the keyword-index root, the collection's folder, the index) that is a
    symbolic link, else None. Why: writes and prunes through a link land in its target: `keyword-index` linked to
    the store made one query delete the store's own vector segments (named like collection ids); a linked
    collection folder got an index written into, and old-layout names deleted from, the link's target (the
    seventh session's last attack pass)."""
    return next((p for p in (folder.parent, folder, path) if p.is_symlink()), None)


def remove_old_indexes(folder: Path) -> None:
    """Remove older layouts' saved indexes in `folder` (the bm25s design's, tantivy folders of an older
    analyzer version and their lock files): entries with those names only, never through a symlink (a user
    who moved the folder elsewhere, or keeps other files beside ours, loses nothing). A newer version's
    folder is left alone (a newer process may be using it)."""
    for entry in folder.iterdir():
        old = _TANTIVY.fullmatch(entry.name)
        if entry.is_symlink() or not (_OLD_BM25S.fullmatch(entry.name) or (old and int(old[1]) < ANALYZER_VERSION)):
            continue
        if entry.is_dir():
            log.info("removing the keyword index of an older layout: %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file():
            entry.unlink(missing_ok=True)


class _file_lock:
    """The catch-up lock of one index folder (flock; the OS releases it if the holder dies)."""

    def __init__(self, folder: Path, weights: tuple[int, int], timeout: float = CATCH_UP_WAIT_SECONDS) -> None:
        self.path = Path(f"{index_path(folder, weights)}.lock")
        self.timeout = timeout
        self.fd: int | None = None

    def acquire(self, wait: float) -> bool:
        try:
            self.fd = flock(self.path, True, time.monotonic() + wait)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise StoreUnavailableError(  # flock opens with O_NOFOLLOW: a symlink put there is refused, not used
                f"{self.path} is a symbolic link; the keyword index never follows one",
                guidance=f"Remove the link {self.path} (and check who can write into the store).") from None
        return self.fd is not None

    def __enter__(self) -> "_file_lock":
        if self.fd is None and not self.acquire(self.timeout):
            raise _busy(self.path, self.timeout)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _busy(path: Path, waited: float) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"The keyword index {path.parent} is being updated by another process (waited {waited:g} s)",
        guidance="Retry when the other process's query or ingest has finished.")


def _locked_catch_up(c: Container, collection: str, col: Any, index: KeywordIndex) -> None:
    """Catch up under the folder's lock; while another process holds it, answer from its commit as soon as
    that commit is at the current revision."""
    if index.path is None:
        catch_up(c, collection, col, index)
        return
    lock = _file_lock(index.path.parent, index.weights)
    deadline = time.monotonic() + CATCH_UP_WAIT_SECONDS
    while not lock.acquire(LOCK_POLL_SECONDS):
        index.reload()
        if index.state.revision == c.store.revision(collection):
            return
        if time.monotonic() > deadline:
            raise _busy(lock.path, CATCH_UP_WAIT_SECONDS)
    with lock:
        index.reload()
        catch_up(c, collection, col, index)


def catch_up(c: Container, collection: str, col: Any, index: KeywordIndex) -> CatchUp | None:
    """Bring `index` to the collection's current revision (the caller holds the lock); None if it was there."""
    started, t0 = time.time_ns(), time.perf_counter()
    store = c.store
    rev = store.revision(collection)
    state = index.state
    if state.revision == rev and state.collection == str(col.id):
        return None
    if not index.has_state or state.collection != str(col.id):  # new, or saved before ids were kept
        done = _build_retrying(store, collection, col, index, rev, started)
    else:
        done = _update(store, collection, col, index, rev, started)
    done.seconds = time.perf_counter() - t0
    RECENT.append(done)
    log.info("keyword index of %s caught up (%s): %d documents, %d chunks in %.2f s", collection, done.mode,
             len(done.documents), done.chunks, done.seconds)
    if done.mode == "build" and index.path is not None:
        prune_collections(c, index.path.parent)
    return done


def _build_retrying(store: Any, collection: str, col: Any, index: KeywordIndex, rev: str, started: int) -> CatchUp:
    """`_build`, started again if its scan lost its place (`chunks.rescanning`: another process deleted or re-added
    many records behind it, e.g. a bulk rewrite through a server); a failed attempt committed nothing."""
    return chunk_pages.rescanning(lambda: _build(store, collection, col, index, rev, started))


def _build(store: Any, collection: str, col: Any, index: KeywordIndex, rev: str, started: int) -> CatchUp:
    """A first build: every visible chunk, read page by page (never the whole collection in memory), then any
    chunk a manifest counts that the scan did not give, by id, in the same commit (`_every_chunk`)."""
    records = _whole_log(store, collection, started)  # before the manifests: see _applied
    manifests = _manifests(store, collection)
    current = {d: m["content_hash"] for d, m in manifests.items()}
    tally = _Tally(collection, manifests)
    state = _new_state(store, rev, _announced_at(records, rev, started), str(col.id), records)
    written = index.apply([], _every_chunk(col, collection, current, tally), state, current, replace_all=True)
    repaired = _repair(store, collection, col, index, tally, state)
    return CatchUp(collection, "build", sorted(current), written.chunks + repaired, entries=written.entries,
                   state_bytes=written.state_bytes, manifests=len(current))


class _Tally:
    """Which chunks of each document's current version a build has read, as a bitmask of chunk numbers (the
    id's last part, registry.chunk_ids) per document: one dict entry per document, keyed by the manifests' own
    strings, with masks under 256 (documents of <= 8 chunks) Python's shared small ints (~40 MB at 1M
    documents, where a set of the chunk ids read cost ~100 bytes per chunk). Why: a scan that misses chunks
    (a Chroma server's offsets shift under other writers' deletes, finding 1) made the build give a document
    its current hash with chunks missing, and no later catch-up read it again; the build now knows, before it
    commits, which chunks it lacks."""

    def __init__(self, collection: str, manifests: dict[str, dict[str, Any]]) -> None:
        self.collection, self.manifests = collection, manifests
        self.masks: dict[str, int] = dict.fromkeys(manifests, 0)
        self.unnumbered: dict[str, int] = {}  # chunks whose id is not chunk_ids' form (hand-made stores)

    def take(self, doc: str, cid: str) -> bool:
        """Count a chunk read; False if it was read already (never added twice)."""
        number = _chunk_number(cid)
        if number is None:
            self.unnumbered[doc] = self.unnumbered.get(doc, 0) + 1
            return True
        mask = self.masks.get(doc, 0)
        if mask >> number & 1:
            return False
        self.masks[doc] = mask | 1 << number
        return True

    def short(self) -> dict[str, list[str]]:
        """{document: ids of its current chunks not read} for documents with fewer chunks read than counted."""
        out = {}
        for doc, m in self.manifests.items():  # a manifest without chunk_count (hand-made) cannot be checked
            mask = self.masks.get(doc, 0)
            if mask.bit_count() + self.unnumbered.get(doc, 0) < int(m.get("chunk_count") or 0):
                out[doc] = [cid for i, cid in enumerate(version_ids(self.collection, [m])) if not mask >> i & 1]
        return out


def _chunk_number(cid: str) -> int | None:
    tail = cid.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def _every_chunk(col: Any, collection: str, current: dict[str, str], tally: _Tally) -> Iterator[tuple[str, Chunk]]:
    """(document, chunk) of every visible chunk: the scan, then the chunks it missed, by id."""
    for cid, text, meta in chunk_pages.records(col, ["documents", "metadatas"]):
        doc = str(meta.get("source_document"))
        if chunk_pages.is_visible(meta, current) and tally.take(doc, cid):
            yield doc, Chunk(cid, text, meta)
    missing = [cid for ids in tally.short().values() for cid in ids]
    if missing:
        log.info("keyword build of %s: %d chunks the scan did not give, read by id", collection, len(missing))
    for cid, text, meta in chunk_pages.records(col, ["documents", "metadatas"], ids=missing):
        doc = str(meta.get("source_document"))
        if chunk_pages.is_visible(meta, current) and tally.take(doc, cid):
            yield doc, Chunk(cid, text, meta)


def _repair(store: Any, collection: str, col: Any, index: KeywordIndex, tally: _Tally, state: IndexState) -> int:
    """Re-apply, from their manifests now, the documents the build still lacks chunks of because they changed
    or went after it read their manifests (the old version's chunks are deleted); returns chunks added. The
    change log names them too, so a kill before this commit only leaves them to the next catch-up. A document
    whose manifest did not change yet lacks chunks is damaged in the store (`doctor` finds it): left as read."""
    short = tally.short()
    if not short:
        return 0
    now = _manifests(store, collection, set(short))
    changed = sorted(d for d in short if d not in now or now[d]["content_hash"] != tally.manifests[d]["content_hash"])
    if len(changed) < len(short):
        log.warning("keyword build of %s: %d documents lack chunks in the store", collection,
                    len(short) - len(changed))
    if not changed:
        return 0
    versions = {d: now[d]["content_hash"] for d in changed if d in now}
    written = index.apply(changed, _current_chunks(col, collection, [now[d] for d in versions]), state, versions)
    return written.chunks


def _update(store: Any, collection: str, col: Any, index: KeywordIndex, rev: str, started: int) -> CatchUp:
    """The documents that may have changed (from the log, else all), those whose hash differs, re-applied:
    only their state is read (from the log) and only theirs written, so the cost follows the change."""
    state = index.state
    from_log = _logged_documents(store, collection, state, rev, started)
    if from_log is None:
        records = _whole_log(store, collection, started)  # before the manifests: see _applied
        mode, manifests, log_at = "diff", _manifests(store, collection), _announced_at(records, rev, started)
        held, skipped = index.all_versions(), 0
        candidates = set(manifests) | set(held)
    else:
        mode, (candidates, log_at, records, skipped) = "log", from_log
        manifests = _manifests(store, collection, candidates)
        held = index.versions_of(candidates)
    targets = sorted(d for d in candidates
                     if (manifests[d]["content_hash"] if d in manifests else None) != held.get(d))
    versions = {d: manifests[d]["content_hash"] for d in targets if d in manifests}
    written = index.apply(targets, _current_chunks(col, collection, [manifests[d] for d in versions]),
                          _new_state(store, rev, log_at, str(col.id), records), versions)
    return CatchUp(collection, mode, targets, written.chunks, entries=written.entries,
                   state_bytes=written.state_bytes, manifests=len(manifests) if mode == "diff" else len(candidates),
                   skipped=skipped)


def _skew_ns(store: Any) -> int:
    return (EMBEDDED_SKEW_SECONDS if store.kind == "embedded" else SKEW_SECONDS) * 1_000_000_000


def _logged_documents(store: Any, collection: str, state: IndexState, rev: str,
                      now_ns: int) -> tuple[set[str], int, list[dict[str, Any]], int] | None:
    """The documents the change log names since the index's position (those of records it already applied
    left out), the time of the record announcing `rev`, the records read and how many were skipped; None when
    the log cannot be trusted to name every change (see the module docstring): it must hold the record of the
    index's own revision too, else the log does not continue from the index (the store was restored from a
    backup older than the index: the next write's record announced the current revision and only its
    documents were re-applied, the restore-undone text stayed in the index), and likewise every record the
    index remembers as applied."""
    skew = _skew_ns(store)
    if not state.log_at or now_ns - state.log_at > CHANGE_LOG_SECONDS * 1_000_000_000 - skew:
        return None
    start = min(state.log_at - skew, state.applied_from or state.log_at)  # every remembered record is after it
    records = store.changes_since(collection, start - 1)
    at = {announced(r): int(r["at"]) for r in records}
    applied = set(state.applied)
    if rev not in at or state.revision not in at or not applied <= {_record_id(r) for r in records} \
            or _reset_since(records, state.revision, applied):
        return None
    fresh = [r for r in records if not _skippable(r, applied)]
    return {d for r in fresh for d in r["documents"]}, at[rev], records, len(records) - len(fresh)


def _record_id(record: dict[str, Any]) -> str:
    return str(announced(record))[:APPLIED_ID_CHARS]


def _skippable(record: dict[str, Any], applied: set[str]) -> bool:
    """Whether a record's documents need not be read again: the index applied it, and it is still finished.
    (A store restored from a backup taken mid-write holds the record unfinished, with the manifests from
    before its flip: read again, the restore-undone documents are re-applied.)"""
    return _record_id(record) in applied and finished(record)


def _applied(records: list[dict[str, Any]], log_at: int, skew: int) -> tuple[tuple[str, ...], int]:
    """The records a catch-up remembers as applied: those it read before reading the manifests, finished when
    read (their flips were then in the manifests it compared), stamped inside the next catch-up's window
    (`log_at` - skew on); the newest MAX_APPLIED. A record read before its write flipped (a server has no
    read gate) is not finished, so the next catch-up reads its documents again, as does one that lands
    late (clock skew: stamped inside the window, written after this catch-up)."""
    start = log_at - skew
    done = [r for r in records if int(r["at"]) >= start and finished(r)][-MAX_APPLIED:]
    return tuple(_record_id(r) for r in done), (start if done else 0)


def _new_state(store: Any, rev: str, log_at: int, collection_id: str, records: list[dict[str, Any]]) -> IndexState:
    applied, applied_from = _applied(records, log_at, _skew_ns(store))
    return IndexState(rev, log_at, collection_id, applied, applied_from)


def _reset_since(records: list[dict[str, Any]], held: str, applied: set[str]) -> bool:
    """Whether a reset record (`log_reset`: a change the log cannot name, e.g. `kb reindex`) other than the one
    announcing the index's own revision `held`, and not one the index already applied (a full diff read it),
    is among `records`. Any reset in the window counts, even one stamped a little before `held`'s record:
    under clock skew between server writers its time cannot say it came first, and a missed reset would leave
    the index stale; a needless full diff only costs time."""
    return any(r.get("reset") and r["reset"] != held and not _skippable(r, applied) for r in records)


def _whole_log(store: Any, collection: str, now_ns: int) -> list[dict[str, Any]]:
    """Every change record kept (CHANGE_LOG_SECONDS): builds and full diffs only."""
    return store.changes_since(collection, now_ns - CHANGE_LOG_SECONDS * 1_000_000_000)


def _announced_at(records: list[dict[str, Any]], rev: str, now_ns: int) -> int:
    """When the change record announcing `rev` was written, so the next catch-up finds the index's revision
    in the log; `now_ns` if no record announced it (a bump by a writer of a version before reset records:
    the next catch-up is a full diff again)."""
    return next((int(r["at"]) for r in records if announced(r) == rev), now_ns)


def _manifests(store: Any, collection: str, documents: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """{document: manifest} of the named documents (all of the collection's when None)."""
    if documents is None:
        found = store.registry_find(DOCUMENT, collection).values()
    else:
        found = store.registry_get([document_key(collection, d) for d in sorted(documents)]).values()
    return {m["document"]: m for m in found}


def _current_chunks(col: Any, collection: str, manifests: list[dict[str, Any]]) -> Iterator[tuple[str, Chunk]]:
    """(document, chunk) of each manifest's version, fetched from Chroma by id (PAGE ids per call)."""
    current = {m["document"]: m["content_hash"] for m in manifests}
    for cid, text, meta in chunk_pages.records(col, ["documents", "metadatas"], ids=version_ids(collection, manifests)):
        if chunk_pages.is_visible(meta, current):
            yield str(meta.get("source_document")), Chunk(cid, text, meta)


def prune_collections(c: Container, folder: Path) -> None:
    """Remove the indexes of collections that no longer exist (deleted, or replaced by `kb reindex`, which
    fills a new Chroma collection): without this each reindex left its index behind (~14 MB per 100k chunks)."""
    if folder.parent.is_symlink() or folder.is_symlink():
        return  # never through a link (`_linked`); open_index keeps such an index in memory anyway
    try:
        live = {str(getattr(col, "id", "")) for col in c.store.client.list_collections()}
        for entry in folder.parent.iterdir():
            if entry != folder and entry.name not in live and _COLLECTION_ID.fullmatch(entry.name) \
                    and not entry.is_symlink() and entry.is_dir() and _holds_our_index(entry):
                shutil.rmtree(entry, ignore_errors=True)
    except Exception as exc:  # best effort: a leftover only costs disk
        log.debug("could not prune keyword indexes in %s: %s", folder.parent, exc)


def _holds_our_index(entry: Path) -> bool:
    """Whether a folder holds only what we put in a collection's folder (index folders and their lock files, of
    this layout or older ones): a folder of anything else named like a collection id is not ours to remove."""
    names = [child.name for child in entry.iterdir()]
    return bool(names) and all(_TANTIVY.fullmatch(n) or _OLD_BM25S.fullmatch(n) for n in names)


def forget() -> None:
    """Close every open index (what a new process starts with)."""
    with _open_lock:
        _open.clear()
