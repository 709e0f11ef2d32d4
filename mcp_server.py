"""The research-agent MCP server: one tool per row of DESIGN.md section 3, each a thin call into research_agent.

Run it with `python mcp_server.py`, `python -m mcp_server` or `research-agent serve`; all three call `run()`.
Stdout belongs to JSON-RPC: nothing here prints, logs go to stderr, and heavy libraries (torch, chromadb)
load on the first tool call that needs them, so the handshake stays fast.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastmcp import Context, FastMCP
from pydantic import Field

from research_agent import __version__
from research_agent.config import Settings, load_settings
from research_agent.container import Container, build_container, configure_logging
from research_agent.errors import ResearchAgentError
from research_agent.mcp_errors import ErrorMappingMiddleware, ToolFailure, invalid_params, to_tool_failure

log = logging.getLogger("research_agent.mcp")
T = TypeVar("T")

INSTRUCTIONS = """\
research-agent is a local knowledge base of collections of chunked documents (Markdown, code, PDFs, research
notes). Typical flow: manage_collections(action="list") to see what exists; query_knowledge_base to search;
ingest_documents to add files; augment_knowledge to save research you found. Errors are JSON-RPC errors with
data.type and data.guidance: -32001 config, -32002 collection, -32003 document, -32004 query."""

WARMUP_DELAY = 2.0  # seconds after start-up

# Keep model libraries' progress bars and advisory warnings off every stream; they would go to stderr,
# but a quiet stderr is what MCP clients show users as the server log.
_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# -- server plumbing ------------------------------------------------------------------------------
def _container(ctx: Context) -> Container:
    return ctx.lifespan_context["container"]


async def _call(ctx: Context, tool: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a synchronous service call in a worker thread (the event loop keeps answering) and dump it."""
    limiter = ctx.lifespan_context.get("limiter")
    try:
        result = await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)
    except Exception as exc:
        raise to_tool_failure(exc, tool) from exc
    return result.model_dump(mode="json")


async def _call_with_progress(ctx: Context, tool: str, fn: Callable[..., T], *args: Any,
                              **kwargs: Any) -> dict[str, Any]:
    """Like `_call`, passing `progress=` to the service and forwarding its reports as MCP progress.

    The worker thread only drops reports into a stream; a task on the event loop sends them, coalescing
    bursts to the latest report, so a slow client never slows ingestion down.
    """
    send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=math.inf)

    def progress(report: Any) -> None:
        try:
            anyio.from_thread.run_sync(send.send_nowait, report)
        except Exception:  # stream closed or loop gone: progress is best effort
            pass

    async def forward() -> None:
        sent = -1.0
        async with receive:
            async for report in receive:
                while True:
                    try:
                        report = receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                done, total = float(report.files_done), float(report.files_total or 0)
                if done <= sent:
                    continue  # MCP requires each notification's progress to increase
                sent = done
                note = f"{report.stage}: {report.files_done}/{report.files_total} files, {report.chunks_done} chunks"
                if report.current:
                    note += f" ({report.current})"
                try:
                    await ctx.report_progress(done, total or None, note)
                except Exception:
                    log.debug("progress notification failed", exc_info=True)

    error: Exception | None = None
    result: Any = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(forward)
        try:
            result = await anyio.to_thread.run_sync(partial(fn, *args, progress=progress, **kwargs),
                                                    limiter=ctx.lifespan_context.get("limiter"))
        except Exception as exc:
            error = exc
        finally:
            send.close()
    if error is not None:
        raise to_tool_failure(error, tool) from error
    return result.model_dump(mode="json")


def _require(value: Any, name: str, action: str) -> Any:
    if value is None or value == "" or value == []:
        raise ToolFailure(invalid_params(f"{name} is required for action {action!r}", f"Call again with {name} set."))
    return value


