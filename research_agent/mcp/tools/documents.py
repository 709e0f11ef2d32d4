"""ingest_documents, augment_knowledge and manage_documents: what goes into a collection and how it is
listed, read, removed, re-embedded and pruned (research_agent/ingest/, research_agent/catalog/notes.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.params import CollectionName

INGEST = Tool("Add a file or a folder of files (Markdown, text, code, PDF, ...) to a collection. Unchanged files "
              "are skipped, changed files replace their old chunks. Reports progress; exempt from the call "
              "timeout; a cancelled call stops before the next file. Returns counts (added, updated, unchanged, "
              "removed), skipped and failed files with reasons, and chunks_written.",
              title="Ingest files", read_only=False, destructive=True, idempotent=True)


@INGEST
async def ingest_documents(
    path: Annotated[str, Field(description="A file or folder on the server's machine, under its allowed roots "
                                           "(RESEARCH_AGENT_ALLOWED_ROOTS; default: its working directory). "
                                           "Absolute paths are safest.")],
    collection: CollectionName,
    ctx: Context,
    recursive: Annotated[bool, Field(description="Folders: include subfolders (default true, as the CLI's "
                                                 "kb add-folder; false for the top level only).")] = True,
    include: Annotated[list[str] | None, Field(description="Folders: only files matching these globs, e.g. "
                                                           "['*.md', 'docs/**/*.py'].")] = None,
    exclude: Annotated[list[str] | None, Field(description="Folders: skip files or folders matching these globs "
                                                           "(.gitignore and build folders are skipped "
                                                           "anyway).")] = None,
    prune: Annotated[bool, Field(description="Folders: remove documents whose files are gone from the "
                                             "folder.")] = False,
    title: Annotated[str | None, Field(description="A single file: its title (default: from the "
                                                   "document).")] = None,
) -> ToolResult:
    from research_agent.ingest import ingest_path

    c = container(ctx)
    data = await INGEST.job(ctx, {"collection": collection, "path": path}, ingest_path, c, path, collection,
                            recursive=recursive, include=tuple(include or ()), exclude=tuple(exclude or ()),
                            prune=prune, title=title, allowed_roots=c.settings.resolved_allowed_roots())
    return INGEST.result(data)


AUGMENT = Tool("Save research text with its source into a collection so later queries find it. The same content "
               "from the same source is stored once (status \"unchanged\"). Returns the stored document's key, "
               "status and chunks_written.",
               title="Save research", read_only=False, destructive=False, idempotent=True)


@AUGMENT
async def augment_knowledge(
    content: Annotated[str, Field(description="The research to keep, as Markdown (findings, summaries, "
                                              "excerpts).")],
    source: Annotated[str, Field(description="Where it came from: a URL, a citation or a file path.")],
    collection: CollectionName,
    ctx: Context,
    title: Annotated[str | None, Field(description="A title (default: the first heading or line).")] = None,
) -> ToolResult:
    from research_agent.catalog.notes import add_research

    return AUGMENT.result(await AUGMENT.write(ctx, add_research, container(ctx), collection, content, source,
                                              title=title))


DOCUMENTS = Tool("List, read, remove or re-embed the documents of a collection, add or update notes, and prune "
                 "documents whose files are gone. Returns {\"collection\", \"documents\": [...]} (list), the "
                 "document's text (get), {\"deleted\", \"kind\", \"chunks_removed\"} (remove), the note's key and "
                 "status (add-note, update-note) or an ingest report (reindex, reports progress and is exempt from "
                 "the call timeout; prune: removed_documents and not_pruned with reasons).",
                 title="Manage documents", read_only=False, destructive=True, idempotent=False)


@DOCUMENTS
async def manage_documents(
    action: Annotated[Literal["list", "get", "remove", "reindex", "add-note", "update-note", "prune"], Field(
        description="list: the documents in the collection; get: one document's full text; remove: one "
                    "document and its chunks; reindex: re-embed the whole collection with the configured "
                    "embedding model (after a model change; reports progress); add-note: a new note (content, "
                    "title); update-note: replace a note's content in place (document, content); prune: "
                    "remove the documents whose files are gone, e.g. after a folder was moved (under, "
                    "dry_run); never research or notes, never a file that cannot be read.")],
    collection: CollectionName,
    ctx: Context,
    document: Annotated[str | None, Field(
        description="get/remove/update-note: the document key as `list` shows it (or the file's path); "
                    "notes have keys like note:3f2a...")] = None,
    content: Annotated[str | None, Field(description="add-note/update-note: the note text (Markdown).")] = None,
    title: Annotated[str | None, Field(description="add-note: the note's title (required); update-note: a new "
                                                   "title.")] = None,
    source: Annotated[str | None, Field(description="add-note: where the note came from.")] = None,
    under: Annotated[str | None, Field(description="prune: only documents ingested from this folder (under "
                                                   "the allowed roots; it may no longer exist); confirms its "
                                                   "files are gone even if it looks like an unmounted "
                                                   "drive.")] = None,
    dry_run: Annotated[bool, Field(description="prune: report what would be removed, remove nothing.")] = False,
) -> ToolResult:
    from research_agent import ingest as svc
    from research_agent.catalog import notes as augment

    c, call = container(ctx), DOCUMENTS
    if action == "list":
        data = await call.read(ctx, svc.list_documents, c, collection)
    elif action == "get":
        data = await call.read(ctx, svc.get_document, c, collection, require(document, "document", action))
    elif action == "remove":
        data = await call.write(ctx, svc.remove_document, c, collection, require(document, "document", action))
    elif action == "add-note":
        data = await call.write(ctx, augment.add_note, c, collection, require(content, "content", action),
                                require(title, "title", action), source=source)
    elif action == "update-note":
        data = await call.write(ctx, augment.update_note, c, collection, require(document, "document", action),
                                require(content, "content", action), title=title)
    elif action == "prune":
        data = await call.write(ctx, svc.prune_missing, c, collection, under, dry_run=dry_run,
                                allowed_roots=c.settings.resolved_allowed_roots())
    else:
        data = await call.job(ctx, {"collection": collection, "path": None}, svc.reindex_collection, c, collection)
    return call.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, ingest_documents, augment_knowledge, manage_documents)
