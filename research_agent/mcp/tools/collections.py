"""manage_collections: create, list, inspect, delete, export and import collections (research_agent/catalog/
collections.py; export and import: research_agent/ops/backup.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.catalog.collections import CollectionCreated, CollectionInfo, CollectionList
from research_agent.catalog.common import Deleted
from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.params import Cursor, Limit, aliased
from research_agent.ops.backup import BackupReport

# export and import are writes (export writes a file, never over an existing one; import adds documents).
COLLECTIONS = Tool("A collection holds documents and their chunks; delete removes them too (no undo).",
                   title="Manage collections",
                   returns=(CollectionCreated, CollectionInfo, CollectionList, Deleted, BackupReport),
                   idempotent=False,
                   actions={"list": "read", "info": "read", "create": "write", "export": "write", "import": "write",
                            "delete": "delete"})


@COLLECTIONS
async def manage_collections(
    action: Annotated[Literal["create", "list", "info", "delete", "export", "import"], Field(
        description="export: to a new file (path); import: from path.")],
    ctx: Context,
    collection_name: Annotated[str | None, Field(
        description="3-512 of [A-Za-z0-9._-]; import: default the file's.",
        validation_alias=aliased("collection_name"))] = None,
    collection_type: Annotated[Literal["fundamental", "project-specific"] | None, Field(
        description="fundamental: general reference; default project-specific; list: filter.")] = None,
    project_name: Annotated[str | None, Field(
        description="create: link to it; list: filter.", validation_alias=aliased("project_name"))] = None,
    description: Annotated[str | None, Field(description="create: what it holds.")] = None,
    path: Annotated[str | None, Field(description="export, import: JSONL under the allowed roots.")] = None,
    on_conflict: Annotated[Literal["skip", "replace", "error"], Field(
        description="import: a document there with other content.")] = "skip",
    exist_ok: Annotated[bool, Field(description="create: if it exists, use it (type must match; project_name is "
                                                "linked).")] = False,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ToolResult:
    from research_agent.catalog import collections as svc
    from research_agent.ops import backup

    c, call = container(ctx), COLLECTIONS
    if action == "list":
        return call.result(await call.act(ctx, action, svc.list_collections, c, type=collection_type,
                                          project=project_name, limit=limit, cursor=cursor))
    if action == "import":
        data = await call.act(ctx, action, backup.import_collection, c, Path(require(path, "path", action)),
                              collection=collection_name, on_conflict=on_conflict,
                              allowed_roots=c.settings.resolved_allowed_roots())
        return call.result(data)
    name = require(collection_name, "collection_name", action)
    if action == "create":
        data = await call.act(ctx, action, svc.ensure_collection, c, name, type=collection_type,
                              description=description, project=project_name, exist_ok=exist_ok)
    elif action == "info":
        data = await call.act(ctx, action, svc.get_collection_info, c, name)
    elif action == "export":
        data = await call.act(ctx, action, backup.export_collection, c, name, Path(require(path, "path", action)),
                              allowed_roots=c.settings.resolved_allowed_roots())
    else:
        data = await call.act(ctx, action, svc.delete_collection, c, name)
    return call.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, manage_collections)
