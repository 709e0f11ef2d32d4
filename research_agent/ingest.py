"""Ingestion: files and folders into a collection, incremental by content hash, atomic per document."""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from pydantic import BaseModel

from research_agent.collections import Deleted, now_iso, open_collection
from research_agent.errors import DocumentError

log = logging.getLogger(__name__)

# Directories nobody wants in a knowledge base; .gitignore files add to these.
DEFAULT_EXCLUDES = (".git", ".hg", ".svn", "node_modules", ".venv", "venv", "env", "__pycache__", ".tox",
                    ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "site-packages",
                    ".idea", ".vscode", ".next", "target", ".eggs", "*.egg-info")
EMBED_BATCH_CHUNKS = 256


class IngestProgress(BaseModel):
    stage: str
    files_done: int
    files_total: int
    chunks_done: int
    chunks_total: int
    current: str = ""


class FileProblem(BaseModel):
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


class DocumentInfo(BaseModel):
    document: str
    title: str
    kind: str
    chunk_count: int
    content_hash: str
    source: str
    path: str | None = None
    updated_at: str


class DocumentList(BaseModel):
    collection: str
    documents: list[DocumentInfo]


ProgressFn = Callable[[IngestProgress], None]


@dataclass
class PreparedDocument:
    """A parsed and chunked document ready to embed and write."""

    document: str            # the key within the collection: a relative path, or research:<hash>
    title: str
    kind: str                # document | research | note
    source: str              # where it came from (path, URL, citation)
    content_hash: str
    chunks: list[Any]        # research_agent.chunking.Chunk
    path: str | None = None  # absolute file path, for prune and watch
    extra: dict[str, Any] = field(default_factory=dict)


def document_key(collection: str, document: str) -> str:
    return f"document:{collection}:{document}"


def chunk_ids(collection: str, document: str, content_hash: str, count: int) -> list[str]:
    """Ids from (collection, document, content version, chunk number): a new version never overwrites the old."""
    base = hashlib.sha1(f"{collection}\n{document}".encode()).hexdigest()[:16]
    return [f"{base}-{content_hash[:12]}-{i:05d}" for i in range(count)]


def content_hash(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


# -- paths ------------------------------------------------------------------------------------
def check_allowed(path: Path, allowed_roots: list[Path] | None) -> Path:
    """Resolve `path` (symlinks too) and refuse anything outside the allowed roots."""
    raw = str(path)
    if "\x00" in raw:
        raise DocumentError("Path contains a NUL byte", guidance="Pass a plain file or folder path.")
    try:
        resolved = path.expanduser().resolve()
        resolved.exists()  # ENAMETOOLONG and friends surface here, not later
    except (OSError, RuntimeError, ValueError) as exc:
        raise DocumentError(f"Unusable path: {getattr(exc, 'strerror', None) or type(exc).__name__}",
                            guidance="Pass an existing file or folder path.", path=raw[:200]) from None
    if allowed_roots is not None and not any(resolved == r or r in resolved.parents for r in allowed_roots):
        raise DocumentError(
            "Path is outside the allowed roots",
            guidance="Use a path under the server's allowed roots (RESEARCH_AGENT_ALLOWED_ROOTS).",
            path=raw[:200],
        )
    return resolved


def source_name(path: Path, root: Path | None) -> str:
    """The document key: relative to the ingested folder's parent (so `docs/a.md`), or to cwd."""
    base = root.parent if root is not None else Path.cwd()
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def _gitignore_spec(folder: Path) -> Any:
    import pathspec

    lines: list[str] = []
    gi = folder / ".gitignore"
    if gi.is_file():
        lines = gi.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.PathSpec.from_lines("gitwildmatch", lines) if lines else None


def iter_folder(folder: Path, *, recursive: bool, include: Iterable[str], exclude: Iterable[str],
                allowed_roots: list[Path] | None) -> Iterable[Path]:
    """Files under `folder`, sorted, minus default excludes, .gitignore matches and --exclude globs."""
    include, exclude = list(include), list(exclude)
    spec = _gitignore_spec(folder)
    excluded_dirs = set(DEFAULT_EXCLUDES)

    def is_excluded(rel: str, name: str, is_dir: bool) -> bool:
        if is_dir and any(fnmatch.fnmatch(name, pat) for pat in excluded_dirs):
            return True
        if spec is not None and spec.match_file(rel + ("/" if is_dir else "")):
            return True
        return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat) for pat in exclude)

    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        rel_dir = here.relative_to(folder).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if recursive and not is_excluded(rel_dir + d, d, True))
        for name in sorted(filenames):
            rel = rel_dir + name
            if is_excluded(rel, name, False) or (include and not any(
                    fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat) for pat in include)):
                continue
            p = here / name
            if p.is_symlink():
                target = p.resolve()
                # A symlink may not lead out of the folder (or the allowed roots).
                roots = allowed_roots if allowed_roots is not None else [folder]
                if not any(target == r or r in target.parents for r in roots):
                    continue
            yield p


