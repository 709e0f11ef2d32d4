"""manage_projects: projects and the collections linked to them (research_agent/catalog/projects.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.catalog.common import Deleted
from research_agent.catalog.projects import ProjectInfo, ProjectList
from research_agent.mcp.calls import Tool, add_tools, container, require
from research_agent.mcp.params import Cursor, Limit, aliased, names

if TYPE_CHECKING:
    from research_agent.container import Container

PROJECTS = Tool("A project groups the collections searched for one codebase; delete leaves them.",
                title="Manage projects", returns=(ProjectInfo, ProjectList, Deleted), idempotent=False,
                actions={"list": "read", "info": "read", "create": "write", "link": "write", "unlink": "write",
                         "set-defaults": "write", "delete": "delete"})

LinkedNames = names("collections", "create, link, unlink, set-defaults.")


def create_with_links(c: Container, name: str, description: str, collections: list[str] | None) -> ProjectInfo:
    """`create` with `collections` links them too (the spec's create takes them). They are checked first, so a
    missing collection creates nothing."""
    from research_agent.catalog import projects as svc

    if collections:
        c.store.require_collections(collections)
    created = svc.create_project(c, name, description=description)
    return svc.link_collections(c, name, collections) if collections else created


@PROJECTS
async def manage_projects(
    action: Annotated[Literal["create", "list", "info", "delete", "link", "unlink", "set-defaults"], Field(
        description="set-defaults: what a query with this project searches.")],
    ctx: Context,
    project_name: Annotated[str | None, Field(description="All actions but list.",
                                              validation_alias=aliased("project_name"))] = None,
    collections: LinkedNames = None,
    description: Annotated[str | None, Field(description="create: what the project is.")] = None,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ToolResult:
    from research_agent.catalog import projects as svc

    c, call = container(ctx), PROJECTS
    if action == "list":
        return call.result(await call.act(ctx, action, svc.list_projects, c, limit=limit, cursor=cursor))
    name = require(project_name, "project_name", action)
    if action == "create":
        data = await call.act(ctx, action, create_with_links, c, name, description or "", collections)
    elif action == "info":
        data = await call.act(ctx, action, svc.get_project_info, c, name)
    elif action == "delete":
        data = await call.act(ctx, action, svc.delete_project, c, name)
    else:
        listed = require(collections, "collections", action)
        fn = {"link": svc.link_collections, "unlink": svc.unlink_collections,
              "set-defaults": svc.set_default_collections}[action]
        data = await call.act(ctx, action, fn, c, name, listed)
    return call.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, manage_projects)
