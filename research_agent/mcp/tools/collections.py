"""manage_collections: create, list, inspect and delete collections (research_agent/catalog/collections.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.catalog.collections import CollectionInfo, CollectionList
from research_agent.catalog.common import Deleted
from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.params import Cursor, Limit, aliased

COLLECTIONS = Tool("Collections of documents. Returns the collection (create, info), a page {collections, total, "
                   "next_cursor} (list) or {deleted, kind, chunks_removed} (delete: cannot be undone).",
                   title="Manage collections", returns=(CollectionInfo, CollectionList, Deleted), idempotent=False,
                   actions={"list": "read", "info": "read", "create": "write", "delete": "delete"})


@COLLECTIONS
async def manage_collections(
    action: Annotated[Literal["create", "list", "info", "delete"], Field(
        description="list filters by collection_type, project_name; info: counts and model; delete: with all "
                    "its documents.")],
    ctx: Context,
    collection_name: Annotated[str | None, Field(
        description="create, info, delete: 3-512 of [A-Za-z0-9._-], alphanumeric at both ends.",
        validation_alias=aliased("collection_name"))] = None,
    collection_type: Annotated[Literal["fundamental", "project-specific"] | None, Field(
        description="create: project-specific (default; one project's material) or fundamental (general "
                    "reference); list: only this type.")] = None,
    project_name: Annotated[str | None, Field(
        description="create: link it to this project; list: only its collections.",
        validation_alias=aliased("project_name"))] = None,
    description: Annotated[str | None, Field(description="create: what it holds.")] = None,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ToolResult:
    from research_agent.catalog import collections as svc

    c, call = container(ctx), COLLECTIONS
    if action == "list":
        return call.result(await call.act(ctx, action, svc.list_collections, c, type=collection_type,
                                          project=project_name, limit=limit, cursor=cursor))
    name = require(collection_name, "collection_name", action)
    if action == "create":
        data = await call.act(ctx, action, svc.create_collection, c, name, type=collection_type or "project-specific",
                              description=description or "", project=project_name)
    elif action == "info":
        data = await call.act(ctx, action, svc.get_collection_info, c, name)
    else:
        data = await call.act(ctx, action, svc.delete_collection, c, name)
    return call.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, manage_collections)
