"""The research-agent MCP server: one tool per row of DESIGN.md section 3, each a thin call into research_agent.

Run it with `python mcp_server.py`, `python -m mcp_server` or `research-agent serve`; all three call `run()`.
Stdout belongs to JSON-RPC: nothing here prints, logs go to stderr, and heavy libraries (torch, chromadb)
load after the handshake (a background warm-up) or on the first tool call that needs them.
See docs/mcp.md for transports, auth, resources, prompts, limits and error codes.
"""

from __future__ import annotations

import os as _os
import sys as _sys

# Take the working directory ('' or its path) off sys.path unless this file lives there. `python -m
# mcp_server` and `python -c` put it first on sys.path, and editors start servers in the open workspace: a
# cloned repository's own `research_agent/` package would be imported instead of ours. This runs before
# anything else is imported (so it cannot live in research_agent; research_agent.mcp_stdio has the same for
# `research-agent serve`). A workspace `mcp_server.py` itself still wins under `python -m`, which is why the
# shipped configs run `python /abs/path/mcp_server.py` or `research-agent serve` (docs/mcp.md).
try:
    _cwd = _os.path.realpath(_os.getcwd())
except OSError:  # the working directory was deleted: '' then finds nothing
    _cwd = _os.path.dirname(_os.path.realpath(__file__))
if _cwd != _os.path.dirname(_os.path.realpath(__file__)):
    _sys.path[:] = [_p for _p in _sys.path if _p and _os.path.realpath(_p) != _cwd]

if __name__ == "__main__":  # answer `initialize` while the imports below load (research_agent/mcp_stdio.py)
    from research_agent.mcp_stdio import start_early

    start_early()

import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastmcp import Context, FastMCP
from fastmcp.server.middleware import Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from pydantic import Field

from research_agent import __version__, mcp_stdio
from research_agent.config import Settings, load_settings
from research_agent.container import Container, build_container, configure_logging
from research_agent.errors import ResearchAgentError
from research_agent.mcp_errors import (ErrorMappingMiddleware, ToolFailure, call_timeout, invalid_params,
                                       to_tool_failure)

log = logging.getLogger("research_agent.mcp")

#: Seconds after `initialize` before the models warm up when the client never lists tools.
WARMUP_DELAY = 1.0

# Keep model libraries' progress bars and advisory warnings off every stream; they would go to stderr,
# but a quiet stderr is what MCP clients show users as the server log.
_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
_OBJECT_SCHEMA = {"type": "object", "additionalProperties": True}


class CallCancelled(Exception):
    """Raised inside a worker thread at its next progress report once the client cancelled the call."""


# -- per-run server state -------------------------------------------------------------------------
class Warmup:
    """Loads the store client, the embedding model and the reranker once, in a background thread, after the
    handshake.

    Tool calls wait for a running warm-up before they start (`wait`): the loaders in embeddings.py and
    rerank.py take a lock and cache per process, so nothing loads twice anyway, but two threads importing
    numpy-based packages at the same moment can fail with "partially initialized module" ImportErrors.
    """

    def __init__(self, container: Container, enabled: bool) -> None:
        self.container = container
        self.enabled = enabled
        self.state = "pending" if enabled else "off"  # pending | running | done | failed | off
        self.error: str | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.thread: threading.Thread | None = None
        self._done = threading.Event()
        if not enabled:
            self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        """Block until the warm-up has finished; start it now if its timer has not fired yet."""
        if not self._done.is_set():
            self.start()
            self._done.wait()

    def schedule(self, delay: float) -> None:
        with self._lock:
            if self.enabled and self.thread is None and self._timer is None:
                self._timer = threading.Timer(delay, self.start)
                self._timer.daemon = True
                self._timer.start()

    def start(self) -> None:
        with self._lock:
            if not self.enabled or self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name="model-warmup", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        self.state = "running"
        try:
            self.container.store.client  # noqa: B018 - chromadb and numpy imports first
            self.container.embedder  # noqa: B018 - loading is the point
            if self.container.settings.rerank:
                self.container.reranker.load()  # an unavailable reranker is reported by status and queries
            self.state = "done"
            log.info("warm-up done: embedding model %s", self.container.settings.embedding_model)
        except Exception as exc:  # the tool that needs the model reports the error properly
            self.state, self.error = "failed", str(exc)
            log.warning("warm-up failed: %s", exc)
        finally:
            self._done.set()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class ServerState:
    """Built by the lifespan, once per server run: container, limits, warm-up, running jobs, history writer."""

    def __init__(self, container: Container) -> None:
        s = container.settings
        self.container = container
        self.limiter = anyio.CapacityLimiter(max(1, int(s.max_concurrent_calls)))
        self.call_timeout = float(s.call_timeout)
        self.warmup = Warmup(container, bool(s.warmup))
        self.jobs: dict[str, dict[str, Any]] = {}
        self._history = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-history")
        self._last_history: Future[Any] | None = None

    def record_query(self, result: dict[str, Any]) -> None:
        """Append to the query history off the response path (it takes the store's write lock)."""
        from research_agent.history import record_query

        def write() -> None:
            try:
                with self.container.store.session():
                    record_query(self.container, result.get("query", ""), result.get("collections"),
                                 len(result.get("results", [])), mode=result.get("mode"))
            except Exception as exc:
                log.debug("query history not recorded: %s", exc)

        self._last_history = self._history.submit(write)

    def flush_history(self, timeout: float = 30.0) -> None:
        if self._last_history is not None:
            try:
                self._last_history.result(timeout=timeout)
            except Exception:
                pass

    def close(self) -> None:
        self.warmup.cancel()
        self._history.shutdown(wait=True)
        self.container.close()


