"""A client's mistake costs the server's stderr one line at most, never a traceback; the client gets the coded error.

MCP clients show users the server's stderr as its log. The eighth attack pass still found FastMCP printing a
traceback there for user errors the client had already got as a coded JSON-RPC error: a prompt rendered without
its required arguments (12-13 lines each), and FastMCP's rich handler wrapped each argument-validation warning
over 3-4 lines. research_agent/mcp/app.py now sends FastMCP's records through our handlers, where
errors.UserErrorsInOneLine folds a user error into one line; a genuine internal failure keeps its traceback.

A real `fastmcp.Client` over stdio to a spawned `python mcp_server.py` (its stderr in a file).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.shared.exceptions import MCPError

from research_agent.errors import CollectionError, ResearchAgentError
from research_agent.mcp.errors import ToolFailure, UserErrorsInOneLine, invalid_params, user_error
from test_mcp_stdio import SERVER, _mcp_env

# (what, name or uri, arguments, the code on the wire)
USER_ERRORS: list[tuple[str, str, dict[str, Any], int]] = [
    ("tool", "manage_collections", {"action": "info", "collection_name": "no-such"}, -32002),  # unknown collection
    ("tool", "query_knowledge_base", {"query": "q", "collections": ["no-such"]}, -32002),
    ("tool", "query_knowledge_base", {"query": "q", "collections": ["kb1"], "filters": {"$bad": 1}}, -32004),
    ("tool", "query_knowledge_base", {"query": "q", "collections": ["kb1"], "filters": {"kind": {"$regex": "x"}}},
     -32004),
    ("tool", "ingest_documents", {"path": "missing.md", "collection": "kb1"}, -32003),  # a missing file
    ("tool", "ingest_documents", {"path": "/etc/passwd", "collection": "kb1"}, -32003),
    ("tool", "manage_documents", {"action": "get", "collection": "kb1", "document": "missing.md"}, -32003),
    ("tool", "query_knowledge_base", {"query": 12}, -32602),  # argument types that fail validation
    ("tool", "query_knowledge_base", {"query": "q", "top_k": "many"}, -32602),
    ("tool", "query_knowledge_base", {}, -32602),
    ("tool", "manage_collections", {"action": "bogus"}, -32602),
    ("tool", "retrieve_knowledge", {"ids": "not-a-list"}, -32602),
    ("tool", "query_knowledge_base", {"query": "x" * 200_000, "collections": ["kb1"]}, -32004),  # oversized input
    ("tool", "augment_knowledge", {"content": "x" * 2_100_000, "source": "s", "collection": "kb1"}, -32003),
    ("tool", "no_such_tool", {}, -32602),
    ("prompt", "task_preparation", {}, -32602),  # a prompt without its required arguments
    ("prompt", "knowledge_audit", {"task": "t"}, -32602),
    ("prompt", "no_such_prompt", {}, -32602),
    ("resource", "knowledge://kb1/missing.md", {}, -32003),
    ("resource", "research://collections/no-such", {}, -32002),
    ("resource", "research://collections?cursor=garbage", {}, -32004),
]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _wire_error(client: Client, what: str, target: str, arguments: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as info:
        if what == "tool":
            await client.call_tool(target, arguments)
        elif what == "prompt":
            await client.get_prompt(target, arguments)
        else:
            await client.read_resource(target)
    return info.value


@pytest.mark.anyio
async def test_user_errors_over_stdio_log_one_line_and_no_traceback(tmp_path):
    log = tmp_path / "server-stderr.log"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"}
    transport = StdioTransport(command=sys.executable, args=[str(SERVER)], env=env, cwd=str(work), log_file=log)
    async with Client(transport) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kb1"})
        for what, target, arguments, code in USER_ERRORS:
            before = log.read_text(errors="replace")
            error = await _wire_error(client, what, target, arguments)
            assert error.error.code == code, (what, target, error.error)
            assert error.error.data["guidance"], error.error
            added = log.read_text(errors="replace")[len(before):]
            assert "Traceback" not in added, (what, target, added)
            assert added.count("\n") <= 1, (what, target, added)  # one line at most
    stderr = log.read_text(errors="replace")
    assert "Traceback" not in stderr, stderr


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.LogRecord("fastmcp.server.server", logging.ERROR, __file__, 1, "Error calling tool %r",
                                 ("t",), sys.exc_info())


@pytest.mark.parametrize(("exc", "one_line"), [
    (ToolFailure(CollectionError("Collection 'x' not found")), "-32002 CollectionError: Collection 'x' not found"),
    (invalid_params("Missing required arguments: {'task'}", "Pass it."), "-32602: Missing required arguments"),
    (ValueError("Missing required arguments: {'task'}"), "-32602: Missing required arguments: {'task'}"),
])
def test_a_user_error_record_becomes_one_warning_line(exc, one_line):
    record = _record(exc)
    assert UserErrorsInOneLine().filter(record) is True
    assert record.exc_info is None and record.levelno == logging.WARNING
    assert record.getMessage().startswith("Error calling tool 't': ") and one_line in record.getMessage()
    assert "\n" not in logging.Formatter().format(record)


@pytest.mark.parametrize("exc", [
    RuntimeError("boom"),  # a genuine internal failure
    ToolFailure(ResearchAgentError("Unexpected failure (RuntimeError); details are in the log.")),  # -32000
    MCPError(-32603, "Internal error"),
    ValueError("some other value error"),
])
def test_an_internal_failure_keeps_its_traceback(exc):
    record = _record(exc)
    assert user_error(exc) is None
    assert UserErrorsInOneLine().filter(record) is True
    assert record.exc_info is not None and record.levelno == logging.ERROR
    assert "Traceback" in logging.Formatter().format(record)


def test_a_user_error_raised_from_an_internal_one_is_still_the_users():
    """The chain is followed (ToolFailure.error, __cause__, __context__), as the error mapping does."""
    try:
        try:
            raise KeyError("x")
        except KeyError as inner:
            raise CollectionError("Collection 'x' not found") from inner
    except CollectionError as exc:
        assert user_error(exc) == "-32002 CollectionError: Collection 'x' not found"