# -- preparing --------------------------------------------------------------------------------
def check_size(c, path: Path) -> None:
    """Refuse a file over its size limit before reading a byte of it."""
    from research_agent.parsing import detect_format

    limit_mb = c.settings.max_pdf_mb if detect_format(path) == "pdf" else c.settings.max_file_mb
    size = path.stat().st_size
    if size > limit_mb * 1024 * 1024:
        raise DocumentError(f"{size / 2**20:.1f} MB exceeds the size limit of {limit_mb:g} MB",
                            guidance="Raise RESEARCH_AGENT_MAX_FILE_MB (MAX_PDF_MB for PDFs) or exclude the file.")


def prepare_file(c, path: Path, document: str, *, title: str | None = None, raw: bytes | None = None) -> PreparedDocument:
    """Parse and chunk one file (DocumentError when it cannot be read or is out of limits)."""
    from research_agent.chunking import chunk_document
    from research_agent.parsing import detect_format, parse_file

    s = c.settings
    fmt = detect_format(path)
    limit_mb = s.max_pdf_mb if fmt == "pdf" else s.max_file_mb
    parsed = parse_file(path, max_bytes=int(limit_mb * 1024 * 1024))
    chunks = chunk_document(parsed, source=document, max_tokens=s.chunk_max_tokens)
    if len(chunks) > s.max_chunks_per_file:
        raise DocumentError(f"{len(chunks)} chunks exceed the limit of {s.max_chunks_per_file} per file",
                            guidance="Raise RESEARCH_AGENT_MAX_CHUNKS_PER_FILE or split the file.")
    data = raw if raw is not None else path.read_bytes()
    extra = {k: v for k, v in parsed.metadata.items() if k in ("description", "keywords", "tags")}
    return PreparedDocument(
        document=document, title=title or parsed.title or path.stem, kind="document", source=document,
        content_hash=content_hash(data + (title or "").encode()), chunks=chunks, path=str(path), extra=extra,
    )


def _chunk_metadata(collection: str, doc: PreparedDocument, chunk: Any, seq: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "collection": collection,
        "source_document": doc.document,
        "document_title": doc.title,
        "header_path": chunk.header_path or "",
        "content_type": chunk.content_type,
        "code_language": chunk.code_language,
        "chunk_sequence_id": seq,
        "content_hash": doc.content_hash,
        "kind": doc.kind,
        "source": doc.source,
        "node_id": chunk.node_id,
        "node_type": chunk.node_type,
        "status": chunk.status,
        "parent_id": chunk.parent_id,
        "blocked_by": list(chunk.blocked_by) or None,
        "last_checked": chunk.last_checked,
        "labels": list(chunk.labels) or None,
        "anchor": chunk.anchor,
        "page": chunk.page,
        "token_count": chunk.token_count,
    }
    for key in ("description", "added_at"):
        if isinstance(doc.extra.get(key), str):
            meta[key] = doc.extra[key]
    for key in ("title", "description"):  # the hybrid format's node-level bullets
        value = chunk.node_metadata.get(key)
        if isinstance(value, str) and value:
            meta[f"node_{key}"] = value
    kw = doc.extra.get("keywords") or doc.extra.get("tags")
    if isinstance(kw, list) and kw:
        meta["keywords"] = [str(k) for k in kw]
    return {k: v for k, v in meta.items() if v is not None}


