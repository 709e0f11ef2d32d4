"""query_knowledge_base: the query engine behind `research-agent query` (research_agent/search/service.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent.mcp.calls import Tool, add_tools, container, state
from research_agent.mcp.params import COUNT_BOUND, Filters, MaxTokens, Snippets, aliased, names
from research_agent.search.service import QueryResult

QUERY = Tool("Search the knowledge base: the most relevant chunks {content, source_document, header_path, "
             "relevance_score (probability 0-1), relevance_label, metadata (line_start/line_end: the file lines the "
             "chunk spans, page for PDFs; manage_documents get reads them)}; query_refinement says when the query "
             "is too broad or unclear, with suggestions.",
             title="Search the knowledge base", returns=(QueryResult,), read_only=True, idempotent=True)

SearchedNames = names("collections", "Collections to search (default: the project's, else all).")


@QUERY
async def query_knowledge_base(
    query: Annotated[str, Field(description="A question or keywords.")],
    ctx: Context,
    collections: SearchedNames = None,
    top_k: Annotated[int, Field(description="Chunks to return (up to max_top_k).",
                                ge=1, json_schema_extra=COUNT_BOUND, validation_alias=aliased("top_k"))] = 10,
    document_context: Annotated[str | None, Field(
        description="The text or code being worked on; ranks related chunks higher.")] = None,
    project: Annotated[str | None, Field(description="Search this project's default collections.",
                                         validation_alias=aliased("project"))] = None,
    mode: Annotated[Literal["hybrid", "semantic", "keyword"], Field(
        description="hybrid: embeddings + keywords; semantic; keyword: exact terms (names, errors).")] = "hybrid",
    rerank: Annotated[bool, Field(description="Rerank with the cross-encoder if available.")] = True,
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