def _warm_up(container: Container) -> None:
    """Load the embedding model in the background so the first query does not pay for it."""
    try:
        container.embedder  # noqa: B018 - loading is the point
        log.info("embedding model %s loaded", container.settings.embedding_model)
    except Exception as exc:  # the tool that needs it will report the error properly
        log.warning("warm-up failed: %s", exc)


def create_server(settings: Settings | None = None, config_file: Path | str | None = None,
                  **overrides: Any) -> FastMCP:
    """A FastMCP server whose lifespan builds one Container: from `settings`, or from every settings layer
    (read when the server starts, so each start sees the current environment)."""

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        if settings is not None:
            container = Container(settings)
        else:
            container = build_container(config_file, **overrides)
        log.info("research-agent %s MCP server: store %s", __version__,
                 container.settings.chroma_host or container.settings.store)
        warmup = None
        if container.settings.warmup:
            # Delayed so the torch import does not compete with the client's initialize and tools/list.
            warmup = threading.Timer(WARMUP_DELAY, _warm_up, args=(container,))
            warmup.daemon = True
            warmup.start()
        try:
            yield {"container": container,
                   "limiter": anyio.CapacityLimiter(max(1, container.settings.max_concurrent_calls))}
        finally:
            if warmup is not None:
                warmup.cancel()
            container.close()

    server = FastMCP("research-agent", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan,
                     middleware=[ErrorMappingMiddleware()])
    _register_tools(server)
    return server


# -- tools ------------------------------------------------------------------------------------------
CollectionName = Annotated[str, Field(description="Collection name: 3-512 characters of letters, digits, '.', "
                                                  "'_' or '-', starting and ending with a letter or digit.")]


