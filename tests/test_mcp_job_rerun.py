"""A job (ingest) whose first run stops at ModelsNotReady while the warm-up loads the model, then runs again:
its progress notifications must keep increasing across both runs (MCP), and get_status must list it while it
waits. The outside tester saw 0 -> 59/60, then 0, 1, ... again, and no running job during the wait. Real model
(the real loader, held until the test releases it), real embedded Chroma, the in-process fastmcp.Client."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

import mcp_server

#: A bound to catch a hang, far above the few seconds the test takes.
HANG_BOUND = 60


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def held_model(monkeypatch):
    """The real loader, held until the event is set; the warm-up starts at once, the reranker is off."""
    from research_agent import embeddings

    release = threading.Event()
    real = embeddings.load_model

    def held_load(*args: Any, **kwargs: Any) -> Any:
        release.wait(HANG_BOUND)
        return real(*args, **kwargs)

    monkeypatch.setattr(embeddings, "_cache", {})
    monkeypatch.setattr(embeddings, "load_model", held_load)
    for key, value in (("WARMUP", "true"), ("RERANK", "false")):
        monkeypatch.setenv(f"RESEARCH_AGENT_{key}", value)
    try:
        yield release
    finally:
        release.set()


async def _wait_for_rerun(client: Client, seen: list[float]) -> list[list[dict[str, Any]]]:
    """get_status's running jobs, polled until the job waits for the models, or until it vanished after its
    first run sent progress (the old behaviour), or HANG_BOUND / 3 s."""
    snapshots: list[list[dict[str, Any]]] = []
    with anyio.move_on_after(HANG_BOUND / 3):
        while True:
            jobs = (await client.call_tool("get_status", {})).structured_content["running_jobs"]
            snapshots.append(jobs)
            if any(job.get("state") == "waiting for models" for job in jobs) or (seen and not jobs):
                return snapshots
            await anyio.sleep(0.1)
    return snapshots


@pytest.mark.anyio
async def test_a_job_run_again_after_the_warm_up_keeps_progress_increasing_and_stays_listed(held_model,
                                                                                          tmp_path: Path):
    folder = Path.cwd() / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"d{i:02}.md").write_text(f"# Doc {i}\n\nRetries and backoff, note {i}.\n", encoding="utf-8")
    seen: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async with Client(mcp_server.mcp) as client:
        await client.list_tools()  # starts the warm-up: its model load now waits for `held_model`
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        box: dict[str, Any] = {}

        async def ingest() -> None:
            box["result"] = await client.call_tool("ingest_documents", {"path": str(folder), "collection": "kbase"},
                                                   progress_handler=on_progress)

        with anyio.fail_after(HANG_BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ingest)
                snapshots = await _wait_for_rerun(client, seen)
                held_model.set()
            after = (await client.call_tool("get_status", {})).structured_content["running_jobs"]
    assert box["result"].structured_content["added"] == 12
    assert seen and seen == sorted(set(seen)), seen  # MCP: each notification's progress increases
    waiting = [job for jobs in snapshots for job in jobs if job.get("state") == "waiting for models"]
    assert waiting and waiting[-1]["tool"] == "ingest_documents" and waiting[-1]["collection"] == "kbase", snapshots
    assert after == []  # the entry ends with the call


def _refused_port() -> int:
    """A local port nobody listens on: connecting is refused at once (a Chroma server that is down)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.anyio
async def test_the_warm_up_loads_the_models_when_the_store_is_down_at_start(monkeypatch):
    """A store stage that failed skipped the models: the first query loaded them inside its own time budget and
    timed out, while get_status said "failed" for ever with embedding_loaded true."""
    from research_agent import embeddings
    from research_agent.mcp.lifespan import STORE_LATE

    monkeypatch.setattr(embeddings, "_cache", {})
    for key, value in (("WARMUP", "true"), ("RERANK", "false"), ("CHROMA_HOST", "127.0.0.1"),
                       ("CHROMA_PORT", str(_refused_port()))):
        monkeypatch.setenv(f"RESEARCH_AGENT_{key}", value)
    async with Client(mcp_server.mcp) as client:
        await client.list_tools()  # starts the warm-up
        with anyio.fail_after(HANG_BOUND):
            while (status := (await client.call_tool("get_status", {})).structured_content)["warmup"] in (
                    "pending", "running"):
                await anyio.sleep(0.1)
            # once more: the status report is built before the warm-up state is read, so the last poll may
            # have seen embedding_loaded just before the warm-up finished
            status = (await client.call_tool("get_status", {})).structured_content
    assert status["warmup"] == STORE_LATE and status["embedding_loaded"] is True, status


def test_a_warm_up_with_a_late_store_reports_done_once_the_store_connects(monkeypatch):
    """The STORE_LATE state re-checks the store: once a later call has connected, the warm-up is "done"."""
    from research_agent.mcp.lifespan import STORE_LATE, Warmup
    from research_agent.storage.store import Store

    class _Container:
        store = Store.__new__(Store)

    warmup = Warmup(_Container(), enabled=True)  # type: ignore[arg-type]
    warmup._state = STORE_LATE
    _Container.store._client = None
    assert warmup.state == STORE_LATE
    _Container.store._client = object()
    assert warmup.state == "done"


@pytest.mark.anyio
async def test_a_call_timed_out_while_loading_the_model_itself_says_so(monkeypatch):
    """With the warm-up off, a query loads the model in its own budget; its -32005 said "Narrow the request"."""
    from test_mcp_call_policy import query_with_held_model

    error = await query_with_held_model(monkeypatch, warmup=False, loads=True)
    assert error.code == -32005 and "loading the embedding model" in error.message, error
    assert "Narrow the request" not in error.message and error.data["retryable"] is True, error
