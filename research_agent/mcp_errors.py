"""The one place that turns research-agent errors into JSON-RPC error responses (DESIGN.md section 4).

FastMCP turns every exception raised in a tool (MCPError included) into an `isError` result; only a
middleware that re-raises `MCPError(code, message, data)` from `on_call_tool` puts a real JSON-RPC
`error` object on the wire, which is what lets agents branch on the code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp.shared.exceptions import MCPError

from research_agent.errors import ResearchAgentError, as_research_agent_error

log = logging.getLogger("research_agent.mcp")

INVALID_PARAMS = -32602


class ToolFailure(ToolError):
    """A tool's error, already logged by us: FastMCP logs a FastMCPError at its `log_level` without a
    traceback, so a user error ("no such collection") does not print a stack trace to stderr."""

    def __init__(self, error: ResearchAgentError | MCPError) -> None:
        super().__init__(error.message, log_level=logging.DEBUG)
        self.error = error


def invalid_params(message: str, guidance: str) -> MCPError:
    """A tool argument missing or wrong for the chosen action: the JSON-RPC 'Invalid params' code."""
    return MCPError(INVALID_PARAMS, message, {"type": "InvalidParams", "guidance": guidance, "retryable": False})


def to_tool_failure(exc: Exception, tool: str) -> ToolFailure:
    """Wrap what a tool body raised; unexpected exceptions are logged with their traceback here."""
    if isinstance(exc, (ResearchAgentError, MCPError)):
        return ToolFailure(exc)
    log.error("Unexpected failure in tool %s", tool, exc_info=exc)
    return ToolFailure(as_research_agent_error(exc))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "error", None) if isinstance(current, ToolFailure) else current.__cause__


def to_mcp_error(exc: Exception, tool: str = "?") -> MCPError | None:
    """The JSON-RPC error for `exc`, or None for the SDK's own errors (unknown tool, invalid arguments)."""
    chain = list(_causes(exc))
    for item in chain:
        if isinstance(item, MCPError):
            return item
        if isinstance(item, ResearchAgentError):
            return MCPError(item.code, item.message, item.data)
    if isinstance(exc, (ValidationError, NotFoundError)):
        return None
    root = chain[-1]
    log.error("Unexpected failure in tool %s", tool, exc_info=root)
    err = as_research_agent_error(root)
    return MCPError(err.code, err.message, err.data)


class ErrorMappingMiddleware(Middleware):
    """Re-raise tool failures as `MCPError(code, message, data)` so clients get a JSON-RPC error."""

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        try:
            return await call_next(context)
        except MCPError:
            raise
        except Exception as exc:
            error = to_mcp_error(exc, getattr(context.message, "name", "?"))
            if error is None:
                raise
            raise error from None


__all__ = ["ErrorMappingMiddleware", "ToolFailure", "invalid_params", "to_mcp_error", "to_tool_failure"]