def embedding_text(meta: dict[str, Any], text: str) -> str:
    """What is embedded: the chunk with its title and header path, so short chunks keep context."""
    context = " > ".join(p for p in (meta.get("document_title", ""), meta.get("header_path", "")) if p)
    return f"{context}\n{text}" if context and context not in text[:200] else text


# -- writing ----------------------------------------------------------------------------------
def write_documents(c, collection: str, docs: list[PreparedDocument]) -> int:
    """Embed and write documents; each becomes visible at once when its manifest flips."""
    if not docs:
        return 0
    col = open_collection(c, collection)
    ids: list[str] = []
    texts: list[str] = []
    metas: list[dict[str, Any]] = []
    for doc in docs:
        for seq, (cid, chunk) in enumerate(zip(chunk_ids(collection, doc.document, doc.content_hash, len(doc.chunks)),
                                               doc.chunks)):
            meta = _chunk_metadata(collection, doc, chunk, seq)
            ids.append(cid)
            texts.append(chunk.text)
            metas.append(meta)
    embedder = c.embedder
    vectors = embedder.embed_documents([embedding_text(m, t) for m, t in zip(metas, texts)])
    keys = [document_key(collection, d.document) for d in docs]
    with c.store.write_lock():
        col = open_collection(c, collection)
        recover_interrupted(c, collection, col)
        old = c.store.registry_get(keys)
        stale = {key: old[key] for key, d in zip(keys, docs) if key in old and old[key]["content_hash"] != d.content_hash}
        # The intent names both versions, so a crash at any step below is undone by the next writer.
        intent = _write_intent(c, collection, [*stale.values(), *({"document": d.document,
                                                                   "content_hash": d.content_hash,
                                                                   "chunk_count": len(d.chunks)} for d in docs)])
        # 1. new chunks (invisible: no manifest points at their hash yet); 2. flip manifests;
        # 3. drop the old version's chunks. Queries see exactly one version at every moment.
        for start in range(0, len(ids), 1000):
            col.upsert(ids=ids[start:start + 1000], embeddings=vectors[start:start + 1000],
                       documents=texts[start:start + 1000], metadatas=metas[start:start + 1000])
        _ensure_dimension(col, embedder.dimension)
        stamp = now_iso()
        manifests = {
            key: {"document": d.document, "title": d.title, "kind": d.kind, "source": d.source, "path": d.path,
                  "content_hash": d.content_hash, "chunk_count": len(d.chunks), "updated_at": stamp,
                  "collection": collection,
                  "added_at": old.get(key, {}).get("added_at", stamp),
                  "extra": d.extra}
            for key, d in zip(keys, docs)
        }
        c.store.registry_put(manifests, "document", collection)
        delete_chunks(col, version_ids(collection, stale.values()))
        _clear_intent(c, intent)
        c.store.bump_revision(collection)
    return len(ids)


def version_ids(collection: str, versions: Iterable[dict[str, Any]]) -> list[str]:
    return [cid for v in versions for cid in chunk_ids(collection, v["document"], v["content_hash"], int(v["chunk_count"]))]


def delete_chunks(col: Any, ids: list[str]) -> None:
    for start in range(0, len(ids), 1000):
        col.delete(ids=ids[start:start + 1000])


# In server mode writers from other machines run at the same time as this one, so each write keeps
# its own intent, and only an intent older than this is taken for a crashed writer's.
STALE_INTENT_SECONDS = 600.0


def _write_intent(c, collection: str, versions: list[dict[str, Any]]) -> str:
    key = f"intent:{collection}:{uuid.uuid4().hex}"
    c.store.registry_put({key: {"versions": versions, "created": time.time()}}, "intent", collection)
    return key


def _clear_intent(c, key: str) -> None:
    c.store.registry_delete([key])


