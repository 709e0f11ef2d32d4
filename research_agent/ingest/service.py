"""Ingestion: files and folders into a collection, incremental by content hash, atomic per document.

The write side's orchestration: write_documents (chunk ids, metadata and vectors for the new versions, then
storage/writer.py's protocol under the write lock), recovery before new work, ingest_path, prune_missing,
remove_document and reindex_collection. Preparing a file is prepare.py; reading what was ingested is documents.py.

Over 400 lines (~650): the report and progress models (~55 lines) stay with the four write paths that fill
them (ingest, prune, remove, reindex); each path is a few short functions. A folder's read-embed-write pipeline
(~200 lines: _Run, _inline, _overlapped and their two threads) is the ingest path's; it could move to its own
module (ingest/pipeline.py) once the architecture map names it.

A folder ingest overlaps its stages: a reader thread reads, parses and chunks the next files, an encoder thread
embeds batch k+1 while the calling thread commits batch k (all Chroma calls stay in the calling thread), so the
wall time approaches the pure encode time (benchmarks/ingest.py) with at most 6 batches held in memory.

The crash tests (tests/test_concurrency.py FAKE_CLI, RA_TEST_KILL_AT) replace the write steps by their names
on this module (_write_intent, _clear_intent, _ensure_dimension, delete_chunks, delete_documents), so the
steps stay names here and reach storage/writer.py through `_steps()`, read at each call.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from pydantic import BaseModel

from research_agent.catalog.collections import Deleted, now_iso, open_collection
from research_agent.errors import DocumentError, ResearchAgentError
from research_agent.ingest import folder
from research_agent.ingest.documents import find_document
from research_agent.ingest.prepare import (
    PreparedDocument,
    check_allowed,
    check_size,
    chunk_ids,
    chunk_metadata,
    content_hash,
    document_key,
    embedding_text,
    prepare_file,
    source_name,
    version_ids,
)
from research_agent.storage import leases, swaps, writer

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

EMBED_BATCH_CHUNKS = 256
#: Chunks embedded between two progress reports. One 256-chunk batch used to be a single silent embedding call
#: (the bar sat still for the 75 s of model loading and embedding of a 30-file folder, issue 15); 32 long chunks
#: of all-MiniLM-L6-v2 took 7-10 s on 2 busy CPU cores (load 7), and 96 chunks embedded in slices of 32 took
#: 21.5/16.0 s against 16.3/18.7 s in one call: no cost beyond the noise. A candidate setting.
EMBED_SLICE_CHUNKS = 32
#: Read, parse and chunk a folder in one thread and embed in another while the calling thread commits the batch
#: before (a candidate setting). False runs the same steps one after another in the calling thread: the path
#: tests/test_ingest_pipeline.py compares against.
OVERLAP = True
#: Batches read ahead of the encoder, and batches embedded (or being embedded) ahead of their commit. Counted:
#: at most READ_AHEAD_BATCHES + ENCODED_AHEAD + 3 = 6 batches are alive at once (one the reader hands over, one the
#: encoder holds while it waits for room, the one just committed), whatever the folder's size
#: (tests/test_ingest_memory.py; 39 with both set to 1,000). Candidate settings.
READ_AHEAD_BATCHES = 1
ENCODED_AHEAD = 2
#: Seconds the threads of an ingest that ended early (an error, Ctrl-C, a cancelled call) are waited for: the
#: encoder stops after its current slice, a few seconds, so the process never exits while torch runs in a thread.
THREAD_JOIN_SECONDS = 30.0
_POLL_SECONDS = 0.2  # how often a waiting thread looks at the stop flag


class IngestProgress(BaseModel):
    """One progress report. Stages: reading (a file is being read), embedding (after each slice of
    EMBED_SLICE_CHUNKS chunks), writing (a batch committed), reindexing (a document re-embedded), done."""

    stage: str
    files_done: int  # files finished: committed, unchanged or skipped (reading: before the current one)
    files_total: int
    chunks_done: int  # chunks committed; while embedding, chunks embedded
    chunks_total: int  # chunks read so far (reindex: all chunks of the collection)
    current: str = ""
    # While embedding: files_done plus the files of the batch in the share of its chunks embedded, so a bar in
    # files (a total fixed once the folder is walked) moves during the embedding too.
    files_progress: float = 0.0


class FileProblem(BaseModel):
    """One file or folder the run could not use (or, in `not_pruned`, did not remove), and why."""

    path: str
    reason: str


class IngestReport(BaseModel):
    collection: str
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    skipped: list[FileProblem] = []
    failed: list[FileProblem] = []
    chunks_written: int = 0
    files_seen: int = 0
    seconds: float = 0.0
    documents: list[str] = []
    # Documents removed: gone with --prune, or stale (their file turned empty, oversized, undecodable...).
    removed_documents: list[str] = []
    # --prune candidates left in place: not selected by this run, below an unreadable folder, still existing.
    not_pruned: list[FileProblem] = []
    # Files ingested whole but with a problem worked around (front matter that did not parse was ignored...).
    warnings: list[FileProblem] = []
    # kb prune --dry-run: removed_documents lists what would be removed; nothing was (removed is 0).
    dry_run: bool = False


ProgressFn = Callable[[IngestProgress], None]


# -- writing: what to write is prepared here; the order of the steps is storage/writer.py's -----------
# The write steps as this module's names: the crash tests replace them here (see the module docstring), and
# _steps() hands whatever these names hold now to the protocol.
_write_intent = writer.write_intent
_clear_intent = writer.clear_intent
_ensure_dimension = writer.ensure_dimension
delete_chunks = writer.delete_chunks
STALE_INTENT_SECONDS = writer.STALE_INTENT_SECONDS


def _steps() -> writer.Steps:
    return writer.Steps(write_intent=_write_intent, clear_intent=_clear_intent, ensure_dimension=_ensure_dimension,
                        delete_chunks=delete_chunks)


def embed_in_slices(embedder: Any, texts: list[str], embedded: Callable[[int], None]) -> list[list[float]]:
    """The vectors of `texts` in their order, embedded EMBED_SLICE_CHUNKS at a time, `embedded(n)` after each
    slice. Longest texts first, as sentence-transformers orders its own batches, so a slice pads little."""
    vectors: list[list[float]] = [[] for _ in texts]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), EMBED_SLICE_CHUNKS):
        part = order[start:start + EMBED_SLICE_CHUNKS]
        for i, vector in zip(part, embedder.embed_documents([texts[i] for i in part])):
            vectors[i] = vector
        embedded(start + len(part))
    return vectors


def _versions(collection: str, docs: list[PreparedDocument]) -> writer.Versions:
    """What one write of `docs` commits, except the vectors: chunk ids, texts, metadata and manifests."""
    new = writer.Versions()
    for doc in docs:
        for seq, (cid, chunk) in enumerate(zip(chunk_ids(collection, doc.document, doc.content_hash, len(doc.chunks)),
                                               doc.chunks)):
            new.ids.append(cid)
            new.texts.append(chunk.text)
            new.metas.append(chunk_metadata(collection, doc, chunk, seq))
        new.manifests[document_key(collection, doc.document)] = {
            "document": doc.document, "title": doc.title, "kind": doc.kind, "source": doc.source, "path": doc.path,
            "content_hash": doc.content_hash, "chunk_count": len(doc.chunks), "collection": collection,
            "extra": doc.extra}
    return new


def _embed(embedder: Any, new: writer.Versions, tell: Callable[[int, int], None]) -> None:
    """Fill `new.vectors`, telling `tell(done, total)` once before the first slice and after each one."""
    tell(0, len(new.ids))
    new.vectors = embed_in_slices(embedder, [embedding_text(m, t) for m, t in zip(new.metas, new.texts)],
                                  lambda done: tell(done, len(new.ids)))


def commit_versions(c: Container, collection: str, new: writer.Versions, dimension: int) -> int:
    """One write through storage/writer.py's protocol, under the write lock, after recovering dead writers."""
    with c.store.write_lock():
        col = open_collection(c, collection)
        recover_interrupted(c, collection, col)
        writer.commit(c.store, col, collection, new, dimension=dimension, now=now_iso, steps=_steps())
    return len(new.ids)


