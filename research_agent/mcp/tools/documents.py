"""ingest_documents, augment_knowledge and manage_documents: what goes into a collection and how it is
listed, read, removed, re-embedded and pruned (research_agent/ingest/, research_agent/catalog/notes.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import BaseModel, Field

from research_agent.catalog.common import Deleted
from research_agent.catalog.notes import AugmentResult
from research_agent.ingest.documents import DocumentContent, DocumentList
from research_agent.ingest.records import RecordsReport
from research_agent.ingest.service import IngestReport
from research_agent.ingest.web import UrlReport
from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.params import CollectionName, Cursor, Limit

INGEST = Tool("Add a file or folder (Markdown, code, PDF, notebooks, CSV, ...), a web page (http(s) URL, hosts the "
              "server allows) or a records file (`records`: one document per JSON/JSONL/CSV record) to a collection; "
              "unchanged items are skipped, changed ones replace their chunks. Progress; no call timeout. Returns "
              "counts and what was skipped or failed, with reasons.",
              title="Ingest files", returns=(IngestReport, RecordsReport, UrlReport), destructive=True,
              idempotent=True)
# A web page reaches the network, which no other tool does: say so (MCP's openWorldHint).
INGEST.annotations["openWorldHint"] = True


class RecordsMapping(BaseModel):
    """Which fields of each record make its document (kb add-records' options); names may be dotted."""

    id_field: str
    text_fields: list[str] = Field(description="Joined as the text.")
    title_field: str | None = None
    keywords_field: str | None = None
    metadata_fields: list[str] = Field(default_factory=list, description="Added as `field: value` lines.")
    records_path: str | None = Field(None, description="JSON: the dotted path of the array.")


@INGEST
async def ingest_documents(
    path: Annotated[str, Field(description="On the server, under its allowed roots (default: its working "
                                           "directory; absolute is safest), or an http(s) URL.")],
    collection: CollectionName,
    ctx: Context,
    recursive: Annotated[bool, Field(description="Folders: include subfolders (as kb add-folder).")] = True,
    include: Annotated[list[str] | None, Field(description="Folders: only files matching these globs, e.g. "
                                                           "['*.md'].")] = None,
    exclude: Annotated[list[str] | None, Field(description="Folders: skip what matches (.gitignore is "
                                                           "honoured anyway).")] = None,
    prune: Annotated[bool, Field(description="Remove documents whose files (or records) are gone.")] = False,
    title: Annotated[str | None, Field(description="A single file: its title.")] = None,
    records: Annotated[RecordsMapping | None, Field(description="`path` is a records file (kb add-records).")
                       ] = None,
) -> ToolResult:
    from research_agent.ingest import ingest_path

    c = container(ctx)
    job = {"collection": collection, "path": path}
    if path.strip().lower().startswith(("http://", "https://")):
        from research_agent.ingest.web import add_urls

        return INGEST.result(await INGEST.write(ctx, add_urls, c, collection, [path]))
    if records is not None:
        return INGEST.result(await INGEST.job(ctx, job, _ingest_records, c, path, collection, records, prune=prune,
                                              allowed_roots=c.settings.resolved_allowed_roots()))
    data = await INGEST.job(ctx, job, ingest_path, c, path, collection,
                            recursive=recursive, include=tuple(include or ()), exclude=tuple(exclude or ()),
                            prune=prune, title=title, allowed_roots=c.settings.resolved_allowed_roots())
    return INGEST.result(data)


def _ingest_records(c: Any, path: str, collection: str, mapping: RecordsMapping, *, prune: bool,
                    allowed_roots: list[Any], progress: Any = None) -> RecordsReport:
    """The mapping is checked inside the call, so a bad one is a coded tool error like the service's own."""
    from research_agent.ingest.records import RecordFields, ingest_records

    fields = RecordFields(id=mapping.id_field, text=tuple(mapping.text_fields), title=mapping.title_field,
                          keywords=mapping.keywords_field, metadata=tuple(mapping.metadata_fields),
                          records_path=mapping.records_path)
    return ingest_records(c, path, collection, fields, prune=prune, progress=progress, allowed_roots=allowed_roots)


AUGMENT = Tool("Save research text with its source so queries find it; the same content and source is stored once "
               "(status unchanged).",
               title="Save research", returns=(AugmentResult,), idempotent=True)


@AUGMENT
async def augment_knowledge(
    content: Annotated[str, Field(description="The research, as Markdown.")],
    source: Annotated[str, Field(description="A URL, citation or file path.")],
    collection: CollectionName,
    ctx: Context,
    title: Annotated[str | None, Field(description="Default: the first heading or line.")] = None,
) -> ToolResult:
    from research_agent.catalog.notes import add_research

    return AUGMENT.result(await AUGMENT.write(ctx, add_research, container(ctx), collection, content, source,
                                              title=title))


DOCUMENTS = Tool("A collection's documents and notes. Returns a page {documents, total, next_cursor} (list), the "
                 "text with numbered lines {content, lines: [{n, text}], line_start, line_end, total_lines, missing, "
                 "inexact} (get; file line numbers, as query hits cite them), {deleted, chunks_removed} (remove), "
                 "the note's key (add-note, update-note) or an ingest report (reindex: progress, no call "
                 "timeout; prune).",
                 title="Manage documents", idempotent=False,
                 returns=(DocumentList, DocumentContent, Deleted, AugmentResult, IngestReport),
                 actions={"list": "read", "get": "read", "add-note": "write", "update-note": "write",
                          "reindex": "write", "remove": "delete", "prune": "delete"})


@DOCUMENTS
async def manage_documents(
    action: Annotated[Literal["list", "get", "remove", "reindex", "add-note", "update-note", "prune"], Field(
        description="reindex: re-embed with the configured model (after a model change); prune: remove "
                    "documents whose files are gone (never research, notes or unreadable files).")],
    collection: CollectionName,
    ctx: Context,
    document: Annotated[str | None, Field(
        description="get, remove, update-note: the key list shows (or the file's path); get also takes "
                    "DOCUMENT:10-20 or DOCUMENT:42.")] = None,
    line_start: Annotated[int | None, Field(description="get: first line (1-based), e.g. a hit's line_start.",
                                            ge=1)] = None,
    line_end: Annotated[int | None, Field(description="get: last line (default: to the end; past the end is "
                                                      "cut there, with a note).", ge=1)] = None,
    content: Annotated[str | None, Field(description="add-note, update-note: Markdown.")] = None,
    title: Annotated[str | None, Field(description="add-note (required), update-note.")] = None,
    source: Annotated[str | None, Field(description="add-note: its origin.")] = None,
    under: Annotated[str | None, Field(description="prune: only what came from this folder (may be "
                                                   "gone or look unmounted).")] = None,
    dry_run: Annotated[bool, Field(description="prune: report, remove nothing.")] = False,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ToolResult:
    from research_agent import ingest as svc
    from research_agent.catalog import notes as augment

    c, call = container(ctx), DOCUMENTS
    if action == "list":
        data = await call.act(ctx, action, svc.list_documents, c, collection, limit=limit, cursor=cursor)
    elif action == "get":
        data = await call.act(ctx, action, svc.get_document, c, collection, require(document, "document", action),
                              line_start=line_start, line_end=line_end)
    elif action == "remove":
        data = await call.act(ctx, action, svc.remove_document, c, collection, require(document, "document", action))
    elif action == "add-note":
        data = await call.act(ctx, action, augment.add_note, c, collection, require(content, "content", action),
                              require(title, "title", action), source=source)
    elif action == "update-note":
        data = await call.act(ctx, action, augment.update_note, c, collection, require(document, "document", action),
                              require(content, "content", action), title=title)
    elif action == "prune":
        data = await call.act(ctx, action, svc.prune_missing, c, collection, under, dry_run=dry_run,
                              allowed_roots=c.settings.resolved_allowed_roots())
    else:
        data = await call.job(ctx, {"collection": collection, "path": None}, svc.reindex_collection, c, collection)
    return call.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, ingest_documents, augment_knowledge, manage_documents)
