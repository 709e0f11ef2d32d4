"""The knowledge-discovery tools: which knowledge nodes a task needs, their text, the catalogue, a search
over them and their dependency graph (research_agent/discovery/). All read-only and bounded by call_timeout.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container
from research_agent.mcp.params import TaskType

DISCOVER = Tool("Before starting a coding task, ask what knowledge you need: returns ranked recommendations of "
                "knowledge nodes ({id, path, title, type, relevance_score, reason, estimated_tokens}) and "
                "total_available. relevance_score is the probability the node is what the task needs: >= 0.9 must "
                "load, 0.7-0.9 should load, 0.5-0.7 consider, below 0.5 listed as 'skip' alternatives; no "
                "recommendation >= 0.5 means nothing relevant is known (see `message`). Load the ids with "
                "retrieve_knowledge. Read-only.",
                title="Discover context for a task", read_only=True, destructive=False, idempotent=True)


@DISCOVER
async def discover_context(
    task_description: Annotated[str, Field(description="The task you are about to perform, in natural "
                                                        "language.")],
    ctx: Context,
    task_type: Annotated[TaskType | None, Field(description="What kind of task; tunes which node types rank "
                                                            "higher.")] = None,
    current_file: Annotated[str | None, Field(description="Path of the file being worked on; knowledge "
                                                          "about nearby files ranks higher.")] = None,
    max_results: Annotated[int, Field(description="Maximum number of recommendations.", ge=1)] = 5,
    collections: Annotated[list[str] | None, Field(description="Collections to search (default: all).")] = None,
    project: Annotated[str | None, Field(description="Search this project's default collections.")] = None,
) -> ToolResult:
    from research_agent.discovery import discover_context as svc

    return DISCOVER.result(await DISCOVER.read(ctx, svc, container(ctx), task_description, task_type=task_type,
                                            current_file=current_file, max_results=max_results,
                                            collections=collections or None, project=project))


RETRIEVE = Tool("Fetch the full content of knowledge nodes by id (from discover_context or list_knowledge_bases), "
                "reassembled in document order, with metadata, children when asked, and total_tokens. At most 20 "
                "ids per call. Ids that do not exist are listed in not_found; the others are still returned.",
                title="Retrieve knowledge", read_only=True, destructive=False, idempotent=True)


@RETRIEVE
async def retrieve_knowledge(
    ids: Annotated[list[str], Field(description="Node ids; write collection:node_id when an id exists in "
                                                "several collections.")],
    ctx: Context,
    include_children: Annotated[bool, Field(description="Also return each node's sub-sections.")] = False,
    format: Annotated[Literal["markdown", "json", "plain"], Field(
        description="markdown: as written; plain: markup removed; json: content split into typed sections "
                    "(prose, code_block, table).")] = "markdown",
) -> ToolResult:
    from research_agent.discovery import retrieve_knowledge as svc

    return RETRIEVE.result(await RETRIEVE.read(ctx, svc, container(ctx), ids, include_children=include_children,
                                            format=format))


LIST_KB = Tool("The catalogue of knowledge files and their nodes: id, path, title, type, status, description, "
               "last_checked, node_count. Filters match a node's own or inherited type/status.",
               title="List knowledge bases", read_only=True, destructive=False, idempotent=True)


@LIST_KB
async def list_knowledge_bases(
    ctx: Context,
    filter_type: Annotated[str | None, Field(description="Only nodes of this type (guideline, protocol, "
                                                         "context, agent_skill, plan, task, log ...).")] = None,
    filter_status: Annotated[str | None, Field(description="Only nodes with this status (active, draft, "
                                                           "deprecated ...).")] = None,
) -> ToolResult:
    from research_agent.discovery import list_knowledge_bases as svc

    return LIST_KB.result(await LIST_KB.read(ctx, svc, container(ctx), filter_type=filter_type,
                                          filter_status=filter_status))


SEARCH = Tool("Full-text and semantic search across knowledge bases (the query engine of query_knowledge_base), "
              "returning chunks with scores. Use it for specific questions during a task.",
              title="Search knowledge", read_only=True, destructive=False, idempotent=True)


@SEARCH
async def search_knowledge(
    query: Annotated[str, Field(description="What to look for.")],
    ctx: Context,
    search_type: Annotated[Literal["semantic", "keyword", "hybrid"], Field(
        description="hybrid (default), semantic (embeddings only) or keyword (exact terms).")] = "hybrid",
    scope: Annotated[list[str] | None, Field(description="Collections to search, or one project name "
                                                         "(default: all collections).")] = None,
    max_results: Annotated[int, Field(description="How many results.", ge=1)] = 10,
) -> ToolResult:
    from research_agent.discovery import search_knowledge as svc

    return SEARCH.result(await SEARCH.read(ctx, svc, container(ctx), query, search_type=search_type,
                                        scope=scope or None, max_results=max_results))


DEPENDENCIES = Tool("The nodes a node depends on (upstream: its blocked_by and parent) and that depend on it "
                    "(downstream: nodes blocked by it, its children), breadth first to `depth` (capped by the server), "
                    "with edges {source, target, kind}, cycles and blocked_by ids that match no node.",
                    title="Get dependencies", read_only=True, destructive=False, idempotent=True)


@DEPENDENCIES
async def get_dependencies(
    node_id: Annotated[str, Field(description="The node to analyse.")],
    ctx: Context,
    direction: Annotated[Literal["upstream", "downstream", "both"], Field(
        description="upstream, downstream or both.")] = "both",
    depth: Annotated[int, Field(description="Levels to follow.", ge=1)] = 1,
) -> ToolResult:
    from research_agent.discovery import get_dependencies as svc

    return DEPENDENCIES.result(await DEPENDENCIES.read(ctx, svc, container(ctx), node_id, direction=direction,
                                                    depth=depth))


def register(mcp: FastMCP) -> None:
    add_tools(mcp, discover_context, retrieve_knowledge, list_knowledge_bases, search_knowledge, get_dependencies)
