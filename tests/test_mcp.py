"""The MCP server through an in-memory `fastmcp.Client`: tool surface, happy paths, error codes on the client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

import mcp_server

pytestmark = pytest.mark.anyio

TOOLS = {"query_knowledge_base", "manage_collections", "manage_projects", "ingest_documents",
         "augment_knowledge", "manage_documents", "get_status", "check_store", "discover_context",
         "retrieve_knowledge", "list_knowledge_bases", "search_knowledge", "get_dependencies",
         "evaluate_retrieval"}


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
    assert tools["manage_documents"].input_schema["properties"]["action"]["enum"] == [
        "list", "get", "remove", "reindex", "add-note", "update-note", "prune"]
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


async def test_create_with_exist_ok_uses_the_existing_collection_as_the_cli_does():
    """manage_collections(create, exist_ok) = `collections create --exist-ok` (ensure_collection): an existing
    collection answers (created false), a project is linked, another description is kept with a warning and
    another type fails with the CLI's own error. No embedding: nothing here loads a model."""
    async with Client(mcp_server.mcp) as client:
        first = await call(client, "manage_collections", action="create", collection_name="typed",
                           collection_type="fundamental", description="Runbooks")
        assert first["created"] is True and first["warnings"] == []
        assert (await call_error(client, "manage_collections", action="create", collection_name="typed")).code == -32002
        await call(client, "manage_projects", action="create", project_name="web")
        again = await call(client, "manage_collections", action="create", collection_name="typed", exist_ok=True,
                           project_name="web", description="Other text")
        assert again["created"] is False and again["type"] == "fundamental" and again["projects"] == ["web"]
        assert again["description"] == "Runbooks" and "Runbooks" in again["warnings"][0]
        error = await call_error(client, "manage_collections", action="create", collection_name="typed",
                                 exist_ok=True, collection_type="project-specific")
        assert error.code == -32002 and error.data["type"] == "CollectionError"
        assert "'fundamental'" in error.message and "'project-specific'" in error.message
        new = await call(client, "manage_collections", action="create", collection_name="fresh", exist_ok=True)
        assert new["created"] is True and new["type"] == "project-specific"
    cli = subprocess.run([sys.executable, "-m", "research_agent", "--json", "collections", "create", "typed",
                          "--type", "project-specific", "--exist-ok"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 4, cli.stderr  # CollectionError's exit code, as -32002 over MCP
    assert json.loads(cli.stderr.strip().splitlines()[-1])["error"]["message"] in error.message


async def test_ingest_with_create_makes_the_collection_only_for_a_path_that_exists(_mcp_docs):
    """ingest_documents(create=true) = `kb add-folder --create`, on the real model: the collection is created
    (project-specific) and filled; an existing one is used as it is; a missing or refused path creates nothing."""
    async with Client(mcp_server.mcp) as client:
        for path in (Path.cwd() / "nope", Path.cwd().parent / "outside", "https://not-allowed.example/page"):
            error = await call_error(client, "ingest_documents", path=str(path), collection="made", create=True)
            assert error.code in (-32001, -32003), error.message
        assert (await call(client, "manage_collections", action="list"))["collections"] == []

        report = await call(client, "ingest_documents", path=str(_mcp_docs), collection="made", create=True)
        assert report["added"] == 2 and not report["failed"]
        info = await call(client, "manage_collections", action="info", collection_name="made")
        assert info["type"] == "project-specific" and info["document_count"] == 2

        await call(client, "manage_collections", action="create", collection_name="ref", collection_type="fundamental")
        again = await call(client, "ingest_documents", path=str(_mcp_docs), collection="ref", create=True)
        assert again["added"] == 2
        ref = await call(client, "manage_collections", action="info", collection_name="ref")
        assert ref["type"] == "fundamental"
        error = await call_error(client, "ingest_documents", path=str(_mcp_docs), collection="absent")
        assert error.code == -32002  # without create a missing collection is still an error


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


async def test_unknown_tool_and_bad_arguments_are_invalid_params_that_say_what_to_send():
    """FastMCP's own unknown-tool and schema errors become JSON-RPC -32602 errors, not isError results."""
    async with Client(mcp_server.mcp) as client:
        error = await call_error(client, "no_such_tool")
        assert error.code == -32602 and "no_such_tool" in error.message
        assert "query_knowledge_base" in error.data["guidance"]

        error = await call_error(client, "manage_collections", action="rename")  # unknown action
        assert error.code == -32602 and "action" in error.message and "rename" in error.message
        assert "create, list, info, delete" in error.data["guidance"]

        error = await call_error(client, "query_knowledge_base", top_k=3)  # missing required argument
        assert error.code == -32602 and "query" in error.message
        assert error.data["guidance"].startswith("Required: query (string).")

        error = await call_error(client, "query_knowledge_base", query="x", top_k="many")  # wrong type
        assert error.code == -32602 and "top_k" in error.message and "'many'" in error.message
        assert error.data["problems"][0]["argument"] == "top_k"


async def test_unexpected_exception_is_sanitized_32000(fake_embedder, monkeypatch, capsys):
    from research_agent.ops import status

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

    from research_agent.ops import status

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


# -- surface: text renderings, resources, prompts, status --------------------------------------------------
async def test_results_carry_structured_content_and_a_markdown_rendering(fake_embedder, _mcp_docs):
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1", description="notes")
        listed = await client.call_tool("manage_collections", {"action": "list"})
        assert listed.structured_content["collections"][0]["name"] == "kb1"
        text = listed.content[0].text
        assert text.startswith("## Collections (1") and "| kb1 |" in text  # "(1)" or "(1 of 1)": render.py pages
        await call(client, "ingest_documents", path=str(_mcp_docs), collection="kb1")
        answer = await client.call_tool("query_knowledge_base", {"query": "retries backoff", "collections": ["kb1"],
                                                                 "rerank": False})
        text = answer.content[0].text
        top = answer.structured_content["results"][0]
        assert text.startswith("## ") and "### 1. notes/retries.md" in text and top["content"].strip() in text


async def test_resources_list_collections_info_chunks_and_query_history(fake_embedder, _mcp_docs):
    import json

    async with Client(mcp_server.mcp) as client:
        uris = {str(r.uri) for r in await client.list_resources()}
        assert {"research://collections", "research://history"} <= uris
        templates = {t.uri_template for t in await client.list_resource_templates()}
        assert {"research://collections/{name}", "research://collections/{name}/documents/{document*}"} <= templates

        await call(client, "manage_collections", action="create", collection_name="kb1")
        await call(client, "ingest_documents", path=str(_mcp_docs), collection="kb1")
        listed = json.loads((await client.read_resource("research://collections"))[0].text)
        assert [c["name"] for c in listed["collections"]] == ["kb1"]
        info = json.loads((await client.read_resource("research://collections/kb1"))[0].text)
        assert info["document_count"] == 2
        chunks = json.loads((await client.read_resource("research://collections/kb1/documents/notes/retries.md"))[0].text)
        assert chunks["document"] == "notes/retries.md" and chunks["chunk_count"] >= 1
        assert [c["sequence"] for c in chunks["chunks"]] == sorted(c["sequence"] for c in chunks["chunks"])
        assert "three times" in " ".join(c["content"] for c in chunks["chunks"])

        for q in ("first question about retries", "second question about caching"):
            await call(client, "query_knowledge_base", query=q, collections=["kb1"], rerank=False)
        history = json.loads((await client.read_resource("research://history"))[0].text)["queries"]
        assert [h["query"] for h in history[:2]] == ["second question about caching", "first question about retries"]
        assert history[0]["collections"] == ["kb1"] and history[0]["n_results"] >= 1

        with pytest.raises(MCPError) as info:
            await client.read_resource("research://collections/missing")
        assert info.value.code == -32002


def test_history_is_bounded(fake_embedder, container, monkeypatch):
    from research_agent.search import history

    monkeypatch.setattr(history, "MAX_ENTRIES", 5)
    for i in range(8):
        history.record_query(container, f"q{i}", ["kb"], i)
    recent = history.recent_queries(container, 100)
    assert [h["query"] for h in recent] == ["q7", "q6", "q5", "q4", "q3"]
    assert container.store.registry_find("history").__len__() == 5


async def test_prompts_query_refinement_and_context_extraction(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1", description="API notes")
        prompts = {p.name: p for p in await client.list_prompts()}
        assert {"query_refinement", "context_extraction"} <= set(prompts)
        assert [a.name for a in prompts["query_refinement"].arguments] == ["query"]
        got = await client.get_prompt("query_refinement", {"query": "why do uploads fail"})
        text = got.messages[0].content.text
        assert "why do uploads fail" in text and "kb1" in text and "query_knowledge_base" in text
        got = await client.get_prompt("context_extraction", {"document": "# Title\n\nSome fact."})
        assert "Some fact." in got.messages[0].content.text and "augment_knowledge" in got.messages[0].content.text


async def test_status_reports_models_store_counts_limits_and_running_jobs(fake_embedder, _mcp_docs, monkeypatch):
    import threading

    from research_agent import ingest

    started, release = threading.Event(), threading.Event()

    def slow_ingest(c, path, collection, *, progress=None, **kwargs):
        progress(ingest.IngestProgress(stage="reading", files_done=0, files_total=1, chunks_done=0, chunks_total=0))
        started.set()
        assert release.wait(30)
        return ingest.IngestReport(collection=collection)

    monkeypatch.setattr(ingest, "ingest_path", slow_ingest)
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "ingest_documents", {"path": str(_mcp_docs), "collection": "kb1"})
            await anyio.to_thread.run_sync(started.wait, 30)
            status = await call(client, "get_status")
            release.set()
        assert [(j["tool"], j["collection"]) for j in status["running_jobs"]] == [("ingest_documents", "kb1")]
        assert status["running_jobs"][0]["progress"]["stage"] == "reading"
        for key in ("version", "store_kind", "store_location", "store_reachable", "embedding_model", "embedding_loaded",
                    "reranker_model", "reranker_loaded", "device", "collections", "chunks", "warmup"):
            assert key in status, key
        assert status["limits"] == {"max_concurrent_calls": 10, "call_timeout": 30.0}
        assert status["warmup"] == "off"  # RESEARCH_AGENT_WARMUP=false in these tests
        assert (await call(client, "get_status"))["running_jobs"] == []


# -- limits: timeout, concurrency, cancellation, warm-up -----------------------------------------------------
async def test_read_calls_past_the_timeout_get_a_coded_error(fake_embedder, monkeypatch):
    import time

    from research_agent.ops import status

    monkeypatch.setenv("RESEARCH_AGENT_CALL_TIMEOUT", "0.5")
    monkeypatch.setattr(status, "get_status", lambda c, check_reranker=False: time.sleep(3))
    async with Client(mcp_server.mcp) as client:
        started = time.monotonic()
        error = await call_error(client, "get_status")
        assert time.monotonic() - started < 2.5  # answered at the limit, not when the work ends
    assert error.code == -32005 and error.data["type"] == "TimeoutError" and error.data["retryable"] is True


async def test_at_most_max_concurrent_calls_run_at_once(fake_embedder, monkeypatch):
    import threading
    import time

    from research_agent.ops import status

    monkeypatch.setenv("RESEARCH_AGENT_MAX_CONCURRENT_CALLS", "2")
    lock, running, peak = threading.Lock(), [0], [0]
    real = status.get_status

    def tracked(c, check_reranker=False):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return real(c)

    monkeypatch.setattr(status, "get_status", tracked)
    async with Client(mcp_server.mcp) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(client.call_tool, "get_status", {})
    assert peak[0] == 2


async def test_a_cancelled_ingest_stops_writing(fake_embedder, _mcp_docs, monkeypatch):
    import threading
    import time

    from research_agent import ingest

    written: list[int] = []
    stopped = threading.Event()

    def long_ingest(c, path, collection, *, progress=None, **kwargs):
        try:
            for i in range(200):
                progress(ingest.IngestProgress(stage="reading", files_done=i, files_total=200, chunks_done=i,
                                               chunks_total=200))
                written.append(i)  # stands for a committed batch
                time.sleep(0.05)
            return ingest.IngestReport(collection=collection)
        finally:
            stopped.set()

    monkeypatch.setattr(ingest, "ingest_path", long_ingest)
    first_progress = anyio.Event()

    async def on_progress(value, total, message):
        first_progress.set()

    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial_call(client, on_progress, str(_mcp_docs)))
                await first_progress.wait()
                scope.cancel()
        assert await anyio.to_thread.run_sync(stopped.wait, 30), "the ingest kept running after cancellation"
        count = len(written)
        await anyio.sleep(0.3)
        assert len(written) == count < 200
        status = await call(client, "get_status")
        assert status["running_jobs"] == []


def test_a_cancelled_call_is_logged_as_the_clients_choice_not_an_unexpected_failure(caplog):
    """The worker's CallCancelled (Ctrl-C or a closed stdin mid-ingest, the seventh attack pass) gave an ERROR
    "Unexpected failure" with a 41-line traceback; it is one info line and a coded answer."""
    import logging

    from research_agent.mcp.errors import CallCancelled, to_tool_failure

    with caplog.at_level(logging.INFO, logger="research_agent"):
        failure = to_tool_failure(CallCancelled("ingest_documents cancelled by the client"), "ingest_documents")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert "cancelled" in str(failure.error) and "Unexpected" not in str(failure.error)


def partial_call(client, on_progress, path):
    async def run():
        await client.call_tool("ingest_documents", {"path": path, "collection": "kb1"}, progress_handler=on_progress)
    return run


def test_warmup_and_a_first_call_load_the_model_once(monkeypatch):
    """The loader's lock makes a tool call that arrives during warm-up wait for it, not load a second copy."""
    import threading
    import time

    from research_agent import embeddings
    from research_agent.container import build_container

    loads: list[str] = []

    class SlowModel:
        dimension = 4

        def __init__(self, name, target, device, batch_size, local_only=False):
            loads.append(name)
            time.sleep(1.0)
            self.name = name

    monkeypatch.setattr(embeddings, "_cache", {})
    monkeypatch.setitem(embeddings._BACKENDS, "sentence-transformers", SlowModel)
    monkeypatch.setenv("RESEARCH_AGENT_RERANK", "false")
    container = build_container()
    from research_agent.mcp.lifespan import Warmup

    warmup = Warmup(container, enabled=True)
    warmup.start()
    got: list[object] = []
    caller = threading.Thread(target=lambda: got.append(container.embedder))
    time.sleep(0.1)
    caller.start()
    caller.join(30)
    warmup.thread.join(30)
    assert loads == ["all-MiniLM-L6-v2"] and warmup.state == "done"
    assert got[0] is embeddings._cache[("sentence-transformers", "all-MiniLM-L6-v2", "cpu")]


async def test_notes_get_and_store_check_over_mcp(fake_embedder):
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="notes")
        note = await call(client, "manage_documents", action="add-note", collection="notes",
                          content="# Plan\n\nUse sqlite.", title="Plan")
        assert note["kind"] == "note" and note["status"] == "added"
        updated = await call(client, "manage_documents", action="update-note", collection="notes",
                             document=note["document"], content="# Plan\n\nUse redis.")
        assert updated["status"] == "updated" and updated["document"] == note["document"]
        got = await call(client, "manage_documents", action="get", collection="notes", document=note["document"])
        assert "redis" in got["content"] and "sqlite" not in got["content"]
        error = await call_error(client, "manage_documents", action="add-note", collection="notes", content="x")
        assert error.code == -32602 and "title" in str(error)
        error = await call_error(client, "manage_documents", action="get", collection="notes", document="note:nope")
        assert error.code == -32003
        report = await call(client, "check_store")
        assert report["healthy"] is True and report["collections"][0]["documents"] == 1