def write_documents(c: Container, collection: str, docs: list[PreparedDocument],
                    embedded: Callable[[int, int], None] | None = None) -> int:
    """Embed and write documents; each becomes visible at once when its manifest flips.

    `embedded(done, total)` reports the chunks of this call embedded so far: once before the first slice (the
    model may still be loading) and after each slice. Nothing is written until all are embedded, so an
    exception raised by it (a cancelled MCP call) leaves the collection as it was."""
    if not docs:
        return 0
    open_collection(c, collection)
    new = _versions(collection, docs)
    embedder = c.embedder
    _embed(embedder, new, embedded or (lambda done, total: None))
    return commit_versions(c, collection, new, embedder.dimension)


def recover_interrupted(c: Container, collection: str, col: Any, *, min_age: float | None = None) -> int:
    """Undo writes that were killed midway (under the write lock): writer.recover_interrupted, with intents
    older than STALE_INTENT_SECONDS taken for dead writers' on a Chroma server, every one in embedded mode."""
    if min_age is None:
        min_age = STALE_INTENT_SECONDS if c.settings.server_mode else 0.0
    return writer.recover_interrupted(c.store, collection, col, min_age=min_age, steps=_steps())


def recover_if_needed(c: Container, collection: str) -> None:
    """Recover a crashed writer's leftovers before new work (cheap when there are none)."""
    if c.store.registry_find("intent", collection):
        col = open_collection(c, collection, check_model=False)
        with c.store.write_lock():
            # recover_interrupted logs the documents it settled and bumps the revision itself; a second bump
            # here named no change, so every keyword index fell back to a full manifest diff.
            recover_interrupted(c, collection, col)


