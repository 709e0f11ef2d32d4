"""manage_collections export and import over MCP, through a real in-memory fastmcp Client (tests/test_mcp.py's
helpers): files only under the allowed roots, never over an existing file, coded errors on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from fastmcp import Client

import mcp_server
from test_mcp import call, call_error

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_warmup(no_warmup):
    """No background model warm-up (conftest.no_warmup)."""


async def test_export_and_import_actions_round_trip_under_the_allowed_roots(fake_embedder, tmp_path):
    target = Path.cwd() / "backup.jsonl"  # the working directory is the default allowed root
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="team")
        await call(client, "augment_knowledge", collection="team", content="# Queues\n\nJobs retry twice.",
                   source="https://example.org/queues", title="Queues")
        await call(client, "manage_documents", action="add-note", collection="team", title="On call",
                   content="The pager rotates on Mondays.")
        exported = await call(client, "manage_collections", action="export", collection_name="team",
                              path=str(target))
        assert (exported["documents"], exported["path"]) == (2, str(target))
        assert exported["bytes"] == target.stat().st_size and exported["chunks"] >= 2

        again = await call_error(client, "manage_collections", action="export", collection_name="team",
                                 path=str(target))
        assert again.code == -32003 and "exists" in again.message  # never over a file
        outside = tmp_path / "elsewhere.jsonl"  # tmp_path holds the working directory; this is beside it
        for action, args in (("export", {"collection_name": "team"}), ("import", {})):
            refused = await call_error(client, "manage_collections", action=action, path=str(outside), **args)
            assert refused.code == -32003 and "allowed roots" in refused.message
        assert not outside.exists()
        missing = await call_error(client, "manage_collections", action="import")
        assert missing.code == -32602 and "path" in missing.message

        imported = await call(client, "manage_collections", action="import", path=str(target),
                              collection_name="team-copy")
        assert (imported["created"], imported["added"], imported["chunks"]) == (True, 2, exported["chunks"])
        rerun = await call(client, "manage_collections", action="import", path=str(target),
                           collection_name="team-copy", on_conflict="error")
        assert rerun["unchanged"] == 2 and rerun["chunks"] == 0
        info = await call(client, "manage_collections", action="info", collection_name="team-copy")
        assert info["document_count"] == 2
        tool = next(t for t in await client.list_tools() if t.name == "manage_collections")
        for data in (exported, imported, rerun):  # the declared output schema covers both answers
            jsonschema.Draft202012Validator(tool.output_schema).validate(data)

        lines = target.read_text(encoding="utf-8").splitlines()
        (Path.cwd() / "cut.jsonl").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
        cut = await call_error(client, "manage_collections", action="import", path=str(Path.cwd() / "cut.jsonl"),
                               collection_name="team-cut")
        assert cut.code == -32003 and cut.data["line"] == len(lines) and "end record" in cut.message
        assert json.loads(lines[0])["format"] == "research-agent-export"


async def test_the_actions_are_writes_and_the_tool_says_so():
    async with Client(mcp_server.mcp) as client:
        tool = next(t for t in await client.list_tools() if t.name == "manage_collections")
    assert "Writes: create, export, import." in tool.description
    assert tool.annotations.read_only_hint is False and tool.annotations.destructive_hint is True
    assert set(tool.inputSchema["properties"]["action"]["enum"]) >= {"export", "import"}
