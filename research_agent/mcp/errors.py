"""The one place that turns research-agent errors into JSON-RPC error responses (the table in docs/mcp.md, "Errors").

FastMCP turns every exception raised in a tool (MCPError included) into an `isError` result; only a
middleware that re-raises `MCPError(code, message, data)` from `on_call_tool` puts a real JSON-RPC
`error` object on the wire, which is what lets agents branch on the code. The SDK's own complaints
(unknown tool, arguments that do not match the schema) become -32602 "Invalid params" here too, with a
message that says what to send instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp.shared.exceptions import MCPError

from research_agent.errors import ResearchAgentError, as_research_agent_error
from research_agent.guidance import for_face, with_guidance

log = logging.getLogger("research_agent.mcp")

INVALID_PARAMS = -32602
#: A tool call ran past its time limit (RESEARCH_AGENT_CALL_TIMEOUT); trying again may work.
CALL_TIMEOUT = -32005
#: The longest string an error echoes (message, each data value): a 1 MB document name made a 1 MB error and a
#: 100 KB tool name a 200 KB one (outside test of 02b7f3e). 200 characters name anything a caller really sent.
MAX_ECHO = 200
#: The most items of a list an error carries (e.g. the tool names after an unknown tool: 14 today).
MAX_ECHO_ITEMS = 20
#: The longest error message as a whole: a message quoting several values stays within a few KB.
MAX_MESSAGE = 2000


class ToolFailure(ToolError):
    """A tool's error, already logged by us: FastMCP logs a FastMCPError at its `log_level` without a
    traceback, so a user error ("no such collection") does not print a stack trace to stderr."""

    def __init__(self, error: ResearchAgentError | MCPError) -> None:
        super().__init__(error.message, log_level=logging.DEBUG)
        self.error = error


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut to `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip_words(message: str) -> str:
    """Every run of more than MAX_ECHO non-space characters in `message` cut (what an echoed value looks like:
    a name, a path, a cursor), then the whole message to MAX_MESSAGE."""
    return clip(re.sub(r"\S{%d,}" % (MAX_ECHO + 1), lambda m: clip(m.group()), message), MAX_MESSAGE)


def _clip_value(value: Any, depth: int = 0) -> Any:
    """A data value with its strings, lists and mappings bounded (nesting beyond 4 levels is dropped)."""
    if isinstance(value, str):
        return clip(value)
    if depth >= 4:
        return clip(repr(value))
    if isinstance(value, (list, tuple)):
        return [_clip_value(v, depth + 1) for v in list(value)[:MAX_ECHO_ITEMS]]
    if isinstance(value, dict):
        return {clip(str(k)): _clip_value(v, depth + 1) for k, v in list(value.items())[:MAX_ECHO_ITEMS]}
    return value


def coded(code: int, message: str, data: dict[str, Any]) -> MCPError:
    """The JSON-RPC error an MCP client gets: its guidance in MCP words (tool calls, not `research-agent`
    commands) in data.guidance and after the message too, since some clients show only the message.

    Every echoed value is capped here, the one place all errors pass (MAX_ECHO characters per value, MAX_MESSAGE
    per message), so no error grows with its input whichever layer built it.
    """
    guidance = for_face(str(data.get("guidance") or ""), "mcp")
    return capped(MCPError(code, with_guidance(message, guidance), {**data, "guidance": guidance}))


def capped(error: MCPError) -> MCPError:
    """`error` with its message and data values bounded (guidance is ours and kept whole)."""
    data = error.error.data
    if isinstance(data, dict):
        data = {k: v if k == "guidance" else _clip_value(v) for k, v in data.items()}
    elif data is not None:
        data = _clip_value(data)
    return MCPError(error.error.code, _clip_words(error.error.message), data)


def invalid_params(message: str, guidance: str, **data: Any) -> MCPError:
    """A tool argument missing or wrong for the chosen action: the JSON-RPC 'Invalid params' code."""
    return coded(INVALID_PARAMS, message, {"type": "InvalidParams", "guidance": guidance, "retryable": False,
                                           **data})


def call_timeout(tool: str, seconds: float, warming_up: bool = False, loading_model: bool = False) -> MCPError:
    """-32005; when the time went on waiting for the server's own warm-up, or on loading the embedding model in
    the call's own thread (the warm-up off, failed or not run), the message says so instead of telling the
    caller to narrow a request that never started."""
    if loading_model and not warming_up:
        return coded(CALL_TIMEOUT, f"{tool} did not finish within {seconds:g} s: the time went on loading the "
                     "embedding model, which this call had to load itself", {
                         "type": "TimeoutError", "retryable": True, "timeout_seconds": seconds, "model_loading": True,
                         "guidance": "Retry the same call once the model is loaded; get_status shows "
                                     "embedding_loaded and the warm-up state."})
    if warming_up:
        return coded(CALL_TIMEOUT, f"{tool} did not start within {seconds:g} s: the server is still loading its "
                     "models (warm-up)", {
                         "type": "TimeoutError", "retryable": True, "timeout_seconds": seconds, "warmup": True,
                         "guidance": "Retry the same call in a few seconds; get_status shows the warm-up state."})
    return coded(CALL_TIMEOUT, f"{tool} did not finish within {seconds:g} s", {
        "type": "TimeoutError", "retryable": True, "timeout_seconds": seconds,
        "guidance": "Narrow the request (fewer collections, smaller top_k) or retry; the server's limit is "
                    "RESEARCH_AGENT_CALL_TIMEOUT."})


class CallCancelled(Exception):
    """Raised inside a worker thread at its next progress report once the client cancelled the call (or left)."""


def to_tool_failure(exc: Exception, tool: str) -> ToolFailure:
    """Wrap what a tool body raised; unexpected exceptions are logged with their traceback here. A cancelled
    call is the client's choice, not our failure: one info line (the attack pass saw a 41-line "Unexpected
    failure" traceback for each Ctrl-C or closed stdin during an ingest)."""
    if isinstance(exc, (ResearchAgentError, MCPError)):
        return ToolFailure(exc)
    if isinstance(exc, CallCancelled):
        log.info("%s", exc)
        return ToolFailure(ResearchAgentError(str(exc), guidance="Send the call again to run it: what it had "
                                              "written stays (each batch is whole), the rest is skipped."))
    log.error("Unexpected failure in tool %s", tool, exc_info=exc)
    return ToolFailure(as_research_agent_error(exc))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "error", None) if isinstance(current, ToolFailure) else current.__cause__