def delete_documents(c: Container, collection: str, manifests: dict[str, dict[str, Any]]) -> int:
    """Remove documents: manifest first (invisible at once), then their chunks (writer.delete)."""
    if not manifests:
        return 0
    col = open_collection(c, collection, check_model=False)
    with c.store.write_lock():
        recover_interrupted(c, collection, col)
        return writer.delete(c.store, col, collection, manifests, steps=_steps())


# -- the service --------------------------------------------------------------------------------
def ingest_path(c: Container, path: str | Path, collection: str, *, recursive: bool = False,
                include: Iterable[str] = (), exclude: Iterable[str] = (), prune: bool = False,
                title: str | None = None, strict: bool = False,
                progress: ProgressFn | None = None, allowed_roots: list[Path] | None = None) -> IngestReport:
    """Ingest a file or a folder; unchanged files are skipped by content hash.

    One entry's failure of any kind is a problem in the report, never the end of the folder (issue 11 item 12).
    A file that turned unusable (empty, oversized, undecodable, unparsable, not a regular file) loses its old
    version, so search never returns text the file no longer has; one that cannot be read right now (EACCES,
    EIO) keeps it, flagged. `prune` removes only documents whose files are really gone (folder.why_not_gone).
    """
    started = time.perf_counter()
    target = check_allowed(Path(path), allowed_roots)
    if not target.exists():
        raise DocumentError(f"No such file or folder: {folder.display(str(path))}",
                            guidance=_missing_target_guidance(target, collection, prune),
                            path=folder.display(str(path)[:200]))
    c.store.refresh()
    open_collection(c, collection)  # fail before any work on an unknown collection or model mismatch
    recover_if_needed(c, collection)
    report = IngestReport(collection=collection)
    existing = c.store.registry_find("document", collection)
    walk, files = _plan(c, target, collection, existing, recursive=recursive, include=include, exclude=exclude,
                        allowed_roots=allowed_roots)
    report.files_seen = len(files)
    stale: dict[str, dict[str, Any]] = {}
    seen = {document_key(collection, d) for _, d in files}

    def problem(document: str, reason: str, *, failed: bool, drop: bool) -> None:
        key = document_key(collection, document)
        seen.add(key)
        if key in existing and drop:
            stale[key] = existing[key]
            reason += " (its previous version was removed from the index)"
        elif key in existing:
            reason += " (the previous version stays indexed)"
        (report.failed if failed else report.skipped).append(FileProblem(path=document, reason=reason))

    for p in walk.problems if walk else ():
        problem(folder.display(source_name(p.path, target, walk.prefix)), p.reason, failed=p.failed, drop=not p.failed)
    _read_and_write(c, collection, files, existing, report, title=title, single=walk is None, problem=problem,
                    notify=progress or (lambda p: None))
    gone, kept = folder.prune_plan(walk, existing, seen) if prune and walk else ({}, [])
    report.not_pruned = [FileProblem(path=d, reason=r) for d, r in kept]
    delete_documents(c, collection, {**stale, **gone})
    report.removed = len(stale) + len(gone)
    report.removed_documents = sorted(m["document"] for m in {**stale, **gone}.values())
    report.seconds = round(time.perf_counter() - started, 3)
    if strict and (report.skipped or report.failed):
        raise DocumentError(
            f"{len(report.skipped)} skipped and {len(report.failed)} failed files (--strict)",
            guidance="Fix or exclude the files listed in data.report, or drop --strict.",
            report=report.model_dump(mode="json"),
        )
    return report


