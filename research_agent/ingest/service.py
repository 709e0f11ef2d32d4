"""Ingestion: files and folders into a collection, incremental by content hash, atomic per document.

The write side's orchestration: write_documents (chunk ids, metadata and vectors for the new versions, then
storage/writer.py's protocol under the write lock), recovery before new work, ingest_path, prune_missing,
remove_document and reindex_collection. Preparing a file is prepare.py; reading what was ingested is documents.py.

Over 400 lines (~450): the report and progress models (~55 lines) stay with the four write paths that fill
them (ingest, prune, remove, reindex); each path is a few short functions.

The crash tests (tests/test_concurrency.py FAKE_CLI, RA_TEST_KILL_AT) replace the write steps by their names
on this module (_write_intent, _clear_intent, _ensure_dimension, delete_chunks, delete_documents), so the
steps stay names here and reach storage/writer.py through `_steps()`, read at each call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

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
from research_agent.storage import writer

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

EMBED_BATCH_CHUNKS = 256
#: Chunks embedded between two progress reports. One 256-chunk batch used to be a single silent embedding call
#: (the bar sat still for the 75 s of model loading and embedding of a 30-file folder, issue 15); 32 long chunks
#: of all-MiniLM-L6-v2 took 7-10 s on 2 busy CPU cores (load 7), and 96 chunks embedded in slices of 32 took
#: 21.5/16.0 s against 16.3/18.7 s in one call: no cost beyond the noise. A candidate setting.
EMBED_SLICE_CHUNKS = 32


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


def write_documents(c: Container, collection: str, docs: list[PreparedDocument],
                    embedded: Callable[[int, int], None] | None = None) -> int:
    """Embed and write documents; each becomes visible at once when its manifest flips.

    `embedded(done, total)` reports the chunks of this call embedded so far: once before the first slice (the
    model may still be loading) and after each slice. Nothing is written until all are embedded, so an
    exception raised by it (a cancelled MCP call) leaves the collection as it was."""
    if not docs:
        return 0
    open_collection(c, collection)
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
    tell = embedded or (lambda done, total: None)
    tell(0, len(new.ids))
    embedder = c.embedder
    new.vectors = embed_in_slices(embedder, [embedding_text(m, t) for m, t in zip(new.metas, new.texts)],
                                  lambda done: tell(done, len(new.ids)))
    with c.store.write_lock():
        col = open_collection(c, collection)
        recover_interrupted(c, collection, col)
        writer.commit(c.store, col, collection, new, dimension=embedder.dimension, now=now_iso, steps=_steps())
    return len(new.ids)


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
            if recover_interrupted(c, collection, col):
                c.store.bump_revision(collection)


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
    """Read, parse and write each file in batches of about EMBED_BATCH_CHUNKS chunks; problems go to `problem`."""
    pending: list[PreparedDocument] = []
    total = done = committed = 0  # committed: files finished as of the last batch written

    def embedded(chunks: int, batch_chunks: int) -> None:
        share = chunks / batch_chunks if batch_chunks else 1.0
        notify(IngestProgress(stage="embedding", files_done=committed, files_total=len(files),
                              chunks_done=report.chunks_written + chunks, chunks_total=total,
                              files_progress=committed + (done - committed) * share))

    def flush() -> None:
        nonlocal committed
        if pending:
            report.chunks_written += write_documents(c, collection, pending, embedded)
            pending.clear()
            committed = done
            notify(IngestProgress(stage="writing", files_done=done, files_total=len(files),
                                  chunks_done=report.chunks_written, chunks_total=total, files_progress=done))

    for done, (file, document) in enumerate(files, start=1):
        notify(IngestProgress(stage="reading", files_done=done - 1, files_total=len(files),
                              chunks_done=report.chunks_written, chunks_total=total, current=document,
                              files_progress=committed))
        doc = _read_one(c, file, document, existing.get(document_key(collection, document)), report,
                        title=title, single=single, problem=problem)
        if doc is None:
            continue
        report.updated += document_key(collection, document) in existing
        report.added += document_key(collection, document) not in existing
        report.documents.append(document)
        pending.append(doc)
        total += len(doc.chunks)
        if sum(len(d.chunks) for d in pending) >= EMBED_BATCH_CHUNKS:
            flush()
    flush()
    notify(IngestProgress(stage="done", files_done=len(files), files_total=len(files),
                          chunks_done=report.chunks_written, chunks_total=total, files_progress=len(files)))


def _read_one(c: Container, file: Path, document: str, prev: dict[str, Any] | None, report: IngestReport, *,
              title: str | None, single: bool, problem: Callable[..., None]) -> PreparedDocument | None:
    """The prepared document, or None (unchanged, or a problem reported through `problem`)."""
    try:
        raw = folder.read_regular_file(file, check_size(c, file))
        if prev and prev["content_hash"] == content_hash(raw + (title or "").encode()):
            report.unchanged += 1
            return None
        doc = prepare_file(c, file, document, title=title, raw=raw)
        if not doc.chunks:
            raise DocumentError("no text content", guidance="Add text to the file or exclude it.")
        report.warnings.extend(FileProblem(path=document, reason=w) for w in doc.warnings)
        return doc
    except OSError as exc:
        reason, failed, drop = f"unreadable: {exc.strerror or exc}", True, False
        error = DocumentError(f"Cannot read {document}: {exc.strerror or exc}", path=document)
    except DocumentError as exc:
        reason, failed, drop, error = exc.message, False, True, exc
    except ResearchAgentError:  # the model or the store, not this file: the whole run stops with its code
        raise
    except Exception as exc:  # a parser bug or a pathological file (deep HTML): that file fails, not the run
        log.exception("ingesting %s failed", document)
        reason, failed, drop = f"{type(exc).__name__}: {str(exc)[:200]}", True, True
        error = DocumentError(f"Cannot ingest {document}: {reason}", path=document)
    problem(document, reason, failed=failed, drop=drop)
    if single and drop and prev:  # add-document: drop the stale old version (see ingest_path), then raise
        delete_documents(c, report.collection, {document_key(report.collection, document): prev})
        raise DocumentError(f"{error.message}; its previous version was removed from {report.collection!r}",
                            **error.data) from None
    if single:
        raise error from None
    return None


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
    forever after (issue 11 item 4). A kill at any step is recovered by `Store.recover_swaps`.
    """
    started = time.perf_counter()
    c.store.refresh()
    open_collection(c, collection, check_model=False)  # fail fast on an unknown name
    embedder = c.embedder  # loaded before the lock: other writers need not wait for the model
    notify = progress or (lambda p: None)
    with c.store.write_lock():
        c.store.recover_swaps(only=collection)
        old = open_collection(c, collection, check_model=False)
        recover_interrupted(c, collection, old)
        manifests = c.store.registry_find("document", collection)
        total = sum(int(m["chunk_count"]) for m in manifests.values())
        report = IngestReport(collection=collection, files_seen=len(manifests))
        meta = {k: v for k, v in (old.metadata or {}).items() if not k.startswith("hnsw:")}
        meta.update(embedding_model=c.settings.embedding_model, embedding_backend=c.settings.embedding_backend,
                    embedding_dimension=embedder.dimension)
        # A new dimension needs a new Chroma collection: fill a working copy, then swap names.
        new = c.store.create_swap_copy(collection, meta)
        try:
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
        except BaseException:
            c.store.delete_collection(new.name)
            raise
        c.store.swap_in(old, new, collection)
        c.store.bump_revision(collection)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _reembed(embedder: Any, got: dict[str, Any], new: Any, embedded: Callable[[int], None]) -> None:
    """One document's chunks (`got`, read from the old collection) embedded slice by slice into `new`."""
    if got["ids"]:
        vectors = embed_in_slices(embedder, [embedding_text(md, t) for md, t in zip(got["metadatas"],
                                                                                     got["documents"])], embedded)
        new.upsert(ids=got["ids"], embeddings=vectors, documents=got["documents"], metadatas=got["metadatas"])