def argument_kind(spec: dict[str, Any]) -> str:
    """An argument's JSON schema in words: 'string', 'array of strings', 'one of hybrid, semantic, keyword'."""
    options = spec.get("anyOf") or [spec]
    enums = [v for o in options for v in o.get("enum", []) if v is not None]
    if enums:
        return "one of " + ", ".join(map(str, enums))
    types = []
    for o in options:
        t = o.get("type")
        if t == "array":
            t = f"array of {o.get('items', {}).get('type', 'values')}s"
        if t and t != "null":
            types.append(t)
    return " or ".join(types) or "value"


def describe_arguments(schema: dict[str, Any]) -> str:
    """'Required: query (string). Optional: top_k (integer), mode (one of hybrid, semantic, keyword).'"""
    props: dict[str, Any] = schema.get("properties") or {}
    required = [name for name in schema.get("required") or [] if name in props]
    kind = argument_kind
    optional = [name for name in props if name not in required]
    parts = []
    if required:
        parts.append("Required: " + ", ".join(f"{n} ({kind(props[n])})" for n in required) + ".")
    if optional:
        parts.append("Optional: " + ", ".join(f"{n} ({kind(props[n])})" for n in optional) + ".")
    return " ".join(parts) or "This tool takes no arguments."


def _doubled_alias(name: str, arguments: dict[str, Any]) -> str | None:
    """"give only one of collection, collection_name" when `name` was refused because the caller also gave
    another name of the same argument (pydantic takes one and calls the other an unexpected keyword)."""
    from research_agent.mcp.params import ALIASES

    given = [other for other in ALIASES.get(name, ()) if other in arguments]
    return f"give only one of {', '.join(sorted({name, *given}))}" if given else None


def _validation_problems(exc: BaseException, arguments: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    from pydantic import ValidationError as PydanticValidationError

    cause = exc.__cause__
    if not isinstance(cause, PydanticValidationError):
        return [{"argument": "", "problem": str(exc)}]
    problems = []
    for err in cause.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("arguments",))
        message = err.get("msg", "invalid")
        if err.get("type") == "unexpected_keyword_argument" and isinstance(arguments, dict):
            message = _doubled_alias(loc, arguments) or message
        problem: dict[str, Any] = {"argument": loc, "problem": message}
        if err.get("type") != "missing" and "input" in err:
            problem["got"] = repr(err["input"])[:80]
        problems.append(problem)
    return problems


async def _sdk_error(exc: Exception, context: MiddlewareContext[Any]) -> MCPError | None:
    """-32602 for FastMCP's unknown-tool and argument-validation errors; None for anything else."""
    name = getattr(context.message, "name", "?")
    server = getattr(context.fastmcp_context, "fastmcp", None)
    if isinstance(exc, NotFoundError):
        names: list[str] = []
        if server is not None:
            try:
                names = sorted(t.name for t in await server.list_tools())
            except Exception:  # the hint is a courtesy
                pass
        return invalid_params(f"Unknown tool {name!r}", f"Call one of: {', '.join(names)} (see tools/list).",
                              tool=name, tools=names)
    if isinstance(exc, ValidationError):
        problems = _validation_problems(exc, getattr(context.message, "arguments", None))
        summary = "; ".join(f"{p['argument'] or 'arguments'}: {p['problem']}" + (f" (got {p['got']})" if 'got' in p
                                                                                 else "") for p in problems)
        guidance = "Send arguments matching the tool's inputSchema (tools/list)."
        if server is not None:
            try:
                tool = await server.get_tool(name)
                if tool is not None:
                    guidance = f"{describe_arguments(tool.parameters)} {guidance}"
            except Exception:
                pass
        return invalid_params(f"Invalid arguments for {name}: {summary}", guidance, tool=name, problems=problems)
    return None