def _missing_target_guidance(target: Path, collection: str, prune: bool) -> str:
    if not prune:
        return "Check the path."
    return (f"Check the path. If the folder was moved or deleted, `research-agent kb prune --collection "
            f"{collection} --under {folder.display(str(target))}` removes what was ingested from it "
            "(--dry-run first shows what).")


def prune_missing(c: Container, collection: str, under: str | Path | None = None, *, dry_run: bool = False,
                  allowed_roots: list[Path] | None = None) -> IngestReport:
    """Remove the file documents of `collection` whose recorded file is really gone (folder.why_kept_missing),
    wherever they were ingested from: the way out after renaming or moving an ingested folder, which
    `add-folder --prune` cannot give (it only sees the folder it walks). Research and notes are never touched.

    `under` limits it to one folder and confirms that folder's files are gone for good, so documents of a
    drive that looks unmounted are removed only then. Removal goes through delete_documents (one intent, the
    manifests first), so a kill -9 midway leaves either the old documents or none, never half of one.
    """
    started = time.perf_counter()
    scope = _prune_scope(under, allowed_roots)
    c.store.refresh()
    open_collection(c, collection, check_model=False)
    recover_if_needed(c, collection)
    report = IngestReport(collection=collection, dry_run=dry_run)
    with contextlib.nullcontext() if dry_run else c.store.write_lock():  # the plan sees what the delete deletes
        manifests = c.store.registry_find("document", collection)
        gone, kept = folder.missing_plan(manifests, scope, allowed_roots)
        if not dry_run:
            delete_documents(c, collection, gone)
    report.files_seen = sum(1 for m in manifests.values() if m.get("kind") == "document" and m.get("path"))
    report.removed = 0 if dry_run else len(gone)
    report.removed_documents = sorted(m["document"] for m in gone.values())
    report.not_pruned = [FileProblem(path=d, reason=r) for d, r in kept]
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _prune_scope(under: str | Path | None, allowed_roots: list[Path] | None) -> Path | None:
    """`under` resolved (it need not exist any more) and checked against the allowed roots; a top-level folder
    is refused, since naming it would confirm as gone every drive mounted below it."""
    if under is None:
        return None
    scope = check_allowed(Path(under), allowed_roots)
    if len(scope.parts) <= folder.MOUNT_DEPTH:
        raise DocumentError(f"--under {folder.display(str(scope))} is a top-level folder",
                            guidance="Name the folder the documents were ingested from (as kb list-documents "
                                     "shows their paths), not a mount root.", path=folder.display(str(scope)))
    return scope


def _plan(c: Container, target: Path, collection: str, existing: dict[str, dict[str, Any]], *, recursive: bool,
          include: Iterable[str], exclude: Iterable[str],
          allowed_roots: list[Path] | None) -> tuple[folder.FolderWalk | None, list[tuple[Path, str]]]:
    """The walk (None for a single file) and the (file, document key) pairs to read."""
    if not target.is_dir():
        key = folder.file_key(target, source_name(target, None), existing, lambda d: document_key(collection, d))
        return None, [(target, key)]
    walk = folder.walk_folder(target, recursive=recursive, include=include, exclude=exclude,
                              allowed_roots=allowed_roots)
    if len(walk.files) > c.settings.max_files_per_run:
        raise DocumentError(
            f"{len(walk.files)} files exceed the limit of {c.settings.max_files_per_run} per run",
            guidance="Narrow the run with --include/--exclude or raise RESEARCH_AGENT_MAX_FILES_PER_RUN.",
        )
    walk.prefix = folder.folder_prefix(target, existing)
    return walk, [(f, source_name(f, target, walk.prefix)) for f in walk.files]


