"""`create_server`: the composition root of the MCP face. Its lifespan builds one Container per server run
(research_agent/mcp/lifespan.py); the tool groups, resources and prompts register themselves on the server it
is given (`register(mcp)`, no global server), in the order tools/list shows them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from fastmcp import FastMCP

from research_agent import __version__
from research_agent.config import Settings
from research_agent.container import Container, build_container
from research_agent.mcp import early, local_socket, prompts, resources
from research_agent.mcp.errors import ErrorMappingMiddleware
from research_agent.mcp.lifespan import (
    HEALTH_CHECK_WAIT,
    HEALTH_STORE_WAIT,
    LifecycleMiddleware,
    ServerState,
    store_health,
)
from research_agent.mcp.tools import collections, discovery, documents, operations, projects, search

log = logging.getLogger("research_agent.mcp")

#: The tool groups in tools/list order (part of the frozen contract: tests/fixtures/contract/tools.json).
TOOL_GROUPS = (search, collections, projects, documents, operations, discovery)


def create_server(settings: Settings | None = None, config_file: Path | str | None = None,
                  **overrides: Any) -> FastMCP:
    """A FastMCP server whose lifespan builds one Container: from `settings`, or from every settings layer
    (read when the server starts, so each start sees the current environment)."""
    holder: dict[str, Any] = {}
    if settings is not None:
        holder["store_kind"] = "server" if settings.server_mode else "embedded"

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        container = Container(settings) if settings is not None else build_container(config_file, **overrides)
        log.info("research-agent %s MCP server: store %s", __version__,
                 container.settings.chroma_host or container.settings.store)
        state = ServerState(container)
        holder["store_kind"] = state.container.store.kind
        holder["state"] = state
        listener = local_socket.start(state)  # `research-agent query` answered here (issues 12, 16)
        try:
            yield {"container": state.container, "state": state}
        finally:
            holder.pop("state", None)
            if listener is not None:
                listener.close()
            state.close()

    server = FastMCP(early.SERVER_NAME, version=__version__, instructions=early.INSTRUCTIONS,
                     lifespan=lifespan, middleware=[ErrorMappingMiddleware(), LifecycleMiddleware(holder)])
    for group in TOOL_GROUPS:
        group.register(server)
    resources.register(server)
    prompts.register(server)
    _add_health_route(server, holder)
    return server


def _add_health_route(server: FastMCP, holder: dict[str, Any]) -> None:
    """GET /health (HTTP only, public): "starting" only before the server state exists; then the store is checked
    without waiting for the models (an idle server never warmed up, so it said "starting" for ever)."""

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Any) -> Any:
        from starlette.responses import JSONResponse

        state = holder.get("state")
        if state is None:
            return JSONResponse({"status": "starting", "version": __version__,
                                 "store_kind": holder.get("store_kind"), "store_reachable": None})
        # The store stage of the warm-up, never the models; with the check, within HEALTH_STORE_WAIT in all.
        with anyio.move_on_after(HEALTH_STORE_WAIT - HEALTH_CHECK_WAIT):
            await state.warmup.until_store_ready()
        reachable, error = await _checked_store(state)
        return JSONResponse({"status": "ok" if reachable else "degraded", "version": __version__,
                             "store_kind": holder["store_kind"], "store_reachable": reachable,
                             "warmup": state.warmup.state, **({"store_error": error} if error else {})})


async def _checked_store(state: ServerState) -> tuple[bool, str | None]:
    """store_health in a worker thread with a deadline: past it the check is abandoned (it ends on its own within
    storage/store.py CONNECT_TIMEOUT) and the store reported unreachable, so /health answers within
    HEALTH_STORE_WAIT (30 s) whatever the store does."""
    with anyio.move_on_after(HEALTH_CHECK_WAIT):
        return await anyio.to_thread.run_sync(store_health, state.container, abandon_on_cancel=True)
    return False, "StoreUnavailableError"