def _register_tools(mcp: FastMCP) -> None:
    @mcp.tool(annotations={"title": "Search the knowledge base", "readOnlyHint": True, "destructiveHint": False,
                           "idempotentHint": True, "openWorldHint": False})
    async def query_knowledge_base(
        query: Annotated[str, Field(description="What to look for, in natural language or keywords.")],
        ctx: Context,
        collections: Annotated[list[str] | None, Field(
            description="Collections to search. Default: the project's default collections when `project` is "
                        "given, else every collection.")] = None,
        top_k: Annotated[int, Field(description="How many chunks to return (1 to the server's max_top_k, 100 by "
                                                "default).")] = 10,
        document_context: Annotated[str | None, Field(
            description="Text of the document or code being worked on; it steers ranking toward related "
                        "chunks.")] = None,
        project: Annotated[str | None, Field(description="Search this project's linked collections.")] = None,
        mode: Annotated[Literal["hybrid", "semantic", "keyword"], Field(
            description="hybrid: embeddings and keywords fused (default); semantic: embeddings only; keyword: "
                        "exact terms only (names, error strings).")] = "hybrid",
        rerank: Annotated[bool, Field(description="Rerank with the cross-encoder when it is available.")] = True,
    ) -> dict[str, Any]:
        """Search the knowledge base and return the most relevant chunks with their source document, header
        path and a relevance score (0-1) and label. `query_refinement` says when the query is too broad or
        unclear, with suggestions; `reranked` and `warnings` say how the ranking was done."""
        from research_agent.query import query_knowledge

        return await _call(ctx, "query_knowledge_base", query_knowledge, _container(ctx), query,
                           collections=collections or None, project=project, top_k=top_k,
                           document_context=document_context, mode=mode, rerank=rerank)

    @mcp.tool(annotations={"title": "Manage collections", "readOnlyHint": False, "destructiveHint": True,
                           "idempotentHint": False, "openWorldHint": False})
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
    ) -> dict[str, Any]:
        """Create, list, inspect or delete knowledge collections. Returns the collection's info (create,
        info), {"collections": [...]} (list) or {"deleted", "kind", "chunks_removed"} (delete)."""
        from research_agent import collections as svc

        c = _container(ctx)
        if action == "list":
            return await _call(ctx, "manage_collections", svc.list_collections, c, type=collection_type,
                               project=project_name)
        name = _require(collection_name, "collection_name", action)
        if action == "create":
            return await _call(ctx, "manage_collections", svc.create_collection, c, name,
                               type=collection_type or "project-specific", description=description or "",
                               project=project_name)
        if action == "info":
            return await _call(ctx, "manage_collections", svc.get_collection_info, c, name)
        return await _call(ctx, "manage_collections", svc.delete_collection, c, name)

    @mcp.tool(annotations={"title": "Manage projects", "readOnlyHint": False, "destructiveHint": True,
                           "idempotentHint": False, "openWorldHint": False})
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
    ) -> dict[str, Any]:
        """Create, list, inspect or delete projects, and link collections to them. A project groups the
        collections an agent should search for one codebase. Returns the project's info, {"projects": [...]}
        (list) or {"deleted", "kind"} (delete). Deleting a project keeps its collections."""
        from research_agent import projects as svc

        c = _container(ctx)
        if action == "list":
            return await _call(ctx, "manage_projects", svc.list_projects, c)
        name = _require(project_name, "project_name", action)
        if action == "create":
            return await _call(ctx, "manage_projects", svc.create_project, c, name, description=description or "")
        if action == "info":
            return await _call(ctx, "manage_projects", svc.get_project_info, c, name)
        if action == "delete":
            return await _call(ctx, "manage_projects", svc.delete_project, c, name)
        names = _require(collections, "collections", action)
        fn = {"link": svc.link_collections, "unlink": svc.unlink_collections,
              "set-defaults": svc.set_default_collections}[action]
        return await _call(ctx, "manage_projects", fn, c, name, names)

    @mcp.tool(annotations={"title": "Ingest files", "readOnlyHint": False, "destructiveHint": True,
                           "idempotentHint": True, "openWorldHint": False})
    async def ingest_documents(
        path: Annotated[str, Field(description="A file or folder on the server's machine, under its allowed roots "
                                               "(RESEARCH_AGENT_ALLOWED_ROOTS; default: its working directory). "
                                               "Absolute paths are safest.")],
        collection: CollectionName,
        ctx: Context,
        recursive: Annotated[bool, Field(description="Folders: include subfolders.")] = False,
        include: Annotated[list[str] | None, Field(description="Folders: only files matching these globs, e.g. "
                                                               "['*.md', 'docs/**/*.py'].")] = None,
        exclude: Annotated[list[str] | None, Field(description="Folders: skip files or folders matching these globs "
                                                               "(.gitignore and build folders are skipped "
                                                               "anyway).")] = None,
        prune: Annotated[bool, Field(description="Folders: remove documents whose files are gone from the "
                                                 "folder.")] = False,
        title: Annotated[str | None, Field(description="A single file: its title (default: from the "
                                                       "document).")] = None,
    ) -> dict[str, Any]:
        """Add a file or a folder of files (Markdown, text, code, PDF, ...) to a collection. Unchanged files are
        skipped, changed files replace their old chunks. Reports progress; returns counts (added, updated,
        unchanged, removed), skipped and failed files with reasons, and chunks_written."""
        from research_agent.ingest import ingest_path

        c = _container(ctx)
        return await _call_with_progress(ctx, "ingest_documents", ingest_path, c, path, collection,
                                         recursive=recursive, include=tuple(include or ()),
                                         exclude=tuple(exclude or ()), prune=prune, title=title,
                                         allowed_roots=c.settings.resolved_allowed_roots())

    @mcp.tool(annotations={"title": "Save research", "readOnlyHint": False, "destructiveHint": False,
                           "idempotentHint": True, "openWorldHint": False})
    async def augment_knowledge(
        content: Annotated[str, Field(description="The research to keep, as Markdown (findings, summaries, "
                                                  "excerpts).")],
        source: Annotated[str, Field(description="Where it came from: a URL, a citation or a file path.")],
        collection: CollectionName,
        ctx: Context,
        title: Annotated[str | None, Field(description="A title (default: the first heading or line).")] = None,
    ) -> dict[str, Any]:
        """Save research text with its source into a collection so later queries find it. The same content
        from the same source is stored once (status "unchanged"). Returns the stored document's key, status and
        chunks_written."""
        from research_agent.augment import add_research

        return await _call(ctx, "augment_knowledge", add_research, _container(ctx), collection, content, source,
                           title=title)

    @mcp.tool(annotations={"title": "Manage documents", "readOnlyHint": False, "destructiveHint": True,
                           "idempotentHint": False, "openWorldHint": False})
    async def manage_documents(
        action: Annotated[Literal["list", "remove", "reindex"], Field(
            description="list: the documents in the collection; remove: one document and its chunks; reindex: "
                        "re-embed the whole collection with the configured embedding model (after a model "
                        "change; reports progress).")],
        collection: CollectionName,
        ctx: Context,
        document: Annotated[str | None, Field(
            description="remove: the document key as `list` shows it (or the file's path).")] = None,
    ) -> dict[str, Any]:
        """List, remove or re-embed the documents of a collection. Returns {"collection", "documents": [...]}
        (list), {"deleted", "kind", "chunks_removed"} (remove) or an ingest report (reindex)."""
        from research_agent import ingest as svc

        c = _container(ctx)
        if action == "list":
            return await _call(ctx, "manage_documents", svc.list_documents, c, collection)
        if action == "remove":
            return await _call(ctx, "manage_documents", svc.remove_document, c, collection,
                               _require(document, "document", action))
        return await _call_with_progress(ctx, "manage_documents", svc.reindex_collection, c, collection)

    @mcp.tool(annotations={"title": "Status", "readOnlyHint": True, "destructiveHint": False,
                           "idempotentHint": True, "openWorldHint": False})
    async def get_status(ctx: Context) -> dict[str, Any]:
        """The server's version, store (embedded path or Chroma server), embedding and reranker models and
        whether they are loaded or available, and counts of collections, chunks and projects."""
        from research_agent.status import get_status as status

        return await _call(ctx, "get_status", status, _container(ctx))