def _read_and_write(c: Container, collection: str, files: list[tuple[Path, str]], existing: dict[str, dict[str, Any]],
                    report: IngestReport, *, title: str | None, single: bool, problem: Callable[..., None],
                    notify: ProgressFn) -> None:
    """Read, parse, embed and write each file in batches of about EMBED_BATCH_CHUNKS chunks, overlapped (see
    _overlapped) for a folder; problems go to `problem`. Reports and commits follow the file order either way."""
    embedder = c.embedder  # loaded here, once, before any thread asks for it
    run = _Run(c, collection, len(files), existing, report, single=single, problem=problem, notify=notify,
               dimension=embedder.dimension)
    batches = _batched(c, collection, files, existing, title)
    (_inline if single or not OVERLAP else _overlapped)(run, batches, functools.partial(_encode_batch, embedder))
    run.progress("done", files_done=len(files), files_progress=len(files))


@dataclass
class _Problem:
    """Why one file was not used: `failed` (report.failed, else skipped), `drop` (its old version goes)."""

    reason: str
    failed: bool
    drop: bool
    error: DocumentError


@dataclass
class _Batch:
    """Whole documents of about EMBED_BATCH_CHUNKS chunks, written in one commit."""

    new: writer.Versions
    files_done: int  # files finished once it is committed: up to the one that filled it (all, for the last)


_UNCHANGED = "unchanged"
_END = ("end",)


class _Stopped(Exception):
    """The run ended early (an error, Ctrl-C, a cancelled call): the embedding thread stops after its slice."""


def _prepare_one(c: Container, file: Path, document: str, prev: dict[str, Any] | None,
                 title: str | None) -> PreparedDocument | _Problem | str:
    """One file read and prepared: its document, _UNCHANGED, or the _Problem that keeps it out. Errors of the
    model or the store (ResearchAgentError other than DocumentError) propagate: the whole run stops."""
    try:
        raw = folder.read_regular_file(file, check_size(c, file))
        if prev and prev["content_hash"] == content_hash(raw + (title or "").encode()):
            return _UNCHANGED
        doc = prepare_file(c, file, document, title=title, raw=raw)
        if not doc.chunks:
            raise DocumentError("no text content", guidance="Add text to the file or exclude it.")
        return doc
    except OSError as exc:
        error = DocumentError(f"Cannot read {document}: {exc.strerror or exc}", path=document)
        return _Problem(f"unreadable: {exc.strerror or exc}", failed=True, drop=False, error=error)
    except DocumentError as exc:
        return _Problem(exc.message, failed=False, drop=True, error=exc)
    except ResearchAgentError:
        raise
    except Exception as exc:  # a parser bug or a pathological file (deep HTML): that file fails, not the run
        log.exception("ingesting %s failed", document)
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        return _Problem(reason, failed=True, drop=True,
                        error=DocumentError(f"Cannot ingest {document}: {reason}", path=document))


def _batched(c: Container, collection: str, files: list[tuple[Path, str]], existing: dict[str, dict[str, Any]],
             title: str | None) -> Iterator[tuple[Any, ...]]:
    """("file", n, document, outcome) for each file in order, and ("batch", _Batch) each time the documents
    read since the last batch reach EMBED_BATCH_CHUNKS chunks, and once at the end for the rest."""
    docs: list[PreparedDocument] = []
    for index, (file, document) in enumerate(files, start=1):
        outcome = _prepare_one(c, file, document, existing.get(document_key(collection, document)), title)
        yield ("file", index, document, outcome)
        if isinstance(outcome, PreparedDocument):
            docs.append(outcome)
            if sum(len(d.chunks) for d in docs) >= EMBED_BATCH_CHUNKS:
                yield ("batch", _Batch(_versions(collection, docs), index))
                docs = []
    if docs:
        yield ("batch", _Batch(_versions(collection, docs), len(files)))


def _encode_batch(embedder: Any, batch: _Batch, post: Callable[[tuple[Any, ...]], None],
                  stop: threading.Event | None = None) -> None:
    """Embed one batch: ("slice", batch, chunks) before the first slice and after each, then ("encoded", batch)."""
    def tell(done: int, total: int) -> None:
        if stop is not None and stop.is_set():
            raise _Stopped
        post(("slice", batch, done))

    _embed(embedder, batch.new, tell)
    post(("encoded", batch))


