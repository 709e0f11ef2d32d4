"""Reading what was ingested: the document list, one document's manifest, its text and its chunks.

Read-only, so it never takes the write lock; a document's visible chunks are the ids of the version its
manifest names (version_ids), so a reader never sees a half-written new version.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.catalog.collections import open_collection
from research_agent.catalog.common import paginate
from research_agent.errors import DocumentError
from research_agent.ingest.prepare import document_key, version_ids
from research_agent.storage.chunks import records

if TYPE_CHECKING:
    from research_agent.container import Container


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
    """One page of a collection's documents in key order (catalog/common.py `paginate`)."""

    collection: str
    documents: list[DocumentInfo]
    total: int
    next_cursor: str | None = None


def _document_info(manifest: dict[str, Any]) -> DocumentInfo:
    return DocumentInfo(**{k: manifest.get(k) for k in DocumentInfo.model_fields})


def list_documents(c: Container, collection: str, *, limit: int | None = None,
                   cursor: str | None = None) -> DocumentList:
    """One page (DEFAULT_PAGE by default) of the collection's documents, by key: 400 documents unpaged were
    258 KB of MCP structured content (issue 15)."""
    c.store.refresh()
    open_collection(c, collection, check_model=False)
    shown, page = paginate(list(c.store.registry_find("document", collection).values()), lambda m: m["document"],
                           f"documents:{collection}", _document_info, limit=limit, cursor=cursor)
    return DocumentList(collection=collection, documents=shown, **page.model_dump())


def find_document(c: Container, collection: str, document: str) -> dict[str, dict[str, Any]]:
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


def _current_chunks(c: Container, collection: str, document: str) -> tuple[dict[str, Any], list[ChunkView]]:
    """The manifest of `document` (key or file path) and its visible chunks, in document order."""
    c.store.refresh()
    manifest = next(iter(find_document(c, collection, document).values()))
    col = open_collection(c, collection, check_model=False)
    got = records(col, ["documents", "metadatas"], ids=version_ids(collection, [manifest]))
    chunks = sorted((ChunkView(chunk_id=cid, sequence=int(meta.get("chunk_sequence_id", 0)),
                               header_path=meta.get("header_path", ""), content_type=meta.get("content_type", ""),
                               content=text)
                     for cid, text, meta in got),
                    key=lambda ch: ch.sequence)
    return manifest, chunks


def get_document(c: Container, collection: str, document: str) -> DocumentContent:
    """A document's full text, reassembled from its chunks in order (by document id or file path)."""
    manifest, chunks = _current_chunks(c, collection, document)
    return DocumentContent(collection=collection, document=manifest["document"], title=manifest["title"],
                           kind=manifest["kind"], source=manifest["source"], path=manifest.get("path"),
                           updated_at=manifest["updated_at"], chunk_count=len(chunks),
                           content="\n\n".join(ch.content for ch in chunks))


def get_document_chunks(c: Container, collection: str, document: str) -> DocumentChunks:
    """A document's chunks in order, with their header paths and content types."""
    manifest, chunks = _current_chunks(c, collection, document)
    return DocumentChunks(collection=collection, document=manifest["document"], title=manifest.get("title"),
                          chunk_count=len(chunks), chunks=chunks)