#: The server with settings read from the environment at start-up: for tests (`fastmcp.Client(mcp)`),
#: `fastmcp run mcp_server.py:mcp` and the MCP inspector.
mcp = create_server()


def run(transport: str | None = None, host: str | None = None, port: int | None = None,
        config_file: Path | str | None = None, settings_overrides: dict[str, Any] | None = None) -> None:
    """Run the server until the client disconnects (stdio) or the process is stopped (http).

    Arguments left None come from the settings (CLI flag > env > .env > config file > defaults).
    Raises ResearchAgentError (a ConfigError) when the settings are invalid.
    """
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # Log to stderr from the first moment: stdout carries JSON-RPC on stdio.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    overrides = {**(settings_overrides or {}), "transport": transport, "host": host, "port": port}
    settings = load_settings(config_file, **{k: v for k, v in overrides.items() if v is not None})
    configure_logging(settings)
    logging.getLogger("fastmcp").setLevel(settings.log_level.upper())
    server = create_server(settings)
    if settings.transport == "http":
        # Streamable HTTP at /mcp; auth (settings.auth_type) is added to the FastMCP server in a later issue.
        # log_config=None: uvicorn logs through our stderr logging instead of printing access lines on stdout.
        server.run(transport="http", host=settings.host, port=settings.port, path="/mcp", show_banner=False,
                   uvicorn_config={"log_config": None, "log_level": settings.log_level.lower()})
    else:
        server.run(transport="stdio", show_banner=False)


def main() -> None:
    try:
        run()
    except ResearchAgentError as exc:
        import json

        sys.stderr.write(json.dumps({"error": exc.to_dict()}) + "\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