class _Run:
    """The calling thread's side of an ingest: the report, the progress events and the commits (Chroma is used
    from this thread only: the store's exclusive use belongs to a thread, locks.py), in file order."""

    def __init__(self, c: Container, collection: str, files_total: int, existing: dict[str, dict[str, Any]],
                 report: IngestReport, *, single: bool, problem: Callable[..., None], notify: ProgressFn,
                 dimension: int) -> None:
        self.c, self.collection, self.files_total = c, collection, files_total
        self.existing, self.report = existing, report
        self.single, self.problem, self.notify, self.dimension = single, problem, notify, dimension
        self.total = 0  # chunks read so far
        self.committed = 0  # files finished as of the last commit
        self.written: Callable[[], None] = lambda: None  # told after each commit (the overlapped path's room)

    def progress(self, stage: str, **fields: Any) -> None:
        self.notify(IngestProgress(stage=stage, files_total=self.files_total, chunks_done=fields.pop(
            "chunks_done", self.report.chunks_written), chunks_total=self.total, **fields))

    def handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "file":
            self._file(*event[1:])
        elif kind == "slice":
            batch, done = event[1:]
            share = done / len(batch.new.ids) if batch.new.ids else 1.0
            self.progress("embedding", files_done=self.committed, chunks_done=self.report.chunks_written + done,
                          files_progress=self.committed + (batch.files_done - self.committed) * share)
        elif kind == "encoded":
            self.report.chunks_written += commit_versions(self.c, self.collection, event[1].new, self.dimension)
            self.committed = event[1].files_done
            self.written()
            _return_freed_memory()
            self.progress("writing", files_done=self.committed, files_progress=self.committed)
        elif kind == "raise":
            raise event[1]

    def _file(self, index: int, document: str, outcome: PreparedDocument | _Problem | str) -> None:
        self.progress("reading", files_done=index - 1, current=document, files_progress=self.committed)
        key = document_key(self.collection, document)
        if outcome == _UNCHANGED:
            self.report.unchanged += 1
        elif isinstance(outcome, _Problem):
            self._problem(document, self.existing.get(key), outcome)
        else:
            self.report.warnings.extend(FileProblem(path=document, reason=w) for w in outcome.warnings)
            self.report.updated += key in self.existing
            self.report.added += key not in self.existing
            self.report.documents.append(document)
            self.total += len(outcome.chunks)

    def _problem(self, document: str, prev: dict[str, Any] | None, p: _Problem) -> None:
        self.problem(document, p.reason, failed=p.failed, drop=p.drop)
        if self.single and p.drop and prev:  # add-document: drop the stale old version (see ingest_path), then raise
            delete_documents(self.c, self.collection, {document_key(self.collection, document): prev})
            raise DocumentError(f"{p.error.message}; its previous version was removed from {self.collection!r}",
                                **p.error.data) from None
        if self.single:
            raise p.error from None


