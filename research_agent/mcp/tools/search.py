"""query_knowledge_base: the query engine behind `research-agent query` (research_agent/search/service.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, state
from research_agent.mcp.params import Filters, MaxTokens, Snippets

QUERY = Tool("Search the knowledge base and return the most relevant chunks with their source document, header "
             "path and a relevance score (0-1) and label. `query_refinement` says when the query is too broad or "
             "unclear, with suggestions; `reranked` and `warnings` say how the ranking was done. Read-only; "
             "bounded by the server's call timeout.",
             title="Search the knowledge base", read_only=True, destructive=False, idempotent=True)


@QUERY
async def query_knowledge_base(
    query: Annotated[str, Field(description="What to look for, in natural language or keywords.")],
    ctx: Context,
    collections: Annotated[list[str] | None, Field(
        description="Collections to search. Default: the project's default collections when `project` is "
                    "given, else every collection.")] = None,
    top_k: Annotated[int, Field(description="How many chunks to return (1 to the server's max_top_k, 100 by "
                                            "default).", ge=1)] = 10,
    document_context: Annotated[str | None, Field(
        description="Text of the document or code being worked on; it steers ranking toward related "
                    "chunks.")] = None,
    project: Annotated[str | None, Field(description="Search this project's linked collections.")] = None,
    mode: Annotated[Literal["hybrid", "semantic", "keyword"], Field(
        description="hybrid: embeddings and keywords fused (default); semantic: embeddings only; keyword: "
                    "exact terms only (names, error strings).")] = "hybrid",
    rerank: Annotated[bool, Field(description="Rerank with the cross-encoder when it is available.")] = True,
    filters: Filters = None,
    max_tokens: MaxTokens = None,
    snippets: Snippets = False,
) -> ToolResult:
    from research_agent.search.service import query_knowledge

    data = await QUERY.read(ctx, query_knowledge, container(ctx), query, collections=collections or None,
                            project=project, top_k=top_k, document_context=document_context, mode=mode,
                            rerank=rerank, filters=filters, max_tokens=max_tokens, snippets=snippets)
    state(ctx).record_query(data)
    return QUERY.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, query_knowledge_base)
