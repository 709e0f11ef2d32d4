"""list_knowledge_bases over MCP is a thin call of the library's paging (discovery/service.py, issue 15): the
tool passes limit and cursor through and answers what the library answers, through the in-memory client and the
real packaged model (ingest embeds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

import mcp_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.slow  # ~20 s: the ingest loads the real model
async def test_the_tool_pages_like_the_library(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    folder = Path.cwd() / "kb"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.md").write_text(f"# File {i}\n- id: file-{i}\n- type: task\n<!-- content -->\nText {i}.\n")
    async with Client(mcp_server.create_server()) as c:
        await c.call_tool("manage_collections", {"action": "create", "collection_name": "paged"})
        await c.call_tool("ingest_documents", {"path": str(folder), "collection": "paged"})
        seen, cursor = [], None
        for _ in range(5):
            args = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = (await c.call_tool("list_knowledge_bases", args)).structured_content
            assert len(page["knowledge_bases"]) <= 2 and (page["total_files"], page["total_nodes"]) == (3, 3)
            seen += [b["id"] for b in page["knowledge_bases"]]
            if (cursor := page["next_cursor"]) is None:
                break
        assert seen == ["file-0", "file-1", "file-2"]
        whole = (await c.call_tool("list_knowledge_bases", {})).structured_content
        assert [b["id"] for b in whole["knowledge_bases"]] == seen and whole["next_cursor"] is None
        with pytest.raises(MCPError) as err:
            await c.call_tool("list_knowledge_bases", {"cursor": "not-a-cursor"})
        assert err.value.code == -32004  # QueryError, not a traceback