def _return_freed_memory() -> None:
    """Hand the heap memory freed by the last batch back to the OS (glibc's malloc_trim; a no-op elsewhere).

    Why: torch's activations for batches of different lengths leave freed but fragmented heap in glibc's
    per-thread arenas, so the resident size crept up with every batch: 24 slices of 32 chunks of 20-200 words
    went 655 -> 759 MB resident without, and stayed at 612 MB with a trim after each (a few ms each)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):  # not glibc (macOS, musl, Windows)
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None
Encode = Callable[..., None]


def _inline(run: _Run, events: Iterator[tuple[Any, ...]], encode: Encode) -> None:
    """Every step in the calling thread, one after another (a single file; OVERLAP off)."""
    for event in events:
        if event[0] == "batch":
            encode(event[1], run.handle)
        else:
            run.handle(event)


def _overlapped(run: _Run, events: Iterator[tuple[Any, ...]], encode: Encode) -> None:
    """Reading and parsing (a thread) and embedding (another) overlap with the commits here, so a folder ingests
    in about the time of its embedding (benchmarks/ingest.py). Memory is bounded whatever the folder's size: the
    reader waits while READ_AHEAD_BATCHES batches wait for the encoder, and the encoder while ENCODED_AHEAD
    batches wait for their commit. An error, Ctrl-C or a cancelled call here stops both threads: a batch is
    committed whole or not at all, so whole documents are left, as in the one-thread path."""
    queued: queue.Queue[Any] = queue.Queue(maxsize=READ_AHEAD_BATCHES)
    posted: queue.Queue[tuple[Any, ...]] = queue.Queue()  # bounded by the two waits above
    room = threading.Semaphore(ENCODED_AHEAD)
    stop = threading.Event()
    run.written = room.release
    threads = [threading.Thread(target=_reader, args=(events, queued, posted, stop), name="ingest-reader", daemon=True),
               threading.Thread(target=_encoder, args=(encode, queued, posted, room, stop), name="ingest-encoder",
                                daemon=True)]
    for thread in threads:
        thread.start()
    try:
        while (event := _next(posted, threads)) is not _END:
            run.handle(event)
    finally:
        stop.set()
        for thread in threads:
            thread.join(THREAD_JOIN_SECONDS)


def _reader(events: Iterator[tuple[Any, ...]], queued: queue.Queue[Any], posted: queue.Queue[tuple[Any, ...]],
            stop: threading.Event) -> None:
    """Thread: file events go straight to the calling thread; batches, and an error ending the reading, go
    through the encoder, so they reach the calling thread after every batch read before them."""
    try:
        for event in events:
            if stop.is_set():
                return
            if event[0] == "batch":
                _put(queued, event[1], stop)
            else:
                posted.put(event)
    except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
        _put(queued, exc, stop)
    finally:
        _put(queued, None, stop)


def _encoder(encode: Encode, queued: queue.Queue[Any], posted: queue.Queue[tuple[Any, ...]],
             room: threading.Semaphore, stop: threading.Event) -> None:
    """Thread: embed each batch in order, after the commit of the one ENCODED_AHEAD before it; always ends _END."""
    try:
        while (item := _get(queued, stop)) is not None:
            if isinstance(item, BaseException):
                posted.put(("raise", item))
                return
            while not room.acquire(timeout=_POLL_SECONDS):
                if stop.is_set():
                    return
            encode(item, posted.put, stop)
    except _Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - the model failed: handed to the calling thread
        posted.put(("raise", exc))
    finally:
        posted.put(_END)


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_SECONDS)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue[Any], stop: threading.Event) -> Any:
    while not stop.is_set():
        try:
            return q.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
    return None


def _next(posted: queue.Queue[tuple[Any, ...]], threads: list[threading.Thread]) -> tuple[Any, ...]:
    """The next event; a RuntimeError instead of a hang should both threads have ended without saying so."""
    while True:
        try:
            return posted.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            if not any(t.is_alive() for t in threads) and posted.empty():
                raise RuntimeError("the ingest threads ended without finishing") from None


def remove_document(c: Container, collection: str, document: str) -> Deleted:
    c.store.refresh()
    recover_if_needed(c, collection)
    found = find_document(c, collection, document)
    removed = delete_documents(c, collection, found)
    return Deleted(deleted=next(iter(found.values()))["document"], kind="document", chunks_removed=removed)


def reindex_collection(c: Container, collection: str, progress: ProgressFn | None = None) -> IngestReport:
    """Re-embed every chunk with the configured model (after the model changed).

    The whole run holds the write lock, taken before the manifests are read: a batch another process
    committed between that read and the lock died with the old collection and was called "unchanged"
    forever after (issue 11 item 4). A kill at any step is recovered by `Store.recover_swaps`. On a Chroma
    server the write lock is this process's only, so the run also holds a reindex lease that other writers
    honour, and catches up before and after the swap with whatever was written anyway (`_server_catch_up`).
    """
    started = time.perf_counter()
    c.store.refresh()
    open_collection(c, collection, check_model=False)  # fail fast on an unknown name
    embedder = c.embedder  # loaded before the lock: other writers need not wait for the model
    lease: Any = (leases.ReindexLease(c.store, collection, stale_intent_seconds=STALE_INTENT_SECONDS)
                  if c.settings.server_mode else _NoLease())
    with c.store.write_lock(), lease:
        c.store.recover_swaps(only=collection)
        old = open_collection(c, collection, check_model=False)
        recover_interrupted(c, collection, old)
        manifests = c.store.registry_find("document", collection)
        _refuse_garbled_manifests(c, collection)
        report = IngestReport(collection=collection, files_seen=len(manifests))
        meta = {k: v for k, v in (old.metadata or {}).items() if not k.startswith("hnsw:")}
        meta.update(embedding_model=c.settings.embedding_model, embedding_backend=c.settings.embedding_backend,
                    embedding_dimension=embedder.dimension)
        # A new dimension needs a new Chroma collection: fill a working copy, then swap names.
        new = c.store.create_swap_copy(collection, meta)
        try:
            _copy_all(embedder, collection, manifests, old, new, report, progress or (lambda p: None), lease)
            settle = (_server_catch_up(c, collection, manifests, old, new, lease) if c.settings.server_mode
                      else None)
        except BaseException:
            c.store.delete_collection(new.name)
            raise
        c.store.swap_in(old, new, collection, settle)
        c.store.bump_revision(collection)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


class _NoLease(contextlib.nullcontext):
    """Embedded mode: the store's file write lock keeps every other writer out; nothing to renew."""

    def renew(self) -> None:
        return None


