"""manage_projects: projects and the collections linked to them (research_agent/catalog/projects.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, require

PROJECTS = Tool("Create, list, inspect or delete projects, and link collections to them. A project groups the "
                "collections an agent should search for one codebase. Returns the project's info, "
                "{\"projects\": [...]} (list) or {\"deleted\", \"kind\"} (delete). Deleting a project keeps its "
                "collections.",
                title="Manage projects", read_only=False, destructive=True, idempotent=False)


@PROJECTS
async def manage_projects(
    action: Annotated[Literal["create", "list", "info", "delete", "link", "unlink", "set-defaults"], Field(
        description="create/info/delete: one project; list: all projects; link/unlink: add or remove "
                    "collections from a project; set-defaults: the collections a query with this project "
                    "searches.")],
    ctx: Context,
    project_name: Annotated[str | None, Field(description="The project (required except for list).")] = None,
    collections: Annotated[list[str] | None, Field(
        description="Collection names (required for link, unlink and set-defaults).")] = None,
    description: Annotated[str | None, Field(description="create: what the project is.")] = None,
) -> ToolResult:
    from research_agent.catalog import projects as svc

    c = container(ctx)
    if action == "list":
        return PROJECTS.result(await PROJECTS.read(ctx, svc.list_projects, c))
    name = require(project_name, "project_name", action)
    if action == "create":
        data = await PROJECTS.write(ctx, svc.create_project, c, name, description=description or "")
    elif action == "info":
        data = await PROJECTS.read(ctx, svc.get_project_info, c, name)
    elif action == "delete":
        data = await PROJECTS.write(ctx, svc.delete_project, c, name)
    else:
        names = require(collections, "collections", action)
        fn = {"link": svc.link_collections, "unlink": svc.unlink_collections,
              "set-defaults": svc.set_default_collections}[action]
        data = await PROJECTS.write(ctx, fn, c, name, names)
    return PROJECTS.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, manage_projects)
