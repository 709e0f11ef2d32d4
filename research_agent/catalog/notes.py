"""Augmentation: external research and notes stored with their source, title and provenance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from research_agent.catalog.collections import now_iso, open_collection
from research_agent.errors import DocumentError
from research_agent.ingest.prepare import PreparedDocument, chunk_parsed, content_hash, document_key
from research_agent.ingest.service import recover_if_needed, write_documents
from research_agent.text import clean_text

if TYPE_CHECKING:
    from research_agent.container import Container


class AugmentResult(BaseModel):
    collection: str
    document: str
    title: str
    source: str
    kind: str
    chunks_written: int
    status: str  # added | unchanged | updated


MAX_RESEARCH_CHARS = 2_000_000


def _clean(text: str | None) -> str | None:
    """Text without lone surrogates (clean_text): Chroma raised UnicodeEncodeError on a source of "\udcff"."""
    return clean_text(text) if isinstance(text, str) else text


def add_research(c: Container, collection: str, content: str, source: str, title: str | None = None,
                 kind: str = "research") -> AugmentResult:
    """Store research text (Markdown) with its source; the same content from the same source is stored once."""
    from research_agent.ingest.parsing import parse_text

    if not isinstance(content, str) or not content.strip():
        raise DocumentError("The research content is empty", guidance="Pass --content TEXT, --file F or text on stdin.")
    if len(content) > MAX_RESEARCH_CHARS:
        raise DocumentError(f"The content has {len(content)} characters; the limit is {MAX_RESEARCH_CHARS}",
                            guidance="Split it into several pieces.")
    if not isinstance(source, str) or not source.strip():
        raise DocumentError("The source is empty", guidance="Pass --source with a URL or citation.")
    content, source, title = _clean(content), _clean(source), _clean(title)
    c.store.refresh()
    open_collection(c, collection)
    # An "unchanged" answer writes nothing, so a write of this very text killed after its manifest flipped
    # would keep its intent forever: finish it first (the crash harness found this).
    recover_if_needed(c, collection)
    digest = content_hash(f"{source}\n{content}")
    document = f"{kind}:{content_hash(source)[:16]}:{digest[:12]}"
    key = document_key(collection, document)
    if c.store.registry_get([key]):
        existing = c.store.registry_get([key])[key]
        return AugmentResult(collection=collection, document=document, title=existing["title"], source=source,
                             kind=kind, chunks_written=0, status="unchanged")
    parsed = parse_text(content, format="markdown", name=title or source)
    doc_title = title or parsed.title or source
    chunks = chunk_parsed(c, parsed, document, doc_title)
    doc = PreparedDocument(document=document, title=doc_title, kind=kind, source=source, content_hash=digest,
                           chunks=chunks, extra={"added_at": now_iso()})
    written = write_documents(c, collection, [doc])
    return AugmentResult(collection=collection, document=document, title=doc_title, source=source, kind=kind,
                         chunks_written=written, status="added")


def add_note(c: Container, collection: str, content: str, title: str, source: str | None = None) -> AugmentResult:
    """A note is a research document of kind `note` with a stable id that update_note replaces in place."""
    import uuid

    if not isinstance(title, str) or not title.strip():
        raise DocumentError("A note needs a title", guidance="Pass --title.")
    document = f"note:{uuid.uuid4().hex[:12]}"
    return _write_note(c, collection, document, content, _clean(title.strip()), _clean(source) or document,
                       status="added")


def update_note(c: Container, collection: str, document: str, content: str, title: str | None = None) -> AugmentResult:
    """Replace a note's content (and title) in place; queries never see both versions."""
    from research_agent.ingest.documents import find_document

    c.store.refresh()
    found = next(iter(find_document(c, collection, document).values()))
    if found.get("kind") != "note":
        raise DocumentError(f"{document!r} is a {found.get('kind')}, not a note",
                            guidance="Only notes are updated in place; re-ingest files with kb add-document.")
    return _write_note(c, collection, found["document"], content, _clean(title) or found["title"], found["source"],
                       status="updated")


def _write_note(c: Container, collection: str, document: str, content: str, title: str, source: str,
                status: str) -> AugmentResult:
    from research_agent.ingest.parsing import parse_text

    if not isinstance(content, str) or not content.strip():
        raise DocumentError("The note is empty", guidance="Pass --content TEXT, --file F or text on stdin.")
    if len(content) > MAX_RESEARCH_CHARS:
        raise DocumentError(f"The note has {len(content)} characters; the limit is {MAX_RESEARCH_CHARS}")
    content = clean_text(content)
    c.store.refresh()
    open_collection(c, collection)
    chunks = chunk_parsed(c, parse_text(content, format="markdown", name=title), document, title)
    doc = PreparedDocument(
        document=document,
        title=title,
        kind="note",
        source=source,
        content_hash=content_hash(f"{title}\n{content}"),
        chunks=chunks,
        extra={"added_at": now_iso()},
    )
    written = write_documents(c, collection, [doc])
    return AugmentResult(collection=collection, document=document, title=title, source=source, kind="note",
                         chunks_written=written, status=status)