def _copy_all(embedder: Any, collection: str, manifests: dict[str, dict[str, Any]], old: Any, new: Any,
              report: IngestReport, notify: ProgressFn, lease: Any) -> None:
    """Re-embed each manifest's chunks from `old` into `new`, telling progress and renewing the lease."""
    total = sum(int(m["chunk_count"]) for m in manifests.values())
    for done, m in enumerate(manifests.values(), start=1):
        got = old.get(ids=version_ids(collection, [m]), include=["documents", "metadatas"])
        _reembed(embedder, got, new, lambda chunks: notify(IngestProgress(
            stage="embedding", files_done=done - 1, files_total=len(manifests),
            chunks_done=report.chunks_written + chunks, chunks_total=total, current=m["document"],
            files_progress=done - 1 + chunks / len(got["ids"]))))
        report.chunks_written += len(got["ids"])
        report.updated += 1
        notify(IngestProgress(stage="reindexing", files_done=done, files_total=len(manifests),
                              chunks_done=report.chunks_written, chunks_total=total, current=m["document"],
                              files_progress=done))
        lease.renew()


def _refuse_garbled_manifests(c: Container, collection: str) -> None:
    """A reindex copies the documents reads can see: the chunks of a manifest no read can use (restorable by hand)
    would go with the old collection, so it refuses to start while the collection has one."""
    garbled = c.store.registry_malformed("document", collection)
    if garbled:
        shown = ", ".join(repr(k) for k in garbled[:5]) + (", ..." if len(garbled) > 5 else "")
        raise DocumentError(
            f"Collection {collection!r} has {len(garbled)} document manifest(s) no read can use ({shown}); "
            "nothing was reindexed",
            guidance="Re-ingest those files (a good manifest replaces each record) or restore or delete the records "
                     "(`research-agent doctor` lists them), then reindex.", collection=collection)


def _server_catch_up(c: Container, collection: str, manifests: dict[str, dict[str, Any]], old: Any, new: Any,
                     lease: leases.ReindexLease) -> Callable[[], None]:
    """Copy into `new` what other processes wrote to `old` while it was copied; returns the same catch-up to run
    after the renames, before the old collection (then the backup) is dropped.

    Trigger: server mode, where another machine's writer need not see this process's lock and may miss the
    lease. Why: it flips manifests whose chunks are in `old` only; the swap dropped them (23 documents with a
    manifest and no chunks in the attack run). A writer that resolved the collection before the renames still
    writes into the backup, hence the second catch-up against it.
    """
    copied = dict(manifests)
    copy = functools.partial(_recopy, c.embedder, collection, old, new)
    swaps.catch_up(c.store, collection, copied, new, copy)
    return functools.partial(swaps.settle, c.store, collection, copied, new, copy, lease)


def _recopy(embedder: Any, collection: str, source: Any, target: Any, manifest: dict[str, Any]) -> int:
    """One document's current version re-embedded from `source` into `target` (kept when `target` holds it all:
    a writer wrote it there after the swap); returns the chunks copied."""
    ids = version_ids(collection, [manifest])
    if len(target.get(ids=ids, include=[])["ids"]) == len(ids):
        return 0
    got = source.get(ids=ids, include=["documents", "metadatas"])
    if len(got["ids"]) < len(ids):
        log.warning("reindex of %s: %s has %d of its %d chunks in neither collection", collection,
                    manifest["document"], len(got["ids"]), len(ids))
    _reembed(embedder, got, target, lambda chunks: None)
    return len(got["ids"])


def _reembed(embedder: Any, got: dict[str, Any], new: Any, embedded: Callable[[int], None]) -> None:
    """One document's chunks (`got`, read from the old collection) embedded slice by slice into `new`."""
    if got["ids"]:
        vectors = embed_in_slices(embedder, [embedding_text(md, t) for md, t in zip(got["metadatas"],
                                                                                     got["documents"])], embedded)
        new.upsert(ids=got["ids"], embeddings=vectors, documents=got["documents"], metadatas=got["metadatas"])