def to_mcp_error(exc: Exception, tool: str = "?") -> MCPError:
    """The JSON-RPC error for what a tool raised; anything unexpected becomes a sanitized -32000."""
    chain = list(_causes(exc))
    for item in chain:
        if isinstance(item, MCPError):
            return capped(item)
        if isinstance(item, ResearchAgentError):
            return coded(item.code, item.message, item.data)
    root = chain[-1]
    log.error("Unexpected failure in %s", tool, exc_info=root)
    err = as_research_agent_error(root)
    return coded(err.code, err.message, err.data)


def user_error(exc: BaseException | None) -> str | None:
    """What the client did wrong, in one line (`-32002 CollectionError: Collection 'x' not found`), when `exc` (or
    an error it wraps or was raised from) is a coded error of the caller's making: a ResearchAgentError other than
    the plain system error, a JSON-RPC error other than -32000/-32603, FastMCP's unknown-name and argument
    errors, a prompt's missing arguments, a call the client cancelled. None for anything else: a genuine internal
    failure, whose traceback is what the log is for."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 10:
        seen.add(id(exc))
        if isinstance(exc, ResearchAgentError) and exc.code != ResearchAgentError.code:
            return f"{exc.code} {exc.type_name}: {exc.message}"
        if isinstance(exc, MCPError) and exc.error.code not in (ResearchAgentError.code, -32603):
            return f"{exc.error.code}: {exc.error.message}"
        if isinstance(exc, (NotFoundError, ValidationError, CallCancelled)):
            return f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ValueError) and str(exc).startswith("Missing required arguments"):
            return f"{INVALID_PARAMS}: {exc}"  # a prompt rendered without its arguments (`_missing_prompt_arguments`)
        exc = exc.error if isinstance(exc, ToolFailure) else exc.__cause__ or exc.__context__
    return None


class UserErrorsInOneLine(logging.Filter):
    """A log record about a user error (`user_error`) becomes one line at WARNING at most, without the traceback
    FastMCP attaches ("Error rendering prompt", "Error reading resource", "Error calling tool": 12-30 lines on
    the server's stderr, which MCP clients show users as the server log, for a client's mistake that the client
    already got as a coded error). Internal failures keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        problem = user_error(record.exc_info[1]) if record.exc_info else None
        if problem is not None:
            record.msg = clip(f"{record.getMessage()}: {' '.join(problem.split())}", 400)
            record.args = None
            record.exc_info = record.exc_text = record.stack_info = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def _missing_prompt_arguments(exc: BaseException) -> str | None:
    """FastMCP reports a prompt rendered without its required arguments as a ValueError ("Missing required
    arguments: ...") wrapped in its PromptError: the client's mistake (-32602), not ours (-32000)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ValueError) and str(seen).startswith("Missing required arguments"):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


class ErrorMappingMiddleware(Middleware):
    """Re-raise failures of tools, resources and prompts as `MCPError(code, message, data)`."""

    async def _map(self, context: MiddlewareContext[Any], call_next: Any, what: str) -> Any:
        try:
            return await call_next(context)
        except MCPError as exc:
            raise capped(exc) from None
        except Exception as exc:
            sdk = await _sdk_error(exc, context) if what == "tool" else None
            if sdk is not None:
                raise sdk from None
            missing = _missing_prompt_arguments(exc) if what == "prompt" else None
            if missing:
                raise invalid_params(f"{missing} (prompt {getattr(context.message, 'name', '?')!r})",
                                     "Pass every required argument; prompts/list shows them.") from None
            if what != "tool" and isinstance(exc, NotFoundError):
                target = getattr(context.message, "uri", None) or getattr(context.message, "name", "?")
                raise invalid_params(f"Unknown {what} {str(target)!r}",
                                     f"See {what}s/list (and resources/templates/list) for what exists.") from None
            label = getattr(context.message, "name", None) or getattr(context.message, "uri", "?")
            raise to_mcp_error(exc, f"{what} {label}") from None

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        return await self._map(context, call_next, "tool")

    async def on_read_resource(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        return await self._map(context, call_next, "resource")

    async def on_get_prompt(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        return await self._map(context, call_next, "prompt")


__all__ = ["CALL_TIMEOUT", "INVALID_PARAMS", "CallCancelled", "ErrorMappingMiddleware", "ToolFailure",
           "UserErrorsInOneLine", "argument_kind", "call_timeout", "capped", "clip", "coded", "describe_arguments",
           "invalid_params", "to_mcp_error", "to_tool_failure", "user_error"]