async def test_query_filters_budget_and_evaluation_over_mcp(fake_embedder, _mcp_docs):
    notes_folder = _mcp_docs
    qrels = Path.cwd() / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tnotes/retries.md\t1\n")
    queries = Path.cwd() / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "how many times are failed requests retried"}\n')
    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="docs")
        await call(client, "ingest_documents", path=str(notes_folder), collection="docs", recursive=True)
        res = await call(client, "query_knowledge_base", query="cached redis", filters={"document": "notes/cache.md"},
                         max_tokens=5, snippets=True, rerank=False)
        assert [h["source_document"] for h in res["results"]] == ["notes/cache.md"]
        error = await call_error(client, "query_knowledge_base", query="x", filters={"colour": "red"})
        assert error.code == -32004 and "colour" in str(error)
        report = await call(client, "evaluate_retrieval", collection="docs", queries_file=str(queries),
                            qrels_file=str(qrels), k=5)
        modes = {m["mode"]: m for m in report["modes"]}
        assert modes["keyword"]["ndcg"] == 1.0 and modes["hybrid+rerank"]["available"] is False
        error = await call_error(client, "evaluate_retrieval", collection="docs", queries_file="/etc/passwd",
                                 qrels_file=str(qrels))
        assert error.code == -32003


async def test_a_user_error_raised_before_the_call_runs_logs_no_traceback(fake_embedder, caplog):
    """`ingest_documents` with an ftp:// or file:// path is refused in the tool body, before any work: the client
    got the right -32003, but FastMCP logged "Error calling tool" with a 30-line traceback on the server's stderr
    (the seventh attack pass), which MCP clients show users as the server log."""
    import logging

    async with Client(mcp_server.mcp) as client:
        await call(client, "manage_collections", action="create", collection_name="kb1")
        with caplog.at_level(logging.INFO):
            error = await call_error(client, "ingest_documents", path="file:///etc/passwd", collection="kb1")
    assert error.code == -32003
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        [(r.name, r.getMessage()) for r in caplog.records]
