"""The knowledge-discovery tools: which knowledge nodes a task needs, their text, the catalogue, a search
over them and their dependency graph (research_agent/discovery/). All read-only and bounded by call_timeout.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.discovery.models import DependencyGraph, DiscoveryResult, KnowledgeBaseList, RetrievalResult
from research_agent.mcp.calls import Tool, add_tools, container
from research_agent.mcp.params import COUNT_BOUND, Cursor, Limit, ProjectScope, TaskType, aliased, names
from research_agent.search.service import QueryResult

DISCOVER = Tool("Before a coding task: the knowledge it needs, ranked {id, path, title, type, "
                "relevance_score, reason, estimated_tokens}. relevance_score: probability it is needed (>= 0.9 load, "
                ">= 0.7 should, >= 0.5 consider; none >= 0.5: nothing relevant known). Load ids with "
                "retrieve_knowledge.",
                title="Discover context for a task", returns=(DiscoveryResult,), read_only=True, idempotent=True)

DiscoverNames = names("collections", "Default: all.")


@DISCOVER
async def discover_context(
    task_description: Annotated[str, Field(description="The task at hand.")],
    ctx: Context,
    task_type: Annotated[TaskType | None, Field(description="Tunes which node types rank first.")] = None,
    current_file: Annotated[str | None, Field(description="The file being edited; nearby knowledge ranks "
                                                          "higher.")] = None,
    max_results: Annotated[int, Field(description="At most this many.", ge=1, json_schema_extra=COUNT_BOUND,
                                      validation_alias=aliased("max_results"))] = 5,
    collections: DiscoverNames = None,
    project: ProjectScope = None,
) -> ToolResult:
    from research_agent.discovery import discover_context as svc

    return DISCOVER.result(await DISCOVER.read(ctx, svc, container(ctx), task_description, task_type=task_type,
                                            current_file=current_file, max_results=max_results,
                                            collections=collections or None, project=project))


RETRIEVE = Tool("Knowledge nodes' full content by id (from discover_context, list_knowledge_bases), with metadata "
                "and total_tokens. At most 20 ids; unknown ones: not_found.",
                title="Retrieve knowledge", returns=(RetrievalResult,), read_only=True, idempotent=True)


@RETRIEVE
async def retrieve_knowledge(
    ids: Annotated[list[str], Field(description="Node ids (collection:node_id if ambiguous).")],
    ctx: Context,
    include_children: Annotated[bool, Field(description="Also each node's sub-sections.")] = False,
    format: Annotated[Literal["markdown", "json", "plain"], Field(
        description="json: typed sections (prose, code_block, table).")] = "markdown",
) -> ToolResult:
    from research_agent.discovery import retrieve_knowledge as svc

    return RETRIEVE.result(await RETRIEVE.read(ctx, svc, container(ctx), ids, include_children=include_children,
                                            format=format))


LIST_KB = Tool("A page of knowledge files and their nodes {id, path, title, type, status}, with totals; filters "
               "match a node's own or inherited type/status.",
               title="List knowledge bases", returns=(KnowledgeBaseList,), read_only=True, idempotent=True)


@LIST_KB
async def list_knowledge_bases(
    ctx: Context,
    filter_type: Annotated[str | None, Field(description="guideline, protocol, context, agent_skill, plan, "
                                                         "task, log ...")] = None,
    filter_status: Annotated[str | None, Field(description="active, draft, deprecated ...")] = None,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ToolResult:
    from research_agent.discovery import list_knowledge_bases as svc

    return LIST_KB.result(await LIST_KB.read(ctx, svc, container(ctx), filter_type=filter_type,
                                          filter_status=filter_status, limit=limit, cursor=cursor))


SEARCH = Tool("query_knowledge_base over the knowledge collections, for questions during a task.",
              title="Search knowledge", returns=(QueryResult,), read_only=True, idempotent=True)

ScopeNames = names("scope", "Collections or one project (default: all).")


@SEARCH
async def search_knowledge(
    query: Annotated[str, Field(description="What to look for.")],
    ctx: Context,
    search_type: Annotated[Literal["semantic", "keyword", "hybrid"], Field(
        description="As query_knowledge_base's mode.")] = "hybrid",
    scope: ScopeNames = None,
    max_results: Annotated[int, Field(description="How many results.", ge=1, json_schema_extra=COUNT_BOUND,
                                      validation_alias=aliased("max_results"))] = 10,
) -> ToolResult:
    from research_agent.discovery import search_knowledge as svc

    return SEARCH.result(await SEARCH.read(ctx, svc, container(ctx), query, search_type=search_type,
                                        scope=scope or None, max_results=max_results))


DEPENDENCIES = Tool("A node's upstream (what it depends on: blocked_by, parent) and downstream (what depends on "
                    "it): edges {source, target, kind}, cycles, dangling blocked_by ids.",
                    title="Get dependencies", returns=(DependencyGraph,), read_only=True, idempotent=True)


@DEPENDENCIES
async def get_dependencies(
    node_id: Annotated[str, Field(description="The node to analyse.")],
    ctx: Context,
    direction: Annotated[Literal["upstream", "downstream", "both"], Field(
        description="Which links to follow.")] = "both",
    depth: Annotated[int, Field(description="Levels to follow.", ge=1)] = 1,
) -> ToolResult:
    from research_agent.discovery import get_dependencies as svc

    return DEPENDENCIES.result(await DEPENDENCIES.read(ctx, svc, container(ctx), node_id, direction=direction,
                                                    depth=depth))


def register(mcp: FastMCP) -> None:
    add_tools(mcp, discover_context, retrieve_knowledge, list_knowledge_bases, search_knowledge, get_dependencies)
