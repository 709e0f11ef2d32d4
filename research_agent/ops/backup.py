"""Backup and restore of one collection as JSONL: notes and research live only in the store (issue 15).

The file, one JSON object a line (FORMAT, VERSION):
  {"format", "version", "exported_at", "collection": {name, type, description, created_at}, "embedding":
   {model, backend, dimension}, "projects": [...], "documents", "chunks", "with_embeddings"}     the header
  {"document": manifest}      a document's manifest as stored, without its timestamps (added_at, updated_at);
  {"chunk": {id, text, metadata[, embedding]}}   followed by exactly `chunk_count` chunk lines, in order
  {"end": {"documents", "chunks"}}   the last line: a file cut at a line boundary is still seen as cut.

One chunk a line, not one document a line: a document may have 5,000 chunks (max_chunks_per_file), tens of MB
with vectors, past the MAX_LINE_BYTES a line may have. Both directions stream: export reads one document at a
time in pages of storage/chunks.PAGE ids; import holds one line (at most MAX_LINE_BYTES, read with a bounded
readline, so a 1 GB line is refused after 8 MB) and the documents of one batch (IMPORT_BATCH_CHUNKS chunks).

Import writes through the crash-safe protocol (storage/writer.py `commit`, with ingest/service.py's steps and
recovery), one batch of whole documents per commit: an interrupted or refused import leaves whole documents,
and running it again (on_conflict="skip" keeps what is there unchanged) finishes it. Chunk ids and the
`collection` field are derived again for the target collection, so an import under another name (a copy) and a
hostile id alike can never touch another document's chunks.

Over 400 lines because the format is one contract read and written here: the line models, the exporter and
the importer's validation must change together (a field the exporter adds that the importer does not check is a
hole), so they stay side by side.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from research_agent.catalog import projects
from research_agent.catalog.collections import create_collection, delete_collection, now_iso, open_collection
from research_agent.errors import DocumentError, ResearchAgentError
from research_agent.ingest import folder, service
from research_agent.ingest.prepare import check_allowed, chunk_ids, document_key, embedding_text
from research_agent.storage import chunks as chunk_pages, writer
from research_agent.storage.registry import DOCUMENT, PROJECT
from research_agent.storage.store import validate_name

if TYPE_CHECKING:
    from research_agent.container import Container

log = logging.getLogger(__name__)

FORMAT = "research-agent-export"
VERSION = 1
#: Longest line import reads (a candidate setting). The largest chunk line we write is ~10 KB of text plus
#: ~8 KB of vector (384 floats); 8 MB leaves room for any model and chunk size while a 1 GB line is refused
#: after reading 8 MB of it.
MAX_LINE_BYTES = 8 * 1024 * 1024
#: Bytes of chunk lines one document may have on import (a candidate setting): a document is committed whole,
#: so its chunks are in memory together; 5,000 chunks (max_chunks_per_file) of ~20 KB lines are ~100 MB.
MAX_DOCUMENT_BYTES = 128 * 1024 * 1024
#: Chunks embedded and committed together on import, as ingest batches them (service.EMBED_BATCH_CHUNKS).
IMPORT_BATCH_CHUNKS = service.EMBED_BATCH_CHUNKS
#: Skipped or replaced documents a BackupReport names in its warnings (the counts are always whole): keeps an MCP
#: answer small.
SHOWN_MAX = 20
OnConflict = Literal["skip", "replace", "error"]
ON_CONFLICT = ("skip", "replace", "error")
_STAMPS = ("added_at", "updated_at")
DAMAGED = "The file is damaged or cut short; use a complete copy `research-agent export` wrote."


class BackupReport(BaseModel):
    """What an export or an import did. One model for both: the fields mean the same (documents and chunks of
    the file, its bytes), and one output schema instead of two keeps tools/list smaller (~300 bytes)."""

    collection: str
    path: str  # the file written or read, or "-" for a stream (stdout, stdin)
    documents: int  # export: written; import: read from the file
    chunks: int = 0  # export: written; import: written to the store
    bytes: int = 0
    # export: vectors included; import: vectors taken from the file (same model and dimension), nothing embedded
    with_embeddings: bool = False
    created: bool = False  # import: the import created the collection
    added: int = 0
    replaced: int = 0
    unchanged: int = 0  # import: already there with the same content
    # export: documents left out (incomplete in the store, or removed meanwhile); import: documents already
    # there with other content and kept (on_conflict="skip")
    skipped: int = 0
    warnings: list[str] = []  # which documents were skipped or replaced (the first SHOWN_MAX); projects not linked
    seconds: float = 0.0


# -- the lines, as import validates them --------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _CollectionHead(_Strict):
    name: str
    type: Literal["fundamental", "project-specific"]
    description: str = ""
    created_at: str = ""


class _Embedding(_Strict):
    model: str
    backend: str = ""
    dimension: int | None = None


class _Header(_Strict):
    format: str
    version: int
    exported_at: str
    collection: _CollectionHead
    embedding: _Embedding
    projects: list[str] = []
    documents: int
    chunks: int
    with_embeddings: bool = False


class _Manifest(_Strict):
    document: str = Field(min_length=1)  # empty, the manifest is one no read can use (storage/registry.py _manifest)
    title: str
    kind: Literal["document", "research", "note", "record", "web"]  # every kind ingest writes
    source: str
    path: str | None = None
    content_hash: str = Field(min_length=1)
    chunk_count: int
    extra: dict[str, Any] | None = None


Scalar = str | int | float | bool


class _Chunk(_Strict):
    id: str
    text: str
    metadata: dict[str, Scalar | list[Scalar]]
    embedding: list[float] | None = None

    @field_validator("metadata")
    @classmethod
    def _chroma_accepts(cls, meta: dict[str, Any]) -> dict[str, Any]:
        """What Chroma refuses at write time (an outside tester got 'Unexpected failure' for each): an empty key
        or one starting with `$` (its operators), and a list mixing types (["a", 1], [true, 1])."""
        for key, value in meta.items():
            if not key or key.startswith("$"):
                raise ValueError(f"metadata key {key[:80]!r} is not allowed")
            if isinstance(value, list) and len({type(v) for v in value}) > 1:
                raise ValueError(f"metadata {key[:80]!r} mixes value types")
        return meta


# -- export -----------------------------------------------------------------------------------------------
class _Counter:
    """A binary stream that counts the bytes written through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.bytes = out, 0

    def line(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        self.out.write(data)
        self.bytes += len(data)


def export_collection(c: Container, collection: str, out: str | Path | IO[bytes], *, with_embeddings: bool = False,
                      overwrite: bool = False, allowed_roots: list[Path] | None = None) -> BackupReport:
    """Write `collection` as JSONL to `out` (a path, written to a temporary file and renamed into place, so a
    failed export leaves no partial file; or a binary stream). Vectors only with `with_embeddings` (they
    triple the file: 384 floats beside ~1 KB of text a chunk) and let an import skip re-embedding."""
    started = time.perf_counter()
    c.store.refresh()
    col = open_collection(c, collection, check_model=False)
    if isinstance(out, (str, Path)):
        target = _export_target(Path(out), overwrite, allowed_roots)
        with _atomic_file(target) as stream:
            report = _export(c, collection, col, stream, with_embeddings)
        report.path = folder.display(str(target))
    else:
        try:
            report = _export(c, collection, col, out, with_embeddings)
            out.flush()
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the CLI ends quietly, as other tools do
        except OSError as exc:  # `-o - > /dev/full`: say why, not "Unexpected failure"
            raise DocumentError(f"Cannot write the export: {exc.strerror or exc}",
                                guidance="Check the output's free space and permissions.") from None
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _export(c: Container, collection: str, col: Any, out: IO[bytes], with_embeddings: bool) -> BackupReport:
    """Lines are written outside the store session: a session holds the read gate, and a writer to the same
    store (`export kb | import - --collection copy`) must commit while the export waits on a full pipe."""
    sink = _Counter(out)
    with c.store.session():
        manifests = sorted(c.store.registry_find(DOCUMENT, collection).values(), key=lambda m: m["document"])
        header = _header(c, collection, col, manifests, with_embeddings)
    sink.line(header)
    report = BackupReport(collection=collection, path="-", documents=0, with_embeddings=with_embeddings)
    for manifest in manifests:
        # One document at a time inside a session: another process commits between documents, never inside one.
        with c.store.session():
            lines = _document_lines(c, collection, col, manifest["document"], with_embeddings)
        if lines is None:
            report.skipped += 1
            if report.skipped <= SHOWN_MAX:
                report.warnings.append(f"{manifest['document']}: left out, incomplete in the store (run "
                                       "`research-agent doctor --repair`) or removed during the export")
            continue
        for line in lines:
            sink.line(line)
        report.documents += 1
        report.chunks += len(lines) - 1
    sink.line({"end": {"documents": report.documents, "chunks": report.chunks}})
    report.bytes = sink.bytes
    return report


def _header(c: Container, collection: str, col: Any, manifests: list[dict[str, Any]],
            with_embeddings: bool) -> dict[str, Any]:
    meta = col.metadata or {}
    links = sorted(p["name"] for p in c.store.registry_find(PROJECT).values()
                   if collection in p.get("collections", []))
    return {"format": FORMAT, "version": VERSION, "exported_at": now_iso(),
            "collection": {"name": collection, "type": meta.get("type", "project-specific"),
                           "description": meta.get("description", ""), "created_at": meta.get("created_at", "")},
            "embedding": {"model": meta.get("embedding_model", ""), "backend": meta.get("embedding_backend", ""),
                          "dimension": meta.get("embedding_dimension")},
            "projects": links, "documents": len(manifests),
            "chunks": sum(int(m.get("chunk_count", 0)) for m in manifests), "with_embeddings": with_embeddings}


def _document_lines(c: Container, collection: str, col: Any, document: str,
                    with_embeddings: bool) -> list[dict[str, Any]] | None:
    """The document's manifest line and chunk lines (its manifest read again, so they agree), or None when it
    is gone or incomplete (`doctor --repair`): it is left out whole. One document's chunks are in memory at
    once (at most max_chunks_per_file), read in pages of storage/chunks.PAGE ids."""
    key = document_key(collection, document)
    manifest = c.store.registry_get([key]).get(key)
    if manifest is None:
        return None
    ids = chunk_ids(collection, document, manifest["content_hash"], int(manifest["chunk_count"]))
    include = ["documents", "metadatas", *(["embeddings"] if with_embeddings else [])]
    found = {cid: rest for cid, *rest in chunk_pages.records(col, include, ids=ids)}
    if len(found) != len(ids):
        log.warning("export of %s: %s has %d of its %d chunks; left out (run `research-agent doctor --repair`)",
                    collection, document, len(found), len(ids))
        return None
    lines: list[dict[str, Any]] = [{"document": {k: v for k, v in manifest.items()
                                                 if k not in (*_STAMPS, "collection")}}]
    for cid in ids:
        text, meta, *vector = found[cid]
        chunk: dict[str, Any] = {"id": cid, "text": text, "metadata": meta}
        if vector:
            chunk["embedding"] = [float(x) for x in vector[0]]
        lines.append({"chunk": chunk})
    return lines


def _export_target(path: Path, overwrite: bool, allowed_roots: list[Path] | None) -> Path:
    target = check_allowed(path, allowed_roots)
    shown = folder.display(str(path)[:200])
    if not target.parent.is_dir():
        raise DocumentError(f"No such folder for the export: {folder.display(str(target.parent))}",
                            guidance="Create the folder first or name a file in an existing one.", path=shown)
    if target.exists() and (not overwrite or not target.is_file()):
        raise DocumentError(f"{shown} exists; an export never overwrites a file unasked",
                            guidance="Name a new file, or pass --force (CLI) to replace a regular file.", path=shown)
    return target


@contextlib.contextmanager
def _atomic_file(target: Path) -> Iterator[IO[bytes]]:
    """A temporary file beside `target`, fsynced and renamed onto it when the block succeeds, deleted otherwise."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(tmp, "xb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        with contextlib.suppress(FileNotFoundError):  # a replaced export keeps its mode (a 0600 backup stays 0600)
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except OSError as exc:
        raise DocumentError(f"Cannot write {folder.display(str(target))}: {exc.strerror or exc}",
                            guidance="Check the folder's permissions and free space.") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# -- import -----------------------------------------------------------------------------------------------
@dataclass
class _Lines:
    """Numbered lines of a binary stream, each read with a bounded readline."""

    stream: IO[bytes]
    number: int = 0
    bytes: int = 0

    def next(self) -> Any:
        """The next line's JSON object, or None at the end of the file."""
        raw = self.stream.readline(MAX_LINE_BYTES + 1)
        self.number += 1  # at the end too: the line an error then names is the one missing
        if not raw:
            return None
        self.bytes += len(raw)
        if len(raw) > MAX_LINE_BYTES:
            raise self.error(f"is longer than {MAX_LINE_BYTES // 2**20} MB (read no further)",
                             "The file is not one research-agent wrote, or it is damaged.")
        if not raw.endswith(b"\n"):
            raise self.error("is cut short (no line end): the file was truncated",
                             "Export the collection again, or use a complete copy of the file.")
        try:
            obj = json.loads(raw)
            json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates (\udcff) would fail in Chroma
        except (ValueError, UnicodeError, RecursionError) as exc:  # 200k nested brackets: RecursionError
            raise self.error(f"is not valid JSON ({str(exc)[:120]})", DAMAGED) from None
        if not isinstance(obj, dict) or len(obj) < 1:
            raise self.error("is not a JSON object", DAMAGED)
        return obj

    def error(self, what: str, guidance: str) -> DocumentError:
        return DocumentError(f"Line {self.number} of the import {what}", guidance=guidance, line=self.number)


@dataclass
class _Import:
    """One import's state: where it writes, what it found there, the batch not yet committed."""

    c: Container
    header: _Header
    target: str
    on_conflict: str
    report: BackupReport
    current: dict[str, str]
    reuse_vectors: bool
    seen: set[str] = field(default_factory=set)
    batch: writer.Versions = field(default_factory=writer.Versions)


def import_collection(c: Container, source: str | Path | IO[bytes], *, collection: str | None = None,
                      on_conflict: OnConflict = "skip", allowed_roots: list[Path] | None = None) -> BackupReport:
    """Restore an export into `collection` (default: the name in the file), created if missing.

    A document already there with the same content is unchanged; with other content `on_conflict` decides:
    skip (keep it), replace, or error (stop; documents before it are imported). A bad line stops the import
    with a DocumentError naming the line, after committing the whole documents before it."""
    started = time.perf_counter()
    if on_conflict not in ON_CONFLICT:
        raise DocumentError(f"Unknown on_conflict {on_conflict!r}", guidance=f"Use one of: {', '.join(ON_CONFLICT)}.")
    if collection is not None:
        validate_name(collection)
    with _source(source, allowed_roots) as (stream, shown):
        lines = _Lines(stream)
        job = _start(c, lines, collection, on_conflict, shown)
        try:
            _read_documents(job, lines)
        except DocumentError:
            _flush(job)  # the whole documents before the bad line: a re-run with a good copy finishes the rest
            if job.report.created and not (job.report.added or job.report.replaced):
                # Nothing restored into a collection this import created: an empty collection left behind made
                # the next run import into it (found by an outside tester: docs2, web2, docs3 with 0 documents).
                delete_collection(c, job.target)
            raise
        finally:
            job.report.bytes = lines.bytes
        _flush(job)
    job.report.seconds = round(time.perf_counter() - started, 3)
    return job.report


@contextlib.contextmanager
def _source(source: str | Path | IO[bytes], allowed_roots: list[Path] | None) -> Iterator[tuple[IO[bytes], str]]:
    """The binary stream to read and its name for the report; a path must be a regular file (a FIFO would hang)."""
    if not isinstance(source, (str, Path)):
        yield source, "-"
        return
    path = check_allowed(Path(source), allowed_roots)
    shown = folder.display(str(path))
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise folder.not_regular(path, st.st_mode)
        stream = open(path, "rb")
    except OSError as exc:
        raise DocumentError(f"Cannot read {shown}: {exc.strerror or exc}", guidance="Check the path.",
                            path=shown) from None
    with stream:
        yield stream, shown


def _start(c: Container, lines: _Lines, collection: str | None, on_conflict: str, shown: str) -> _Import:
    """Read and check the header; open (or create) the target collection."""
    header = _parse(lines, _Header, lines.next(), "header")
    if header.format != FORMAT:
        raise lines.error(f"is not a {FORMAT} header (format {header.format[:80]!r})",
                          "Import a file written by `research-agent export`.")
    if header.version != VERSION:
        raise lines.error(f"has format version {header.version}; this release reads version {VERSION}",
                          "Export again with this release, or upgrade research-agent.")
    validate_name(header.collection.name)
    target = collection or header.collection.name
    c.store.refresh()
    if c.store.has_collection(target):
        service.recover_if_needed(c, target)
    created, warnings = _open_target(c, target, header)
    col = open_collection(c, target)
    recorded = (col.metadata or {}).get("embedding_dimension")
    # The file's dimension is a claim: it must be the model's own (a forged 10 made a collection no query could
    # search, found by an outside tester), checked only when the vectors would be used.
    reuse = bool(header.with_embeddings and header.embedding.model == c.settings.embedding_model
                 and header.embedding.dimension is not None and recorded in (None, header.embedding.dimension)
                 and header.embedding.dimension == c.embedder.dimension)
    report = BackupReport(collection=target, path=shown, created=created, documents=0, with_embeddings=reuse,
                          warnings=warnings)
    return _Import(c=c, header=header, target=target, on_conflict=on_conflict, report=report,
                   current=c.store.current_versions(target), reuse_vectors=reuse)


def _open_target(c: Container, target: str, header: _Header) -> tuple[bool, list[str]]:
    """Create the target from the header (type, description, links to the projects that exist here)."""
    if c.store.has_collection(target):
        return False, []
    create_collection(c, target, type=header.collection.type, description=header.collection.description)
    warnings = []
    for name in header.projects:
        try:
            projects.link_collections(c, name, [target])
        except ResearchAgentError as exc:  # a missing project: the restore goes on, the report says so
            warnings.append(f"not linked to project {name!r}: {exc.message}")
    return True, warnings


def _parse(lines: _Lines, model: type[BaseModel], obj: Any, what: str) -> Any:
    if obj is None:
        raise lines.error(f"is missing: the file ends before its {what}", DAMAGED)
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or what
        raise lines.error(f"has a bad {what}: {where}: {first['msg']}"[:300],
                          "The file is damaged or was edited; use a copy `research-agent export` wrote.") from None


def _read_documents(job: _Import, lines: _Lines) -> None:
    """Every document of the file, then its end record; batches are committed as they fill."""
    while True:
        obj = lines.next()
        if obj is None:
            raise lines.error("is missing: the file ends before its end record (truncated)",
                              f"Documents before line {lines.number} were imported; run the import again "
                              "with a complete copy of the file to finish it.")
        if "end" in obj:
            _check_end(job, lines, obj)
            return
        if "document" not in obj or len(obj) != 1:
            raise lines.error("is not a document record", DAMAGED)
        _read_document(job, lines, _parse(lines, _Manifest, obj["document"], "document"))


def _check_end(job: _Import, lines: _Lines, obj: dict[str, Any]) -> None:
    end = obj["end"] if isinstance(obj["end"], dict) else {}
    if end.get("documents") != job.report.documents or lines.next() is not None:
        raise lines.error("does not match the documents read (a damaged or edited file)",
                          "Use a complete copy of the file.")


def _read_document(job: _Import, lines: _Lines, m: _Manifest) -> None:
    """One document: its chunk lines checked, then queued for writing, skipped, or a conflict error."""
    first = lines.number
    if m.document in job.seen:
        raise lines.error(f"repeats document {m.document[:200]!r}", "Each document appears once in an export.")
    job.seen.add(m.document)
    if not 1 <= m.chunk_count <= job.c.settings.max_chunks_per_file:
        raise lines.error(f"gives {m.chunk_count} chunks; 1 to {job.c.settings.max_chunks_per_file} are allowed",
                          "Raise RESEARCH_AGENT_MAX_CHUNKS_PER_FILE if the collection was built with more.")
    chunks = _read_chunks(job, lines, m)
    job.report.documents += 1
    have = job.current.get(m.document)
    if have == m.content_hash:
        job.report.unchanged += 1
        return
    if have is not None:
        if job.on_conflict == "error":
            _flush(job)
            raise DocumentError(
                f"Line {first}: document {m.document[:200]!r} is already in {job.target!r} with other content",
                guidance="Import with on_conflict skip (keep it) or replace; the documents before it were imported.",
                line=first, document=m.document[:200])
        if job.report.skipped + job.report.replaced < SHOWN_MAX:
            job.report.warnings.append(f"{m.document}: other content already there, "
                                       f"{'kept' if job.on_conflict == 'skip' else 'replaced'}")
        if job.on_conflict == "skip":
            job.report.skipped += 1
            return
    job.report.replaced += have is not None
    job.report.added += have is None
    _queue(job, m, chunks)


def _read_chunks(job: _Import, lines: _Lines, m: _Manifest) -> list[_Chunk]:
    """The document's chunk lines, each checked against the manifest and the ids the source derived."""
    source = job.header.collection.name
    expected = chunk_ids(source, m.document, m.content_hash, m.chunk_count)
    out, size = [], 0
    for seq, cid in enumerate(expected):
        obj = lines.next()
        if obj is None or "chunk" not in obj or len(obj) != 1:
            raise lines.error(f"should be chunk {seq + 1} of {m.chunk_count} of {m.document[:200]!r}"
                              + (" but the file ends" if obj is None else ""),
                              "The file was cut short or damaged; documents before this one were imported.")
        chunk = _parse(lines, _Chunk, obj["chunk"], "chunk")
        meta = chunk.metadata
        if chunk.id != cid or meta.get("source_document") != m.document or meta.get("content_hash") != m.content_hash \
                or meta.get("chunk_sequence_id") != seq:
            raise lines.error(f"has a chunk that is not chunk {seq} of {m.document[:200]!r} (its id or metadata "
                              "names another document or version)", "The file was edited; use the exported copy.")
        _check_vector(job, lines, chunk)
        size += len(chunk.text) + len(json.dumps(meta)) + 20 * len(chunk.embedding or ())
        if size > MAX_DOCUMENT_BYTES:
            raise lines.error(f"takes {m.document[:200]!r} past {MAX_DOCUMENT_BYTES // 2**20} MB",
                              "The file is not one research-agent wrote, or it is damaged.")
        out.append(chunk)
    return out


def _check_vector(job: _Import, lines: _Lines, chunk: _Chunk) -> None:
    vector = chunk.embedding
    if vector is not None and (len(vector) != job.header.embedding.dimension
                               or not all(math.isfinite(x) for x in vector)):
        raise lines.error(f"has an embedding of {len(vector)} values (or not finite numbers); the header says "
                          f"{job.header.embedding.dimension}", DAMAGED)


def _queue(job: _Import, m: _Manifest, chunks: list[_Chunk]) -> None:
    """Add the document to the batch under the target's ids; commit the batch once it is full."""
    new = job.batch
    for cid, chunk in zip(chunk_ids(job.target, m.document, m.content_hash, m.chunk_count), chunks):
        meta = {**chunk.metadata, "collection": job.target} if "collection" in chunk.metadata else chunk.metadata
        new.ids.append(cid)
        new.texts.append(chunk.text)
        new.metas.append(meta)
        new.vectors.append(chunk.embedding if job.reuse_vectors else None)
    new.manifests[document_key(job.target, m.document)] = {**m.model_dump(), "collection": job.target}
    job.current[m.document] = m.content_hash
    if len(new.ids) >= IMPORT_BATCH_CHUNKS:
        _flush(job)


def _flush(job: _Import) -> None:
    """Commit the batch (crash-safe, whole documents): embedding what has no vector first, outside the lock."""
    new = job.batch
    if not new.ids:
        return
    dimension = job.header.embedding.dimension
    missing = [i for i, v in enumerate(new.vectors) if v is None]
    if missing:
        embedder = job.c.embedder
        dimension = embedder.dimension
        vectors = service.embed_in_slices(embedder, [embedding_text(new.metas[i], new.texts[i]) for i in missing],
                                          lambda done: None)
        for i, vector in zip(missing, vectors):
            new.vectors[i] = vector
    job.report.chunks += service.commit_versions(job.c, job.target, new, int(dimension or 0))
    job.batch = writer.Versions()


__all__ = ["BackupReport", "MAX_LINE_BYTES", "export_collection", "import_collection"]