def _state(ctx: Context) -> ServerState:
    return ctx.lifespan_context["state"]


def _container(ctx: Context) -> Container:
    return _state(ctx).container


def _dump(result: Any) -> dict[str, Any]:
    return result.model_dump(mode="json") if hasattr(result, "model_dump") else result


def _in_session(state: "ServerState", fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Worker-thread side of a tool call: the store may be shared by other calls, never reopened under them."""
    with state.container.store.session():
        return fn(*args, **kwargs)


async def _run(ctx: Context, tool: str, fn: Callable[..., Any], *args: Any, timed: bool = False,
               job: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run a synchronous service call in a worker thread under the server's limits and return its dict.

    timed: reads are bounded by call_timeout (the abandoned thread finishes in the background, writing
    nothing); writes are not, since cutting one off midway is worse than waiting for it.
    job: a long write (ingest, reindex): listed by get_status while it runs, reports MCP progress, and stops
    at its next file when the client cancels the request.
    """
    state = _state(ctx)
    if not state.warmup.finished:  # not counted toward the time limit: it happens once per process
        await anyio.to_thread.run_sync(state.warmup.wait)
    limit = state.call_timeout if timed and state.call_timeout > 0 else math.inf
    try:
        with anyio.move_on_after(limit) as scope:
            async with state.limiter:  # waiting for a free slot counts toward the time limit
                if job is None:
                    result = await anyio.to_thread.run_sync(partial(_in_session, state, fn, *args, **kwargs),
                                                          abandon_on_cancel=timed)
                else:
                    result = await _run_job(ctx, state, tool, job, fn, *args, **kwargs)
        if scope.cancelled_caught:
            raise ToolFailure(call_timeout(tool, limit))
    except (ToolFailure, anyio.get_cancelled_exc_class()):
        raise
    except Exception as exc:
        raise to_tool_failure(exc, tool) from exc
    return _dump(result)


async def _run_job(ctx: Context, state: ServerState, tool: str, job: dict[str, Any], fn: Callable[..., Any],
                   *args: Any, **kwargs: Any) -> Any:
    """`fn(..., progress=...)` in a worker thread; its reports become MCP progress notifications.

    The worker only drops reports into a stream; a task on the event loop sends them, coalescing bursts to the
    latest report, so a slow client never slows ingestion down. When the request is cancelled that task sets
    `cancelled`, and the worker raises CallCancelled at its next report: the batch being written finishes
    (each is atomic), nothing after it is written.
    """
    cancelled = threading.Event()
    send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=math.inf)
    job_id = uuid.uuid4().hex[:12]
    state.jobs[job_id] = {"id": job_id, "tool": tool, **job, "started_at": time.time(), "progress": None}

    def progress(report: Any) -> None:
        if cancelled.is_set():
            raise CallCancelled(f"{tool} cancelled by the client")
        state.jobs[job_id]["progress"] = _dump(report)
        try:
            anyio.from_thread.run_sync(send.send_nowait, report)
        except Exception:  # stream closed or loop gone: progress is best effort
            pass

    async def forward() -> None:
        sent = -1.0
        try:
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
                    note = (f"{report.stage}: {report.files_done}/{report.files_total} files, "
                            f"{report.chunks_done} chunks")
                    if report.current:
                        note += f" ({report.current})"
                    try:
                        await ctx.report_progress(done, total or None, note)
                    except Exception:
                        log.debug("progress notification failed", exc_info=True)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    error: Exception | None = None
    result: Any = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(forward)
            try:
                # Not abandoned on cancel: the request ends only when the worker has stopped writing.
                result = await anyio.to_thread.run_sync(partial(_in_session, state, fn, *args, progress=progress, **kwargs))
            except Exception as exc:
                error = exc
            finally:
                send.close()
    finally:
        state.jobs.pop(job_id, None)
    if error is not None:
        raise error
    return result


def _require(value: Any, name: str, action: str) -> Any:
    if value is None or value == "" or value == []:
        raise ToolFailure(invalid_params(f"{name} is required for action {action!r}", f"Call again with {name} set.",
                                         argument=name))
    return value


# -- Markdown renderings for clients that only show text ---------------------------------------------
def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    elif isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False)
    return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")[:120]


