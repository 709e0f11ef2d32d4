"""The MCP server through an in-memory `fastmcp.Client`: tool surface, happy paths, error codes on the client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from mcp.shared.exceptions import MCPError

import mcp_server

pytestmark = pytest.mark.anyio

TOOLS = {"query_knowledge_base", "manage_collections", "manage_projects", "ingest_documents",
         "augment_knowledge", "manage_documents", "get_status"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _mcp_no_warmup(monkeypatch):
    # Warm-up loads the real embedding model in a background thread; tests choose their model explicitly.
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")


@pytest.fixture
def _mcp_docs(tmp_path) -> Path:
    """Two small Markdown files in the working directory (the server's default allowed root)."""
    folder = Path.cwd() / "notes"
    folder.mkdir()
    (folder / "retries.md").write_text(
        "# Retries\n\nThe HTTP client retries failed requests three times with exponential backoff.\n\n"
        "## Timeouts\n\nEach request times out after thirty seconds.\n", encoding="utf-8")
    (folder / "cache.md").write_text(
        "# Caching\n\nResponses are cached in Redis for five minutes, keyed by URL.\n", encoding="utf-8")
    return folder


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def call_error(client: Client, tool: str, **arguments: Any) -> MCPError:
    """The JSON-RPC error the call fails with (a real error response, not an isError result)."""
    with pytest.raises(MCPError) as info:
        await client.call_tool(tool, arguments)
    error = info.value
    assert error.data["type"] and error.data["guidance"], error.data
    return error


async def test_lists_exactly_the_tools_with_annotations_and_schemas():
    async with Client(mcp_server.mcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
    assert set(tools) == TOOLS
    for name in ("query_knowledge_base", "get_status"):
        assert tools[name].annotations.read_only_hint is True
    for name in ("manage_collections", "manage_projects", "manage_documents", "ingest_documents"):
        assert tools[name].annotations.read_only_hint is False
        assert tools[name].annotations.destructive_hint is True
    assert tools["augment_knowledge"].annotations.destructive_hint is False
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40
        for prop, schema in tool.input_schema["properties"].items():
            assert schema.get("description"), (tool.name, prop)
    actions = tools["manage_projects"].input_schema["properties"]["action"]["enum"]
    assert actions == ["create", "list", "info", "delete", "link", "unlink", "set-defaults"]
    assert tools["manage_documents"].input_schema["properties"]["action"]["enum"] == ["list", "remove", "reindex"]
    assert tools["query_knowledge_base"].input_schema["required"] == ["query"]
    assert set(tools["ingest_documents"].input_schema["required"]) == {"path", "collection"}


async def test_collections_and_projects_round_trip(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        created = await call(client, "manage_collections", action="create", collection_name="api-docs",
                             collection_type="fundamental", description="HTTP API notes")
        assert created["name"] == "api-docs" and created["type"] == "fundamental"
        await call(client, "manage_collections", action="create", collection_name="scratch")
        listed = await call(client, "manage_collections", action="list", collection_type="fundamental")
        assert [c["name"] for c in listed["collections"]] == ["api-docs"]

        project = await call(client, "manage_projects", action="create", project_name="shop",
                             description="The shop backend")
        assert project["name"] == "shop" and project["collections"] == []
        linked = await call(client, "manage_projects", action="link", project_name="shop",
                            collections=["api-docs", "scratch"])
        assert sorted(linked["collections"]) == ["api-docs", "scratch"]
        defaults = await call(client, "manage_projects", action="set-defaults", project_name="shop",
                              collections=["api-docs"])
        assert defaults["default_collections"] == ["api-docs"]
        unlinked = await call(client, "manage_projects", action="unlink", project_name="shop", collections=["scratch"])
        assert unlinked["collections"] == ["api-docs"]
        info = await call(client, "manage_collections", action="info", collection_name="api-docs")
        assert info["projects"] == ["shop"]
        by_project = await call(client, "manage_collections", action="list", project_name="shop")
        assert [c["name"] for c in by_project["collections"]] == ["api-docs"]
        assert [p["name"] for p in (await call(client, "manage_projects", action="list"))["projects"]] == ["shop"]

        assert (await call(client, "manage_projects", action="delete", project_name="shop"))["deleted"] == "shop"
        deleted = await call(client, "manage_collections", action="delete", collection_name="scratch")
        assert deleted == {"deleted": "scratch", "kind": "collection", "chunks_removed": 0}
        remaining = await call(client, "manage_collections", action="list")
        assert [c["name"] for c in remaining["collections"]] == ["api-docs"]


async def test_ingest_query_augment_documents_and_status_with_real_model(_mcp_docs):
    """The whole flow on the real embedding model (loaded once per test process)."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        result = await client.call_tool("ingest_documents", {"path": str(_mcp_docs), "collection": "kb1"},
                                        progress_handler=on_progress)
        report = result.structured_content
        assert report["added"] == 2 and report["chunks_written"] >= 2 and not report["failed"]
        assert sorted(report["documents"]) == ["notes/cache.md", "notes/retries.md"]
        assert progress and progress[-1][0] == 2 and progress[-1][1] == 2
        assert [p[0] for p in progress] == sorted({p[0] for p in progress})  # strictly increasing

        again = await call(client, "ingest_documents", path=str(_mcp_docs), collection="kb1")
        assert again["unchanged"] == 2 and again["chunks_written"] == 0

        answer = await call(client, "query_knowledge_base", query="how often are failed requests retried?",
                            collections=["kb1"], top_k=3)
        assert answer["status"] == "success" and answer["results"]
        top = answer["results"][0]
        assert {"content", "relevance_score", "relevance_label", "source_document", "header_path",
                "metadata"} <= set(top)
        assert top["source_document"] == "notes/retries.md"
        assert "three times" in top["content"]
        assert 0.0 <= top["relevance_score"] <= 1.0
        assert {"document_title", "content_type", "chunk_sequence_id"} <= set(top["metadata"])
        assert top["metadata"]["content_type"] in ("prose", "code_block", "table")
        assert set(answer["query_refinement"]) >= {"status", "suggestions", "message"}
        assert answer["query_refinement"]["status"] in ("optimal", "clarification_needed", "too_broad")

        saved = await call(client, "augment_knowledge", collection="kb1", source="https://example.com/redis",
                           content="# Redis eviction\n\nRedis evicts keys with the allkeys-lru policy.",
                           title="Redis eviction")
        assert saved["status"] == "added" and saved["chunks_written"] >= 1
        found = await call(client, "query_knowledge_base", query="allkeys-lru", collections=["kb1"],
                           mode="keyword", rerank=False)
        assert found["results"][0]["metadata"]["document_title"] == "Redis eviction"

        documents = await call(client, "manage_documents", action="list", collection="kb1")
        assert len(documents["documents"]) == 3
        removed = await call(client, "manage_documents", action="remove", collection="kb1",
                             document="notes/cache.md")
        assert removed["deleted"] == "notes/cache.md" and removed["chunks_removed"] >= 1
        documents = await call(client, "manage_documents", action="list", collection="kb1")
        assert "notes/cache.md" not in [d["document"] for d in documents["documents"]]

        status = await call(client, "get_status")
        assert status["collections"] == 1 and status["embedding_model"] == "all-MiniLM-L6-v2"
        assert status["store_kind"] == "embedded"


async def test_reindex_reports_progress(fake_embedder, _mcp_docs):
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        await call(client, "ingest_documents", path=str(_mcp_docs), collection="kb1", recursive=True)
        result = await client.call_tool("manage_documents", {"action": "reindex", "collection": "kb1"},
                                        progress_handler=on_progress)
        assert result.structured_content["chunks_written"] >= 2
        assert progress and progress[-1] == 2


async def test_collection_errors_are_32002(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        error = await call_error(client, "manage_collections", action="info", collection_name="missing")
        assert error.code == -32002 and error.data["type"] == "CollectionError"
        assert "missing" in error.message
        error = await call_error(client, "augment_knowledge", collection="missing", source="s", content="text")
        assert error.code == -32002
        await call(client, "manage_collections", action="create", collection_name="kb1")
        error = await call_error(client, "manage_collections", action="create", collection_name="kb1")
        assert error.code == -32002


async def test_document_errors_are_32003(fake_embedder, tmp_path):
    outside = tmp_path / "outside.md"  # the allowed root is the working directory, tmp_path/work
    outside.write_text("# Secret\n\nnot for the server\n", encoding="utf-8")
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        error = await call_error(client, "ingest_documents", path=str(Path.cwd() / "nope.md"), collection="kb1")
        assert error.code == -32003 and error.data["type"] == "DocumentError"
        error = await call_error(client, "ingest_documents", path=str(outside), collection="kb1")
        assert error.code == -32003 and "allowed roots" in error.message
        error = await call_error(client, "ingest_documents", path=str(Path.cwd() / ".." / "outside.md"),
                                 collection="kb1")
        assert error.code == -32003
        error = await call_error(client, "manage_documents", action="remove", collection="kb1", document="nope.md")
        assert error.code == -32003


async def test_allowed_roots_setting_opens_other_folders(fake_embedder, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.md").write_text("# A\n\nalpha text\n", encoding="utf-8")
    monkeypatch.setenv("RESEARCH_AGENT_ALLOWED_ROOTS", str(elsewhere))
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        report = await call(client, "ingest_documents", path=str(elsewhere / "a.md"), collection="kb1", title="A")
        assert report["added"] == 1


async def test_query_errors_are_32004(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        error = await call_error(client, "query_knowledge_base", query="   ", collections=["kb1"])
        assert error.code == -32004 and error.data["type"] == "QueryError"
        error = await call_error(client, "query_knowledge_base", query="x" * 100_000, collections=["kb1"])
        assert error.code == -32004


async def test_missing_action_argument_is_invalid_params(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        error = await call_error(client, "manage_collections", action="info")
        assert error.code == -32602 and "collection_name" in error.message
        error = await call_error(client, "manage_projects", action="link", project_name="p")
        assert error.code == -32602
        error = await call_error(client, "manage_documents", action="remove", collection="kb1")
        assert error.code == -32602 and "document" in error.message


async def test_sdk_errors_pass_through_unchanged():
    """Unknown tools and schema violations stay FastMCP's own responses (isError results here)."""
    async with Client(mcp_server.mcp) as client:
        with pytest.raises(ToolError, match="Unknown tool"):
            await client.call_tool("no_such_tool", {})
        with pytest.raises(ToolError):
            await client.call_tool("manage_collections", {"action": "rename"})


async def test_unexpected_exception_is_sanitized_32000(fake_embedder, monkeypatch, capsys):
    from research_agent import status

    def explode(c, check_reranker=False):
        raise RuntimeError("secret detail /home/someone/.ssh")

    monkeypatch.setattr(status, "get_status", explode)
    async with Client(mcp_server.mcp) as client:
        error = await call_error(client, "get_status")
    assert error.code == -32000 and error.data["type"] == "SystemError"
    assert "secret" not in error.message and "RuntimeError" in error.message
    assert "secret" not in str(error.data)
    log = capsys.readouterr().err  # the details go to the log on stderr, with the traceback
    assert "Unexpected failure in tool get_status" in log and "Traceback" in log and "secret detail" in log


async def test_tools_run_off_the_event_loop(fake_embedder, monkeypatch):
    """A slow service call must not block other requests on the same session."""
    import time

    import anyio

    from research_agent import status

    real = status.get_status

    def slow(c, check_reranker=False):
        time.sleep(1.0)
        return real(c)

    monkeypatch.setattr(status, "get_status", slow)
    async with Client(mcp_server.mcp) as client:
        finished: list[str] = []

        async def slow_call():
            await client.call_tool("get_status", {})
            finished.append("status")

        async def fast_call():
            await client.list_tools()
            finished.append("list")

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call)
            await anyio.sleep(0.2)
            tg.start_soon(fast_call)
    assert finished == ["list", "status"]
