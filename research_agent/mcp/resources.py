"""MCP resources: collections, their documents and chunks, the query history (research://...), and knowledge
files and nodes (knowledge://...). Each read is a `read` call (bounded by call_timeout)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import anyio
from fastmcp import Context, FastMCP

from research_agent.mcp.calls import Calls, container, state

KNOWLEDGE = Calls("resource knowledge")


async def knowledge_node_resource(collection: str, path: str, node_id: str, ctx: Context) -> str:
    from research_agent.discovery import read_knowledge_resource

    text, _meta = await KNOWLEDGE.read(ctx, read_knowledge_resource, container(ctx), collection, path, node_id)
    return text


async def knowledge_file_resource(collection: str, path: str, ctx: Context) -> str:
    from research_agent.discovery import read_knowledge_resource

    text, _meta = await KNOWLEDGE.read(ctx, read_knowledge_resource, container(ctx), collection, path)
    return text


async def knowledge_index_resource(ctx: Context, cursor: str | None = None) -> dict[str, Any]:
    from research_agent.discovery import list_knowledge_resources

    page = await Calls("resource knowledge index").read(ctx, list_knowledge_resources, container(ctx),
                                                        cursor=cursor)
    return with_next_uri(page, "research://knowledge")


async def knowledge_first_page_resource(ctx: Context) -> dict[str, Any]:
    return await knowledge_index_resource(ctx)


def with_next_uri(page: dict[str, Any], uri: str) -> dict[str, Any]:
    """A page of a resource list with `next_uri`: the uri to read for the next page (None on the last).

    Why: a resource read takes no arguments, so research://collections showed the first page (33 of 40
    collections, 90 of 131 documents, cut by the page's byte budget) and its next_cursor led nowhere (outside
    tester, 02b7f3e). Every page stays bounded (catalog/common.py's paging rule, 24 KB); the templates below
    take `?cursor=` (RFC 6570 `{?cursor}`, which FastMCP 4.1 matches and passes as an argument), so a client
    reads the whole list by following next_uri.
    """
    cursor = page.get("next_cursor")
    return {**page, "next_uri": f"{uri}?cursor={quote(cursor, safe='')}" if cursor else None}


async def collections_page_resource(ctx: Context, cursor: str | None = None) -> dict[str, Any]:
    from research_agent.catalog.collections import list_collections

    page = await Calls("resource collections").read(ctx, list_collections, container(ctx), cursor=cursor)
    return with_next_uri(page, "research://collections")


async def collections_resource(ctx: Context) -> dict[str, Any]:
    return await collections_page_resource(ctx)


async def collection_resource(name: str, ctx: Context) -> dict[str, Any]:
    from research_agent.catalog.collections import get_collection_info

    return await Calls("resource collection").read(ctx, get_collection_info, container(ctx), name)


async def documents_resource(name: str, ctx: Context, cursor: str | None = None) -> dict[str, Any]:
    from research_agent.ingest import list_documents

    page = await Calls("resource documents").read(ctx, list_documents, container(ctx), name, cursor=cursor)
    return with_next_uri(page, f"research://collections/{quote(name, safe='')}/documents")


async def chunks_resource(name: str, document: str, ctx: Context) -> dict[str, Any]:
    from research_agent.ingest import get_document_chunks

    return await Calls("resource document").read(ctx, get_document_chunks, container(ctx), name, document)


async def history_resource(ctx: Context) -> dict[str, Any]:
    from research_agent.search.history import recent_queries

    await anyio.to_thread.run_sync(state(ctx).flush_history)  # this session's last query is in the list
    return {"queries": await Calls("resource history").read(ctx, recent_queries, container(ctx), 50)}


def register(mcp: FastMCP) -> None:
    """Register in this order: FastMCP drops the fragment for a template without `#`, so the node template must
    come BEFORE the whole-file one (checked: in the other order `...md#node` reads the whole file)."""
    json = "application/json"
    mcp.resource("knowledge://{collection}/{path*}#{node_id}", name="knowledge-node", mime_type="text/markdown",
                 description="One knowledge node (by node id or anchor) with its sub-sections.",
                 )(knowledge_node_resource)
    mcp.resource("knowledge://{collection}/{path*}", name="knowledge-file", mime_type="text/markdown",
                 description="A whole ingested knowledge file, reassembled from its chunks; `path` is the document "
                             "key (e.g. knowledge/guidelines/testing.md).")(knowledge_file_resource)
    pages = " One page (at most 100 items, about 24 KB); read next_uri for the next, until it is null."
    mcp.resource("research://knowledge", name="knowledge-index", mime_type=json,
                 description="Every knowledge file as {uri, name, mimeType, metadata: {id, type, status, "
                             "last_checked, node_count, nodes}}; read one with its knowledge:// uri." + pages,
                 )(knowledge_first_page_resource)
    mcp.resource("research://knowledge{?cursor}", name="knowledge-index-page", mime_type=json,
                 description="A further page of research://knowledge (cursor: the previous page's next_cursor)."
                 )(knowledge_index_resource)
    mcp.resource("research://collections", name="collections", mime_type=json,
                 description="The collections with their type, description, projects and document and chunk "
                             "counts." + pages)(collections_resource)
    mcp.resource("research://collections{?cursor}", name="collections-page", mime_type=json,
                 description="A further page of research://collections (cursor: the previous page's next_cursor)."
                 )(collections_page_resource)
    mcp.resource("research://collections/{name}", name="collection", mime_type=json,
                 description="One collection's info: type, description, embedding model, counts, projects.",
                 )(collection_resource)
    mcp.resource("research://collections/{name}/documents{?cursor}", name="collection-documents",
                 mime_type=json, description="The documents of one collection." + pages)(documents_resource)
    mcp.resource("research://collections/{name}/documents/{document*}", name="document-chunks", mime_type=json,
                 description="A document's chunks in order (header path, content type, text); `document` is the "
                             "key that the documents list shows, e.g. notes/setup.md.")(chunks_resource)
    mcp.resource("research://history", name="query-history", mime_type=json,
                 description="The most recent queries (newest first, at most 50 here; the store keeps 200).",
                 )(history_resource)