def _table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "_none_"
    columns = columns or [k for k, v in rows[0].items() if not isinstance(v, (dict, list)) or k in ("projects",)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _bullets(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"- **{key}**:\n\n" + _table(value) + "\n")
        elif isinstance(value, (list, dict)) and not value:
            lines.append(f"- **{key}**: none")
        else:
            lines.append(f"- **{key}**: {_cell(value)}")
    return "\n".join(lines)


def render_query(data: dict[str, Any]) -> str:
    hits = data.get("results", [])
    out = [f"## {len(hits)} result{'s' * (len(hits) != 1)} for “{data.get('query', '')}”"
           f" ({data.get('mode')}{', reranked' if data.get('reranked') else ''}; "
           f"collections: {', '.join(data.get('collections', [])) or 'none'})"]
    out += [f"> ⚠ {w}" for w in data.get("warnings", [])]
    for i, hit in enumerate(hits, start=1):
        where = " › ".join(p for p in (hit.get("source_document"), hit.get("header_path")) if p)
        out.append(f"### {i}. {where}\nrelevance {hit.get('relevance_score', 0):.2f} "
                   f"({hit.get('relevance_label')})\n\n{hit.get('content', '').strip()}")
    refinement = data.get("query_refinement") or {}
    if refinement.get("status") not in (None, "optimal"):
        out.append(f"**Query refinement ({refinement['status']})**: {refinement.get('message', '')}")
        out += [f"- {s}" for s in refinement.get("suggestions", [])]
    return "\n\n".join(out)


def render(tool: str, data: dict[str, Any]) -> str:
    """A Markdown view of a tool's structured result."""
    if tool == "query_knowledge_base":
        return render_query(data)
    for key, title in (("collections", "Collections"), ("projects", "Projects"), ("documents", "Documents")):
        value = data.get(key)
        if isinstance(value, list) and (not value or isinstance(value[0], dict)):
            rest = {k: v for k, v in data.items() if k != key}
            return f"## {title} ({len(value)})\n\n{_table(value)}" + (f"\n\n{_bullets(rest)}" if rest else "")
    heading = {"get_status": "research-agent status", "ingest_documents": "Ingest report",
               "augment_knowledge": "Saved research"}.get(tool, tool.replace("_", " ").capitalize())
    return f"## {heading}\n\n{_bullets(data)}"


def _result(tool: str, data: dict[str, Any]) -> ToolResult:
    return ToolResult(content=render(tool, data), structured_content=data)


# -- resources helpers ----------------------------------------------------------------------------------
def _store_health(c: Container) -> tuple[bool, str | None]:
    try:
        with c.store.session():
            c.store.client.heartbeat()
        return True, None
    except Exception as exc:
        from research_agent.errors import as_research_agent_error

        return False, as_research_agent_error(exc).type_name


class _LifecycleMiddleware(Middleware):
    """Starts the model warm-up once the handshake is done, so torch never competes with it."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder

    async def on_initialize(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        result = await call_next(context)
        if self.holder.get("state") is not None:
            self.holder["state"].warmup.schedule(WARMUP_DELAY)
        return result

    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        result = await call_next(context)
        if self.holder.get("state") is not None:
            self.holder["state"].warmup.start()
        return result


# -- the server -------------------------------------------------------------------------------------------
def create_server(settings: Settings | None = None, config_file: Path | str | None = None,
                  **overrides: Any) -> FastMCP:
    """A FastMCP server whose lifespan builds one Container: from `settings`, or from every settings layer
    (read when the server starts, so each start sees the current environment)."""
    holder: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        container = Container(settings) if settings is not None else build_container(config_file, **overrides)
        log.info("research-agent %s MCP server: store %s", __version__,
                 container.settings.chroma_host or container.settings.store)
        state = ServerState(container)
        holder["state"] = state
        try:
            yield {"container": container, "state": state}
        finally:
            holder.pop("state", None)
            state.close()

    server = FastMCP(mcp_stdio.SERVER_NAME, version=__version__, instructions=mcp_stdio.INSTRUCTIONS,
                     lifespan=lifespan, middleware=[ErrorMappingMiddleware(), _LifecycleMiddleware(holder)])
    _register_tools(server)
    _register_discovery(server)
    _register_resources(server)
    _register_prompts(server)

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Any) -> Any:
        from starlette.responses import JSONResponse

        state = holder.get("state")
        if state is None or not state.warmup.finished:  # answer at once; the store is checked after warm-up
            return JSONResponse({"status": "starting", "version": __version__, "store_reachable": None})
        reachable, error = await anyio.to_thread.run_sync(_store_health, state.container)
        return JSONResponse({"status": "ok" if reachable else "degraded", "version": __version__,
                             "store_kind": state.container.store.kind, "store_reachable": reachable,
                             **({"store_error": error} if error else {})})

    return server


Filters = Annotated[dict[str, Any] | None, Field(
    description="Only chunks matching every field: {\"content_type\": \"code_block\"}, {\"kind\": [\"note\", "
                "\"research\"]} (a list means any of). Fields: content_type, kind, node_type, status, tags, keywords, "
                "code_language, document, collection.")]
MaxTokens = Annotated[int | None, Field(description="Token budget: stop adding results once their content reaches "
                                                    "this many tokens (at least one result is returned).", ge=1)]
Snippets = Annotated[bool, Field(description="Return the most query-relevant excerpt of each chunk instead of the "
                                             "whole chunk.")]


CollectionName = Annotated[str, Field(description="Collection name: 3-512 characters of letters, digits, '.', "
                                                  "'_' or '-', starting and ending with a letter or digit.")]


def _tool(mcp: FastMCP, description: str, *, title: str, read_only: bool, destructive: bool,
          idempotent: bool) -> Callable[[Any], Any]:
    # Descriptions are passed here instead of docstrings: FastMCP parses docstrings with griffe, whose
    # import alone adds ~0.2 s to the handshake.
    return mcp.tool(description=description, output_schema=_OBJECT_SCHEMA, annotations={
        "title": title, "readOnlyHint": read_only, "destructiveHint": destructive, "idempotentHint": idempotent,
        "openWorldHint": False})


def _register_tools(mcp: FastMCP) -> None:
    @_tool(mcp, "Search the knowledge base and return the most relevant chunks with their source document, header "
                "path and a relevance score (0-1) and label. `query_refinement` says when the query is too broad or "
                "unclear, with suggestions; `reranked` and `warnings` say how the ranking was done. Read-only; "
                "bounded by the server's call timeout.",
           title="Search the knowledge base", read_only=True, destructive=False, idempotent=True)
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
        from research_agent.query import query_knowledge

        data = await _run(ctx, "query_knowledge_base", query_knowledge, _container(ctx), query,
                          collections=collections or None, project=project, top_k=top_k,
                          document_context=document_context, mode=mode, rerank=rerank, filters=filters,
                          max_tokens=max_tokens, snippets=snippets, timed=True)
        _state(ctx).record_query(data)
        return _result("query_knowledge_base", data)

    @_tool(mcp, "Create, list, inspect or delete knowledge collections. Returns the collection's info (create, "
                "info), {\"collections\": [...]} (list) or {\"deleted\", \"kind\", \"chunks_removed\"} (delete). "
                "delete removes the collection and all its documents and cannot be undone.",
           title="Manage collections", read_only=False, destructive=True, idempotent=False)
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
        from research_agent import collections as svc

        c, tool = _container(ctx), "manage_collections"
        if action == "list":
            data = await _run(ctx, tool, svc.list_collections, c, type=collection_type, project=project_name,
                              timed=True)
            return _result(tool, data)
        name = _require(collection_name, "collection_name", action)
        if action == "create":
            data = await _run(ctx, tool, svc.create_collection, c, name, type=collection_type or "project-specific",
                              description=description or "", project=project_name)
        elif action == "info":
            data = await _run(ctx, tool, svc.get_collection_info, c, name, timed=True)
        else:
            data = await _run(ctx, tool, svc.delete_collection, c, name)
        return _result(tool, data)

    @_tool(mcp, "Create, list, inspect or delete projects, and link collections to them. A project groups the "
                "collections an agent should search for one codebase. Returns the project's info, "
                "{\"projects\": [...]} (list) or {\"deleted\", \"kind\"} (delete). Deleting a project keeps its "
                "collections.",
           title="Manage projects", read_only=False, destructive=True, idempotent=False)
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
        from research_agent import projects as svc

        c, tool = _container(ctx), "manage_projects"
        if action == "list":
            return _result(tool, await _run(ctx, tool, svc.list_projects, c, timed=True))
        name = _require(project_name, "project_name", action)
        if action == "create":
            data = await _run(ctx, tool, svc.create_project, c, name, description=description or "")
        elif action == "info":
            data = await _run(ctx, tool, svc.get_project_info, c, name, timed=True)
        elif action == "delete":
            data = await _run(ctx, tool, svc.delete_project, c, name)
        else:
            names = _require(collections, "collections", action)
            fn = {"link": svc.link_collections, "unlink": svc.unlink_collections,
                  "set-defaults": svc.set_default_collections}[action]
            data = await _run(ctx, tool, fn, c, name, names)
        return _result(tool, data)

    @_tool(mcp, "Add a file or a folder of files (Markdown, text, code, PDF, ...) to a collection. Unchanged files "
                "are skipped, changed files replace their old chunks. Reports progress; exempt from the call "
                "timeout; a cancelled call stops before the next file. Returns counts (added, updated, unchanged, "
                "removed), skipped and failed files with reasons, and chunks_written.",
           title="Ingest files", read_only=False, destructive=True, idempotent=True)
    async def ingest_documents(
        path: Annotated[str, Field(description="A file or folder on the server's machine, under its allowed roots "
                                               "(RESEARCH_AGENT_ALLOWED_ROOTS; default: its working directory). "
                                               "Absolute paths are safest.")],
        collection: CollectionName,
        ctx: Context,
        recursive: Annotated[bool, Field(description="Folders: include subfolders (default true, as the CLI's "
                                                     "kb add-folder; false for the top level only).")] = True,
        include: Annotated[list[str] | None, Field(description="Folders: only files matching these globs, e.g. "
                                                               "['*.md', 'docs/**/*.py'].")] = None,
        exclude: Annotated[list[str] | None, Field(description="Folders: skip files or folders matching these globs "
                                                               "(.gitignore and build folders are skipped "
                                                               "anyway).")] = None,
        prune: Annotated[bool, Field(description="Folders: remove documents whose files are gone from the "
                                                 "folder.")] = False,
        title: Annotated[str | None, Field(description="A single file: its title (default: from the "
                                                       "document).")] = None,
    ) -> ToolResult:
        from research_agent.ingest import ingest_path

        c = _container(ctx)
        data = await _run(ctx, "ingest_documents", ingest_path, c, path, collection, recursive=recursive,
                          include=tuple(include or ()), exclude=tuple(exclude or ()), prune=prune, title=title,
                          allowed_roots=c.settings.resolved_allowed_roots(),
                          job={"collection": collection, "path": path})
        return _result("ingest_documents", data)

    @_tool(mcp, "Save research text with its source into a collection so later queries find it. The same content "
                "from the same source is stored once (status \"unchanged\"). Returns the stored document's key, "
                "status and chunks_written.",
           title="Save research", read_only=False, destructive=False, idempotent=True)
    async def augment_knowledge(
        content: Annotated[str, Field(description="The research to keep, as Markdown (findings, summaries, "
                                                  "excerpts).")],
        source: Annotated[str, Field(description="Where it came from: a URL, a citation or a file path.")],
        collection: CollectionName,
        ctx: Context,
        title: Annotated[str | None, Field(description="A title (default: the first heading or line).")] = None,
    ) -> ToolResult:
        from research_agent.augment import add_research

        data = await _run(ctx, "augment_knowledge", add_research, _container(ctx), collection, content, source,
                          title=title)
        return _result("augment_knowledge", data)

    @_tool(mcp, "List, read, remove or re-embed the documents of a collection, add or update notes, and prune "
                "documents whose files are gone. Returns {\"collection\", \"documents\": [...]} (list), the "
                "document's text (get), {\"deleted\", \"kind\", \"chunks_removed\"} (remove), the note's key and "
                "status (add-note, update-note) or an ingest report (reindex, reports progress and is exempt from "
                "the call timeout; prune: removed_documents and not_pruned with reasons).",
           title="Manage documents", read_only=False, destructive=True, idempotent=False)
    async def manage_documents(
        action: Annotated[Literal["list", "get", "remove", "reindex", "add-note", "update-note", "prune"], Field(
            description="list: the documents in the collection; get: one document's full text; remove: one "
                        "document and its chunks; reindex: re-embed the whole collection with the configured "
                        "embedding model (after a model change; reports progress); add-note: a new note (content, "
                        "title); update-note: replace a note's content in place (document, content); prune: "
                        "remove the documents whose files are gone, e.g. after a folder was moved (under, "
                        "dry_run); never research or notes, never a file that cannot be read.")],
        collection: CollectionName,
        ctx: Context,
        document: Annotated[str | None, Field(
            description="get/remove/update-note: the document key as `list` shows it (or the file's path); "
                        "notes have keys like note:3f2a...")] = None,
        content: Annotated[str | None, Field(description="add-note/update-note: the note text (Markdown).")] = None,
        title: Annotated[str | None, Field(description="add-note: the note's title (required); update-note: a new "
                                                       "title.")] = None,
        source: Annotated[str | None, Field(description="add-note: where the note came from.")] = None,
        under: Annotated[str | None, Field(description="prune: only documents ingested from this folder (under "
                                                       "the allowed roots; it may no longer exist); confirms its "
                                                       "files are gone even if it looks like an unmounted "
                                                       "drive.")] = None,
        dry_run: Annotated[bool, Field(description="prune: report what would be removed, remove nothing.")] = False,
    ) -> ToolResult:
        from research_agent import augment
        from research_agent import ingest as svc

        c, tool = _container(ctx), "manage_documents"
        if action == "list":
            data = await _run(ctx, tool, svc.list_documents, c, collection, timed=True)
        elif action == "get":
            data = await _run(ctx, tool, svc.get_document, c, collection, _require(document, "document", action),
                              timed=True)
        elif action == "remove":
            data = await _run(ctx, tool, svc.remove_document, c, collection, _require(document, "document", action))
        elif action == "add-note":
            data = await _run(ctx, tool, augment.add_note, c, collection, _require(content, "content", action),
                              _require(title, "title", action), source=source)
        elif action == "update-note":
            data = await _run(ctx, tool, augment.update_note, c, collection, _require(document, "document", action),
                              _require(content, "content", action), title=title)
        elif action == "prune":
            data = await _run(ctx, tool, svc.prune_missing, c, collection, under, dry_run=dry_run,
                              allowed_roots=c.settings.resolved_allowed_roots())
        else:
            data = await _run(ctx, tool, svc.reindex_collection, c, collection,
                              job={"collection": collection, "path": None})
        return _result(tool, data)

    @_tool(mcp, "Measure retrieval quality on your own relevance judgments (BEIR files on the server's machine, "
                "under its allowed roots): nDCG@k, Recall@k, MRR@k and latency for each mode (semantic, keyword, "
                "hybrid, hybrid+rerank; a mode that cannot run, e.g. no reranker, is reported unavailable). Runs one "
                "query per judged query and mode: exempt from the call timeout.",
           title="Evaluate retrieval", read_only=True, destructive=False, idempotent=True)
    async def evaluate_retrieval(
        collection: CollectionName,
        queries_file: Annotated[str, Field(description="BEIR queries.jsonl (_id, text).")],
        qrels_file: Annotated[str, Field(description="BEIR qrels TSV: query-id, corpus-id, score (header line).")],
        ctx: Context,
        k: Annotated[int, Field(description="The cut-off for every metric.", ge=1)] = 10,
        limit: Annotated[int | None, Field(description="Evaluate only the first N judged queries.", ge=1)] = None,
    ) -> ToolResult:
        from research_agent.evaluation import evaluate
        from research_agent.ingest import check_allowed

        c = _container(ctx)

        def run_eval() -> Any:
            roots = c.settings.resolved_allowed_roots()
            files = [check_allowed(Path(f), roots) for f in (queries_file, qrels_file)]
            return evaluate(c, collection, *files, k=k, limit=limit)

        return _result("evaluate_retrieval", await _run(ctx, "evaluate_retrieval", run_eval))

    @_tool(mcp, "Check the store for what an interrupted write left behind (orphan chunks, incomplete documents, "
                "leftovers of an interrupted reindex); with repair=true, fix it. Returns per-collection counts, "
                "leftovers, the repairs done and `healthy`.",
           title="Check the store", read_only=False, destructive=True, idempotent=True)
    async def check_store(
        ctx: Context,
        repair: Annotated[bool, Field(description="Fix what the check finds (deletes orphan chunks).")] = False,
    ) -> ToolResult:
        from research_agent.doctor import run_doctor

        return _result("check_store", await _run(ctx, "check_store", run_doctor, _container(ctx), repair=repair))

    @_tool(mcp, "The server's version, store (embedded path or Chroma server) and whether it is reachable, "
                "embedding and reranker models (names, whether loaded or available), device, counts of "
                "collections, documents, chunks and projects, the model warm-up state and the ingestion jobs "
                "running now.",
           title="Status", read_only=True, destructive=False, idempotent=True)
    async def get_status(ctx: Context) -> ToolResult:
        from research_agent.status import get_status as status

        state = _state(ctx)
        data = await _run(ctx, "get_status", status, state.container, timed=True)
        now = time.time()
        data["running_jobs"] = [{**{k: v for k, v in job.items() if k != "started_at"},
                                 "seconds": round(now - job["started_at"], 1)} for job in list(state.jobs.values())]
        data["warmup"] = state.warmup.state
        data["limits"] = {"max_concurrent_calls": int(state.container.settings.max_concurrent_calls),
                          "call_timeout": state.call_timeout}
        return _result("get_status", data)


TaskType = Literal["implement", "debug", "refactor", "document", "review", "design", "test"]


def _register_discovery(mcp: FastMCP) -> None:

    @_tool(mcp, "Before starting a coding task, ask what knowledge you need: returns ranked recommendations of "
                "knowledge nodes ({id, path, title, type, relevance_score, reason, estimated_tokens}) and "
                "total_available. Scores: >= 0.9 must load, 0.7-0.9 should load, 0.5-0.7 consider; below 0.5 is "
                "left out, so an empty list means nothing relevant is known (see `message`). Load the ids with "
                "retrieve_knowledge. Read-only.",
           title="Discover context for a task", read_only=True, destructive=False, idempotent=True)
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

        data = await _run(ctx, "discover_context", svc, _container(ctx), task_description, task_type=task_type,
                          current_file=current_file, max_results=max_results, collections=collections or None,
                          project=project, timed=True)
        return _result("discover_context", data)

    @_tool(mcp, "Fetch the full content of knowledge nodes by id (from discover_context or list_knowledge_bases), "
                "reassembled in document order, with metadata, children when asked, and total_tokens. At most 20 "
                "ids per call. Ids that do not exist are listed in not_found; the others are still returned.",
           title="Retrieve knowledge", read_only=True, destructive=False, idempotent=True)
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

        data = await _run(ctx, "retrieve_knowledge", svc, _container(ctx), ids, include_children=include_children,
                          format=format, timed=True)
        return _result("retrieve_knowledge", data)

    @_tool(mcp, "The catalogue of knowledge files and their nodes: id, path, title, type, status, description, "
                "last_checked, node_count. Filters match a node's own or inherited type/status.",
           title="List knowledge bases", read_only=True, destructive=False, idempotent=True)
    async def list_knowledge_bases(
        ctx: Context,
        filter_type: Annotated[str | None, Field(description="Only nodes of this type (guideline, protocol, "
                                                             "context, agent_skill, plan, task, log ...).")] = None,
        filter_status: Annotated[str | None, Field(description="Only nodes with this status (active, draft, "
                                                               "deprecated ...).")] = None,
    ) -> ToolResult:
        from research_agent.discovery import list_knowledge_bases as svc

        data = await _run(ctx, "list_knowledge_bases", svc, _container(ctx), filter_type=filter_type,
                          filter_status=filter_status, timed=True)
        return _result("list_knowledge_bases", data)

    @_tool(mcp, "Full-text and semantic search across knowledge bases (the query engine of query_knowledge_base), "
                "returning chunks with scores. Use it for specific questions during a task.",
           title="Search knowledge", read_only=True, destructive=False, idempotent=True)
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

        data = await _run(ctx, "search_knowledge", svc, _container(ctx), query, search_type=search_type,
                          scope=scope or None, max_results=max_results, timed=True)
        return _result("search_knowledge", data)

    @_tool(mcp, "The nodes a node depends on (upstream: its blocked_by and parent) and that depend on it "
                "(downstream: nodes blocked by it, its children), breadth first to `depth` (capped by the server), "
                "with edges {source, target, kind}, cycles and blocked_by ids that match no node.",
           title="Get dependencies", read_only=True, destructive=False, idempotent=True)
    async def get_dependencies(
        node_id: Annotated[str, Field(description="The node to analyse.")],
        ctx: Context,
        direction: Annotated[Literal["upstream", "downstream", "both"], Field(
            description="upstream, downstream or both.")] = "both",
        depth: Annotated[int, Field(description="Levels to follow.", ge=1)] = 1,
    ) -> ToolResult:
        from research_agent.discovery import get_dependencies as svc

        data = await _run(ctx, "get_dependencies", svc, _container(ctx), node_id, direction=direction, depth=depth,
                          timed=True)
        return _result("get_dependencies", data)

    # Resources. FastMCP drops the fragment for a template without `#`, so the node template must be
    # registered BEFORE the whole-file one (checked: in the other order `...md#node` reads the whole file).
    @mcp.resource("knowledge://{collection}/{path*}#{node_id}", name="knowledge-node", mime_type="text/markdown",
                  description="One knowledge node (by node id or anchor) with its sub-sections.")
    async def knowledge_node_resource(collection: str, path: str, node_id: str, ctx: Context) -> str:
        from research_agent.discovery import read_knowledge_resource

        text, _meta = await _run(ctx, "resource knowledge", read_knowledge_resource, _container(ctx), collection,
                                 path, node_id, timed=True)
        return text

    @mcp.resource("knowledge://{collection}/{path*}", name="knowledge-file", mime_type="text/markdown",
                  description="A whole ingested knowledge file, reassembled from its chunks; `path` is the document "
                              "key (e.g. knowledge/guidelines/testing.md).")
    async def knowledge_file_resource(collection: str, path: str, ctx: Context) -> str:
        from research_agent.discovery import read_knowledge_resource

        text, _meta = await _run(ctx, "resource knowledge", read_knowledge_resource, _container(ctx), collection,
                                 path, timed=True)
        return text

    @mcp.resource("research://knowledge", name="knowledge-index", mime_type="application/json",
                  description="Every knowledge file as {uri, name, mimeType, metadata: {id, type, status, "
                              "last_checked, node_count, nodes}}; read one with its knowledge:// uri.")
    async def knowledge_index_resource(ctx: Context) -> dict[str, Any]:
        from research_agent.discovery import list_knowledge_resources

        return {"resources": await _run(ctx, "resource knowledge index", list_knowledge_resources, _container(ctx),
                                        timed=True)}

    # Prompts.
    @mcp.prompt(name="task_preparation", description="Prepare context before executing a coding task.")
    async def task_preparation(task: Annotated[str, Field(description="The task to prepare for.")]) -> str:
        from research_agent.discovery import task_preparation_prompt

        return task_preparation_prompt(task)

    @mcp.prompt(name="knowledge_audit", description="Verify sufficient context exists before proceeding.")
    async def knowledge_audit(
        task: Annotated[str, Field(description="The task.")],
        loaded_context: Annotated[str, Field(description="Knowledge node ids already loaded, comma-separated.")],
    ) -> str:
        from research_agent.discovery import knowledge_audit_prompt

        return knowledge_audit_prompt(task, [p.strip() for p in loaded_context.split(",") if p.strip()])


def _register_resources(mcp: FastMCP) -> None:
    async def read(ctx: Context, what: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        return await _run(ctx, what, fn, _container(ctx), *args, timed=True)

    @mcp.resource("research://collections", name="collections", mime_type="application/json",
                  description="Every collection with its type, description, projects and document and chunk counts.")
    async def collections_resource(ctx: Context) -> dict[str, Any]:
        from research_agent.collections import list_collections

        return await read(ctx, "resource collections", list_collections)

    @mcp.resource("research://collections/{name}", name="collection", mime_type="application/json",
                  description="One collection's info: type, description, embedding model, counts, projects.")
    async def collection_resource(name: str, ctx: Context) -> dict[str, Any]:
        from research_agent.collections import get_collection_info

        return await read(ctx, "resource collection", get_collection_info, name)

    @mcp.resource("research://collections/{name}/documents", name="collection-documents",
                  mime_type="application/json", description="The documents of one collection.")
    async def documents_resource(name: str, ctx: Context) -> dict[str, Any]:
        from research_agent.ingest import list_documents

        return await read(ctx, "resource documents", list_documents, name)

    @mcp.resource("research://collections/{name}/documents/{document*}", name="document-chunks",
                  mime_type="application/json",
                  description="A document's chunks in order (header path, content type, text); `document` is the "
                              "key that the documents list shows, e.g. notes/setup.md.")
    async def chunks_resource(name: str, document: str, ctx: Context) -> dict[str, Any]:
        from research_agent.ingest import get_document_chunks

        return await read(ctx, "resource document", get_document_chunks, name, document)

    @mcp.resource("research://history", name="query-history", mime_type="application/json",
                  description="The most recent queries (newest first, at most 50 here; the store keeps 200).")
    async def history_resource(ctx: Context) -> dict[str, Any]:
        from research_agent.history import recent_queries

        state = _state(ctx)
        await anyio.to_thread.run_sync(state.flush_history)  # this session's last query is in the list
        return {"queries": await read(ctx, "resource history", recent_queries, 50)}


def _register_prompts(mcp: FastMCP) -> None:
    @mcp.prompt(name="query_refinement", description="Turn a vague question into precise knowledge-base queries.")
    async def query_refinement(
        query: Annotated[str, Field(description="The question or search to improve.")],
        ctx: Context,
    ) -> str:
        names = ""
        try:
            from research_agent.collections import list_collections

            listed = await _run(ctx, "prompt query_refinement", list_collections, _container(ctx), timed=True)
            names = "\n".join(f"- {c['name']} ({c['type']}): {c['description'] or 'no description'}"
                              for c in listed["collections"])
        except Exception:  # the prompt still helps without the list
            pass
        return (
            f"Help me search the research-agent knowledge base for:\n\n> {query}\n\n"
            + (f"Collections available:\n{names}\n\n" if names else "")
            + "1. Name the concrete concepts, identifiers and error strings in the question; drop filler words.\n"
            "2. Write two or three focused queries: one in natural language (mode=hybrid), and one with exact "
            "names or strings (mode=keyword) if there are any.\n"
            "3. Pick the collections (or project) that fit each query.\n"
            "4. Call query_knowledge_base for each. If a response's query_refinement.status is not \"optimal\", "
            "follow its suggestions and query again.\n"
            "5. Answer from the returned chunks only, citing source_document and header_path; say what was not "
            "found."
        )

    @mcp.prompt(name="context_extraction",
                description="Extract the facts worth keeping from a document, ready to save with augment_knowledge.")
    async def context_extraction(
        document: Annotated[str, Field(description="The document's text (or a path or URL the model can read).")],
    ) -> str:
        return (
            "Extract the knowledge worth keeping from the document below, for a knowledge base that coding "
            "agents search.\n\n"
            "- Write Markdown with one `##` heading per topic, so each section stands alone when retrieved.\n"
            "- Keep facts, decisions and their reasons, APIs and signatures, configuration values, limits, error "
            "messages and their fixes; keep code blocks verbatim.\n"
            "- Drop greetings, repetition and speculation; mark anything uncertain as such.\n"
            "- End with a `Source:` line naming where it came from.\n\n"
            "Then save it with augment_knowledge(content=..., source=..., collection=...).\n\n"
            f"<document>\n{document}\n</document>"
        )


_default_server: FastMCP | None = None


def __getattr__(name: str) -> Any:
    """`mcp_server.mcp`: a server with settings read from the environment at start-up, for tests
    (`fastmcp.Client(mcp)`), `fastmcp run mcp_server.py:mcp` and the MCP inspector. Built on first use so
    `python mcp_server.py` does not register every tool twice."""
    global _default_server
    if name == "mcp":
        if _default_server is None:
            _default_server = create_server()
        return _default_server
    raise AttributeError(name)


def run(transport: str | None = None, host: str | None = None, port: int | None = None,
        config_file: Path | str | None = None, settings_overrides: dict[str, Any] | None = None) -> None:
    """Run the server until the client disconnects (stdio) or the process is stopped (http).

    Arguments left None come from the settings (docs/configuration.md); a file never chooses the transport.
    Raises ResearchAgentError (a ConfigError) when the settings are invalid or would expose the store.
    """
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # Log to stderr from the first moment: stdout carries JSON-RPC on stdio.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    overrides = {**(settings_overrides or {}), "transport": transport, "host": host, "port": port}
    settings = load_settings(config_file, **{k: v for k, v in overrides.items() if v is not None})
    configure_logging(settings)
    logging.getLogger("fastmcp").setLevel(settings.log_level.upper())
    if settings.transport == "http":
        mcp_stdio.release()  # an explicit HTTP choice after start_early() claimed stdio (a programmatic run())
        _run_http(settings)
    else:
        mcp_stdio.serve(create_server(settings))


def _run_http(settings: Settings) -> None:
    """Streamable HTTP behind, outermost first: the Host/Origin guard, authentication, the session cap, the
    stdio-style replies to malformed messages; and uvicorn with deadlines for request headers and bodies and
    bounded accept-error logs (research_agent/server_auth.py says why each)."""
    import fastmcp
    from starlette.middleware import Middleware as ASGIMiddleware

    from research_agent import server_auth as guard

    auth_type, keys = guard.check_http_settings(settings)
    if not guard.is_loopback(settings.host) and not settings.allowed_hosts:
        log.warning("only loopback Host names are accepted; set RESEARCH_AGENT_ALLOWED_HOSTS to the names clients "
                    "use to reach %s", settings.host)
    server = create_server(settings)
    # FastMCP's documented setting; `run()` offers no parameter for it. Its own Host/Origin guard stays off
    # (the default): ours checks ports too.
    fastmcp.settings.http_session_idle_timeout = settings.http_session_idle_timeout
    log.warning("research-agent MCP server on http://%s:%s/mcp (auth: %s)", settings.host, settings.port, auth_type)
    middleware = [ASGIMiddleware(guard.HostOriginGuard, hosts=guard.allowed_hosts(settings),
                                 origins=guard.allowed_origins(settings)),
                  ASGIMiddleware(guard.AuthMiddleware, auth_type=auth_type, keys=keys),
                  ASGIMiddleware(guard.SessionLimiter, max_sessions=settings.max_http_sessions),
                  ASGIMiddleware(guard.MalformedRequestReplies)]
    guard.limit_accept_error_logs()
    protocol = guard.header_timeout_protocol(settings.http_header_timeout, settings.http_body_timeout)
    # log_config=None: uvicorn logs through our stderr logging instead of printing access lines on stdout.
    server.run(transport="http", host=settings.host, port=settings.port, path="/mcp", show_banner=False,
               middleware=middleware, host_origin_protection=False,
               uvicorn_config={"log_config": None, "log_level": settings.log_level.lower(), "http": protocol})


def main() -> None:
    try:
        run()
    except ResearchAgentError as exc:
        sys.stderr.write(json.dumps({"error": exc.to_dict()}) + "\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