def recover_interrupted(c, collection: str, col: Any, *, min_age: float | None = None) -> int:
    """Undo writes that were killed midway (under the write lock): drop chunks no manifest points at.

    Embedded stores serialize writers, so every intent found is a dead writer's; on a Chroma server
    only intents older than `min_age` (default STALE_INTENT_SECONDS) are.
    """
    if min_age is None:
        min_age = STALE_INTENT_SECONDS if c.settings.server_mode else 0.0
    intents = {k: v for k, v in c.store.registry_find("intent", collection).items()
               if time.time() - float(v.get("created", 0)) >= min_age}
    removed = 0
    for key, intent in intents.items():
        versions = intent["versions"]
        current = {m["document"]: m["content_hash"] for m in c.store.registry_get(
            list(dict.fromkeys(document_key(collection, v["document"]) for v in versions))).values()}
        orphans = [v for v in versions if current.get(v["document"]) != v["content_hash"]]
        ids = version_ids(collection, orphans)
        delete_chunks(col, ids)
        _clear_intent(c, key)
        removed += len(ids)
        log.warning("recovered an interrupted write to %s: removed %d orphan chunks", collection, len(ids))
    return removed


def recover_if_needed(c, collection: str) -> None:
    """Recover a crashed writer's leftovers before new work (cheap when there are none)."""
    if c.store.registry_find("intent", collection):
        col = open_collection(c, collection, check_model=False)
        with c.store.write_lock():
            if recover_interrupted(c, collection, col):
                c.store.bump_revision(collection)


def _ensure_dimension(col: Any, dimension: int) -> None:
    meta = dict(col.metadata or {})
    if meta.get("embedding_dimension") != dimension:
        meta["embedding_dimension"] = dimension
        col.modify(metadata={k: v for k, v in meta.items() if not k.startswith("hnsw:")})


def delete_documents(c, collection: str, manifests: dict[str, dict[str, Any]]) -> int:
    """Remove documents: manifest first (invisible at once), then their chunks."""
    if not manifests:
        return 0
    col = open_collection(c, collection, check_model=False)
    with c.store.write_lock():
        recover_interrupted(c, collection, col)
        versions = list(manifests.values())
        intent = _write_intent(c, collection, versions)
        c.store.registry_delete(list(manifests))
        ids = version_ids(collection, versions)
        delete_chunks(col, ids)
        _clear_intent(c, intent)
        c.store.bump_revision(collection)
    return len(ids)


