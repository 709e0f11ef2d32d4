"""query_knowledge_base: the query engine behind `research-agent query` (research_agent/search/service.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, state
from research_agent.mcp.params import COUNT_BOUND, Filters, MaxTokens, ProjectScope, Snippets, aliased, names
from research_agent.search.service import QueryResult

QUERY = Tool("Search: ranked chunks with relevance_score (probability), source_document, header_path; cite "
             "path:line_start-line_end or page; query_refinement if vague.",
             title="Search the knowledge base", returns=(QueryResult,), read_only=True, idempotent=True)

SearchedNames = names("collections", "Default: the project's, else all.")


@QUERY
async def query_knowledge_base(
    query: Annotated[str, Field(description="A question or keywords.")],
    ctx: Context,
    collections: SearchedNames = None,
    top_k: Annotated[int, Field(description="Chunks to return.",
                                ge=1, json_schema_extra=COUNT_BOUND, validation_alias=aliased("top_k"))] = 10,
    document_context: Annotated[str | None, Field(
        description="Text or code at hand, steers ranking.")] = None,
    project: ProjectScope = None,
    mode: Annotated[Literal["hybrid", "semantic", "keyword"], Field(
        description="hybrid: both; keyword: exact names, errors.")] = "hybrid",
    rerank: Annotated[bool, Field(description="Cross-encoder rerank.")] = True,
    filters: Filters = None,
    max_tokens: MaxTokens = None,
    snippets: Snippets = False,
    explain: Annotated[bool, Field(description="Ranks, scores, matches per hit.")] = False,
    diverse: Annotated[bool, Field(description="MMR: fewer near-duplicates.")] = False,
) -> ToolResult:
    from research_agent.search.service import query_knowledge

    data = await QUERY.read(ctx, query_knowledge, container(ctx), query, collections=collections or None,
                            project=project, top_k=top_k, document_context=document_context, mode=mode,
                            rerank=rerank, filters=filters, max_tokens=max_tokens, snippets=snippets, explain=explain,
                            diverse=diverse)
    state(ctx).record_query(data)
    return QUERY.result(data)


def register(mcp: FastMCP) -> None:
    add_tools(mcp, query_knowledge_base)
