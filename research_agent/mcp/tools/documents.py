"""ingest_documents, augment_knowledge and manage_documents: what goes into a collection and how it is
listed, read, removed, re-embedded and pruned (research_agent/ingest/, research_agent/catalog/notes.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import BaseModel, Field

from research_agent.catalog.common import Deleted
from research_agent.catalog.notes import AugmentResult
from research_agent.errors import DocumentError
from research_agent.ingest.documents import DocumentContent, DocumentList
from research_agent.ingest.records import RecordsReport
from research_agent.ingest.service import IngestReport
from research_agent.ingest.web import UrlReport
from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.errors import ToolFailure
from research_agent.mcp.params import CollectionName, Cursor, Limit

INGEST = Tool("Add a file or folder (Markdown, code, PDF, notebooks, CSV ...), a web page (an allowed host's URL) or "
              "a records file to a collection; unchanged items are skipped, changed ones replaced. Progress; no call "
              "timeout. Returns counts and what was skipped or failed, why.",
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
    path: Annotated[str, Field(description="Under the server's allowed roots (default: its working directory; "
                                           "absolute is safest), or an http(s) URL.")],
    collection: CollectionName,
    ctx: Context,
    recursive: Annotated[bool, Field(description="Folders: include subfolders.")] = True,
    include: Annotated[list[str] | None, Field(description="Folders: only files matching these globs, e.g. "
                                                           "*.md.")] = None,
    exclude: Annotated[list[str] | None, Field(description="Folders: globs to skip (.gitignore is honoured "
                                                           "too).")] = None,
    prune: Annotated[bool, Field(description="Remove documents whose files (or records) are gone.")] = False,
    title: Annotated[str | None, Field(description="A single file: its title.")] = None,
    records: Annotated[RecordsMapping | None, Field(description="path is a JSON/JSONL/CSV file, a document per "
                                                                "record, mapped so.")] = None,
    create: Annotated[bool, Field(description="Create the collection (project-specific) if missing; a bad path "
                                              "creates nothing.")] = False,
) -> ToolResult:
    from research_agent.ingest import ingest_path

    c = container(ctx)
    roots = c.settings.resolved_allowed_roots()
    url = path.strip().lower().startswith(("http://", "https://"))
    if url and records is not None or re.match(r"\s*[a-zA-Z][\w+.-]*://", path) and not url:
        # An ftp:// path was refused as "outside the allowed roots", and a records mapping beside a URL was
        # silently ignored (outside tester): say what is wrong instead.
        raise ToolFailure(DocumentError(  # ToolFailure: a user error, logged without a traceback
            "Only http(s) URLs are fetched, and a URL is a web page, never a records file",
            guidance="Pass a file or folder path, or an http(s) URL without `records`."))
    if create:
        await INGEST.write(ctx, _create_for, c, path, collection, url=url, allowed_roots=roots)
    job = {"collection": collection, "path": path}
    if url:
        from research_agent.ingest.web import add_urls

        return INGEST.result(await INGEST.write(ctx, add_urls, c, collection, [path]))
    if records is not None:
        return INGEST.result(await INGEST.job(ctx, job, _ingest_records, c, path, collection, records, prune=prune,
                                              allowed_roots=roots))
    data = await INGEST.job(ctx, job, ingest_path, c, path, collection,
                            recursive=recursive, include=tuple(include or ()), exclude=tuple(exclude or ()),
                            prune=prune, title=title, allowed_roots=roots)
    return INGEST.result(data)


def _create_for(c: Any, path: str, collection: str, *, url: bool, allowed_roots: list[Any]) -> Any:
    """create=true, as `kb add-folder --create`: the collection is created (project-specific) only after the path
    or URL passed the checks the ingest makes first, so a typo leaves no empty collection behind; an existing
    collection of either type is used as it is."""
    from research_agent.catalog.collections import ensure_collection
    from research_agent.ingest.prepare import require_existing
    from research_agent.ingest.web import check_url

    if url:
        check_url(path, c.settings.url_allowed_hosts)
    else:
        require_existing(Path(path), allowed_roots)
    return ensure_collection(c, collection, exist_ok=True)


def _ingest_records(c: Any, path: str, collection: str, mapping: RecordsMapping, *, prune: bool,
                    allowed_roots: list[Any], progress: Any = None) -> RecordsReport:
    """The mapping is checked inside the call, so a bad one is a coded tool error like the service's own."""
    from research_agent.ingest.records import RecordFields, ingest_records

    fields = RecordFields(id=mapping.id_field, text=tuple(mapping.text_fields), title=mapping.title_field,
                          keywords=mapping.keywords_field, metadata=tuple(mapping.metadata_fields),
                          records_path=mapping.records_path)
    return ingest_records(c, path, collection, fields, prune=prune, progress=progress, allowed_roots=allowed_roots)


AUGMENT = Tool("Save research with its source so queries find it; the same content and source is stored once "
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


DOCUMENTS = Tool("A collection's documents and notes. get returns numbered lines (the file's, as query hits cite "
                 "them); reindex reports progress, with no call timeout.",
                 title="Manage documents", idempotent=False,
                 returns=(DocumentList, DocumentContent, Deleted, AugmentResult, IngestReport),
                 actions={"list": "read", "get": "read", "add-note": "write", "update-note": "write",
                          "reindex": "write", "remove": "delete", "prune": "delete"})


@DOCUMENTS
async def manage_documents(
    action: Annotated[Literal["list", "get", "remove", "reindex", "add-note", "update-note", "prune"], Field(
        description="reindex: re-embed with the configured model; prune: remove documents whose files are gone "
                    "(not research, notes or unreadable files).")],
    collection: CollectionName,
    ctx: Context,
    document: Annotated[str | None, Field(
        description="get, remove, update-note: its key (see list) or file path; get also takes KEY:10-20, "
                    "KEY:42.")] = None,
    line_start: Annotated[int | None, Field(description="get: first line, 1-based (a hit's line_start).",
                                            ge=1)] = None,
    line_end: Annotated[int | None, Field(description="get: last line (default: the end; past it: cut, with a "
                                                      "note).", ge=1)] = None,
    content: Annotated[str | None, Field(description="add-note, update-note: Markdown.")] = None,
    title: Annotated[str | None, Field(description="add-note (required), update-note.")] = None,
    source: Annotated[str | None, Field(description="add-note: its origin.")] = None,
    under: Annotated[str | None, Field(description="prune: only under this folder (even if gone or "
                                                   "unmounted).")] = None,
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