# -- the service --------------------------------------------------------------------------------
def ingest_path(c, path: str | Path, collection: str, *, recursive: bool = False, include: Iterable[str] = (),
                exclude: Iterable[str] = (), prune: bool = False, title: str | None = None, strict: bool = False,
                progress: ProgressFn | None = None, allowed_roots: list[Path] | None = None) -> IngestReport:
    """Ingest a file or a folder; unchanged files are skipped by content hash."""
    started = time.perf_counter()
    target = check_allowed(Path(path), allowed_roots)
    if not target.exists():
        raise DocumentError(f"No such file or folder: {path}", guidance="Check the path.", path=str(path)[:200])
    c.store.refresh()
    open_collection(c, collection)  # fail before any work on an unknown collection or model mismatch
    recover_if_needed(c, collection)
    report = IngestReport(collection=collection)
    if target.is_dir():
        root: Path | None = target
        files = list(iter_folder(target, recursive=recursive, include=include, exclude=exclude,
                                 allowed_roots=allowed_roots))
        if len(files) > c.settings.max_files_per_run:
            raise DocumentError(f"{len(files)} files exceed the limit of {c.settings.max_files_per_run} per run",
                                guidance="Narrow the run with --include/--exclude or raise RESEARCH_AGENT_MAX_FILES_PER_RUN.")
    else:
        root, files = None, [target]
    single = root is None
    report.files_seen = len(files)
    existing = c.store.registry_find("document", collection)
    total_chunks = 0
    pending: list[PreparedDocument] = []
    pending_chunks = 0
    seen: set[str] = set()
    notify = progress or (lambda p: None)

    def flush() -> None:
        nonlocal pending, pending_chunks
        if pending:
            report.chunks_written += write_documents(c, collection, pending)
            notify(IngestProgress(stage="writing", files_done=done, files_total=len(files),
                                  chunks_done=report.chunks_written, chunks_total=total_chunks))
        pending, pending_chunks = [], 0

    done = 0
    for done, file in enumerate(files, start=1):
        document = source_name(file, root)
        key = document_key(collection, document)
        seen.add(key)
        notify(IngestProgress(stage="reading", files_done=done - 1, files_total=len(files),
                              chunks_done=report.chunks_written, chunks_total=total_chunks, current=document))
        try:
            check_size(c, file)
            raw = file.read_bytes()
            prev = existing.get(key)
            if prev and prev["content_hash"] == content_hash(raw + (title or "").encode()):
                report.unchanged += 1
                continue
            doc = prepare_file(c, file, document, title=title, raw=raw)
        except DocumentError as exc:
            if single:
                raise
            report.skipped.append(FileProblem(path=document, reason=exc.message))
            continue
        except OSError as exc:
            if single:
                raise DocumentError(f"Cannot read {document}: {exc.strerror}", path=document) from None
            report.failed.append(FileProblem(path=document, reason=f"unreadable: {exc.strerror}"))
            continue
        if not doc.chunks:
            report.skipped.append(FileProblem(path=document, reason="no text content"))
            continue
        if key in existing:
            report.updated += 1
        else:
            report.added += 1
        report.documents.append(document)
        pending.append(doc)
        pending_chunks += len(doc.chunks)
        total_chunks += len(doc.chunks)
        if pending_chunks >= EMBED_BATCH_CHUNKS:
            flush()
    flush()
    if prune and root is not None:
        gone = {k: m for k, m in existing.items()
                if k not in seen and m.get("path") and Path(m["path"]).is_relative_to(root) and m.get("kind") == "document"}
        delete_documents(c, collection, gone)
        report.removed = len(gone)
    report.seconds = round(time.perf_counter() - started, 3)
    notify(IngestProgress(stage="done", files_done=len(files), files_total=len(files),
                          chunks_done=report.chunks_written, chunks_total=total_chunks))
    if strict and (report.skipped or report.failed):
        raise DocumentError(
            f"{len(report.skipped)} skipped and {len(report.failed)} failed files (--strict)",
            guidance="Fix or exclude the files listed in data.report, or drop --strict.",
            report=report.model_dump(mode="json"),
        )
    return report


def list_documents(c, collection: str) -> DocumentList:
    c.store.refresh()
    open_collection(c, collection, check_model=False)
    recs = sorted(c.store.registry_find("document", collection).values(), key=lambda m: m["document"])
    return DocumentList(collection=collection, documents=[DocumentInfo(**{k: m.get(k) for k in DocumentInfo.model_fields})
                                                          for m in recs])


def find_document(c, collection: str, document: str) -> dict[str, dict[str, Any]]:
    """The manifest of `document` (its key, or a path that resolves to a recorded file)."""
    key = document_key(collection, document)
    found = c.store.registry_get([key])
    if not found:
        candidates = {k: m for k, m in c.store.registry_find("document", collection).items()
                      if m.get("path") and m["path"] == str(Path(document).expanduser().resolve())}
        found = candidates
    if not found:
        raise DocumentError(f"Document {document!r} not found in {collection!r}",
                            guidance=f"Run `research-agent kb list-documents --collection {collection}`.",
                            document=document[:200], collection=collection)
    return found


class DocumentContent(BaseModel):
    collection: str
    document: str
    title: str
    kind: str
    source: str
    path: str | None = None
    updated_at: str
    content: str
    chunk_count: int


class ChunkView(BaseModel):
    chunk_id: str
    sequence: int
    header_path: str
    content_type: str
    content: str


class DocumentChunks(BaseModel):
    collection: str
    document: str
    title: str | None
    chunk_count: int
    chunks: list[ChunkView]


