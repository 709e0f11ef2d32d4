"""Discovery over MCP: tools, knowledge:// resources and prompts, through the in-memory client."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

import mcp_server

KNOWLEDGE = Path(__file__).parent / "fixtures" / "knowledge"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    shutil.copytree(KNOWLEDGE, Path.cwd() / "knowledge")
    return mcp_server.create_server()


async def test_discovery_tools_resources_and_prompts(server):
    async with Client(server) as c:
        await c.call_tool("manage_collections", {"action": "create", "collection_name": "knowledge"})
        await c.call_tool("ingest_documents", {"path": str(Path.cwd() / "knowledge"), "collection": "knowledge",
                                               "recursive": True})
        r = (
            await c.call_tool(
                "discover_context",
                {"task_description": "Add cursor pagination to the orders list " "endpoint", "task_type": "implement"},
            )
        ).structured_content
        assert r["recommendations"] and r["recommendations"][0]["id"] == "guidelines.api.pagination"
        top = r["recommendations"][0]
        assert set(top) >= {"id", "path", "title", "type", "relevance_score", "reason", "estimated_tokens"}
        got = (await c.call_tool("retrieve_knowledge", {"ids": [top["id"], "no-such-node"]})).structured_content
        assert got["not_found"] == ["no-such-node"] and got["nodes"][0]["id"] == top["id"]
        assert got["total_tokens"] == top["estimated_tokens"]
        deps = (
            await c.call_tool("get_dependencies", {"node_id": "protocols.release.hotfix", "depth": 2})
        ).structured_content
        assert deps["edges"]
        kbs = (await c.call_tool("list_knowledge_bases", {"filter_type": "agent_skill"})).structured_content
        assert kbs["knowledge_bases"]
        hits = (await c.call_tool("search_knowledge", {"query": "pagination", "search_type": "keyword",
                                                       "max_results": 2})).structured_content
        assert 0 < len(hits["results"]) <= 2
        with pytest.raises(MCPError) as err:
            await c.call_tool("retrieve_knowledge", {"ids": ["nope"]})
        assert err.value.code == -32003
        with pytest.raises(MCPError) as err:
            await c.call_tool("discover_context", {"task_description": "   "})
        assert err.value.code == -32004
        with pytest.raises(MCPError) as err:
            await c.call_tool("discover_context", {"task_description": "x", "task_type": "deploy"})
        assert err.value.code == -32602
        templates = [t.uri_template for t in await c.list_resource_templates()]
        assert "knowledge://{collection}/{path*}#{node_id}" in templates
        index = json.loads((await c.read_resource("research://knowledge"))[0].text)["resources"]
        uri = next(r["uri"] for r in index if r["uri"].endswith("guidelines/api_design.md"))
        whole = (await c.read_resource(uri))[0].text
        node = (await c.read_resource(uri + "#guidelines.api.pagination"))[0].text
        assert len(node) < len(whole) and "agination" in node
        prompt = await c.get_prompt("task_preparation", {"task": "Add OAuth"})
        assert "discover_context" in prompt.messages[0].content.text
        audit = await c.get_prompt("knowledge_audit", {"task": "Add OAuth", "loaded_context": "a, b"})
        assert "a" in audit.messages[0].content.text


@pytest.mark.anyio
async def test_a_prompt_missing_a_required_argument_is_invalid_params(isolated_env):
    """prompts/get without a required argument is the client's mistake: -32602 naming it, not -32000."""
    from fastmcp import Client

    from research_agent.mcp.server import create_server

    async with Client(create_server()) as c:
        with pytest.raises(MCPError) as err:
            await c.get_prompt("knowledge_audit", {"task": "Add OAuth"})
    assert err.value.code == -32602
    assert "loaded_context" in str(err.value) and err.value.error.data["guidance"]
