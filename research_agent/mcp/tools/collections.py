"""manage_collections: create, list, inspect and delete collections (research_agent/catalog/collections.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, require

COLLECTIONS = Tool("Create, list, inspect or delete knowledge collections. Returns the collection's info (create, "
                   "info), {\"collections\": [...]} (list) or {\"deleted\", \"kind\", \"chunks_removed\"} (delete). "
                   "delete removes the collection and all its documents and cannot be undone.",
                   title="Manage collections", read_only=False, destructive=True, idempotent=False)


@COLLECTIONS
async def manage_collections(
    action: Annotated[Literal["create", "list", "info", "delete"], Field(
        description="create: a new empty collection; list: all collections (filter by collection_type, "
                    "project_name); info: one collection's counts and model; delete: a collection and all "
                    "its documents (cannot be undone).")],
    ctx: Context,
    collection_name: Annotated[str | None, Field(
        description="The collection (required for create, info, delete). 3-512 characters of letters, "
                    "digits, '.', '_' or '-', starting and ending with a letter or digit.")] = None,
    collection_type: Annotated[Literal["fundamental", "project-specific"] | None, Field(
        description="create: the collection's type (default project-specific); list: only this type. "
                    "fundamental = general reference knowledge, project-specific = one project's "
                    "material.")] = None,
    project_name: Annotated[str | None, Field(
        description="create: link the new collection to this existing project; list: only collections "
                    "linked to it.")] = None,
    description: Annotated[str | None, Field(description="create: what the collection holds.")] = None,
) -> ToolResult:
    from research_agent.catalog import collections as svc

    c = container(ctx)
    if action == "list":
        return COLLECTIONS.result(await COLLECTIONS.read(ctx, svc.list_collections, c, type=collection_type,
                                                         project=project_name))
    name = require(collection_name, "collection_name", action)
    if action == "create":
        data = await COLLECTIONS.write(ctx, svc.create_collection, c, name, type=collection_type or "project-specific",
                                       description=description or "", project=project_name)
    elif action == "info":
        data = await COLLECTIONS.read(ctx, svc.get_collection_info, c, name)
    else:
        data = await COLLECTIONS.write(ctx, svc.delete_collection, c, name)
    return COLLECTIONS.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, manage_collections)