def _current_chunks(c, collection: str, document: str) -> tuple[dict[str, Any], list[ChunkView]]:
    """The manifest of `document` (key or file path) and its visible chunks, in document order."""
    c.store.refresh()
    manifest = next(iter(find_document(c, collection, document).values()))
    col = open_collection(c, collection, check_model=False)
    got = col.get(ids=version_ids(collection, [manifest]), include=["documents", "metadatas"])
    chunks = sorted((ChunkView(chunk_id=cid, sequence=int(meta.get("chunk_sequence_id", 0)),
                               header_path=meta.get("header_path", ""), content_type=meta.get("content_type", ""),
                               content=text)
                     for cid, text, meta in zip(got["ids"], got["documents"], got["metadatas"])),
                    key=lambda ch: ch.sequence)
    return manifest, chunks


def get_document(c, collection: str, document: str) -> DocumentContent:
    """A document's full text, reassembled from its chunks in order (by document id or file path)."""
    manifest, chunks = _current_chunks(c, collection, document)
    return DocumentContent(collection=collection, document=manifest["document"], title=manifest["title"],
                           kind=manifest["kind"], source=manifest["source"], path=manifest.get("path"),
                           updated_at=manifest["updated_at"], chunk_count=len(chunks),
                           content="\n\n".join(ch.content for ch in chunks))


def get_document_chunks(c, collection: str, document: str) -> DocumentChunks:
    """A document's chunks in order, with their header paths and content types."""
    manifest, chunks = _current_chunks(c, collection, document)
    return DocumentChunks(collection=collection, document=manifest["document"], title=manifest.get("title"),
                          chunk_count=len(chunks), chunks=chunks)


def remove_document(c, collection: str, document: str) -> Deleted:
    c.store.refresh()
    recover_if_needed(c, collection)
    found = find_document(c, collection, document)
    removed = delete_documents(c, collection, found)
    return Deleted(deleted=next(iter(found.values()))["document"], kind="document", chunks_removed=removed)


def reindex_collection(c, collection: str, progress: ProgressFn | None = None) -> IngestReport:
    """Re-embed every chunk with the configured model (after the model changed)."""
    started = time.perf_counter()
    c.store.refresh()
    old = open_collection(c, collection, check_model=False)
    manifests = c.store.registry_find("document", collection)
    embedder = c.embedder
    total = sum(int(m["chunk_count"]) for m in manifests.values())
    report = IngestReport(collection=collection, files_seen=len(manifests))
    notify = progress or (lambda p: None)
    with c.store.write_lock():
        meta = {k: v for k, v in (old.metadata or {}).items() if not k.startswith("hnsw:")}
        meta.update(embedding_model=c.settings.embedding_model, embedding_backend=c.settings.embedding_backend,
                    embedding_dimension=embedder.dimension)
        # A new dimension needs a new Chroma collection: fill a temporary one, then swap names.
        tmp_name = f"research-agent-tmp-{uuid.uuid4().hex[:8]}"
        new = c.store.client.create_collection(tmp_name, metadata={"hnsw:space": "cosine", **meta},
                                               embedding_function=None)
        try:
            for done, m in enumerate(manifests.values(), start=1):
                ids = version_ids(collection, [m])
                got = old.get(ids=ids, include=["documents", "metadatas"])
                if got["ids"]:
                    vecs = embedder.embed_documents([embedding_text(md, t) for md, t in zip(got["metadatas"], got["documents"])])
                    new.upsert(ids=got["ids"], embeddings=vecs, documents=got["documents"], metadatas=got["metadatas"])
                report.chunks_written += len(got["ids"])
                report.updated += 1
                notify(IngestProgress(stage="reindexing", files_done=done, files_total=len(manifests),
                                      chunks_done=report.chunks_written, chunks_total=total, current=m["document"]))
        except BaseException:
            c.store.delete_collection(tmp_name)
            raise
        # Keep the old collection under a backup name until the new one carries the real name, so a
        # crash here never loses the collection (`research-agent doctor` finishes or undoes the swap).
        backup = f"research-agent-old-{uuid.uuid4().hex[:8]}-{collection}"[:500]
        old.modify(name=backup)
        new.modify(name=collection)
        c.store.delete_collection(backup)
        c.store.bump_revision(collection)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
