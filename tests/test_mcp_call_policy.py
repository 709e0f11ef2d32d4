"""How tool calls wait, time out and fail under hostile conditions (an outside test of commit 02b7f3e): a Chroma
server that accepts connections and never answers, a model warm-up that is still loading, a queue of calls
bigger than the worker-thread pool, error messages that would echo megabytes of input, and progress during
embedding. Real server processes over HTTP (the `mcp` SDK's client) or the in-process `fastmcp.Client`."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

import mcp_server
from test_mcp_http import _env, _sdk_session, free_port, http_server

#: What the tests accept as "bounded": far above the ~5-10 s the fixed code takes, far below a hang.
HANG_BOUND = 60


@contextmanager
def silent_chroma() -> Iterator[int]:
    """A TCP port that accepts connections and never answers a byte (the outside tester's hang.py)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(100)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for sock in [*accepted, listener]:
            sock.close()


@contextmanager
def server_without_health_wait(tmp_path: Path, **settings: str) -> Iterator[str]:
    """`python -m mcp_server` over HTTP, yielded once its port accepts connections (test_mcp_http.http_server
    waits for a 2-second /health, which a server whose store never answers cannot give)."""
    port = free_port()
    log = tmp_path / f"http-{port}.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "mcp_server"], env=_env(tmp_path, port=str(port), **settings),
                                stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + HANG_BOUND
            while not _accepts(port):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait(30)


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_a_chroma_server_that_never_answers_gives_degraded_health_and_coded_errors(tmp_path):
    """/health said nothing for 700 s and every read hung: the connect had no timeout and held the lock that
    /health and the warm-up waited for."""
    with silent_chroma() as port:
        with server_without_health_wait(tmp_path, warmup="true", chroma_host="127.0.0.1", chroma_port=str(port),
                                        call_timeout="8") as url:
            health = httpx.get(f"{url}/health", timeout=HANG_BOUND).json()

            async def flow(session: Any) -> list[MCPError]:
                await session.list_tools()
                errors = []
                with anyio.fail_after(HANG_BOUND):
                    for name, args in (("manage_collections", {"action": "list"}),
                                       ("query_knowledge_base", {"query": "anything"})):
                        with pytest.raises(MCPError) as info:
                            await session.call_tool(name, args)
                        errors.append(info.value)
                return errors

            errors = anyio.run(_sdk_session, url, None, flow)
    assert health["status"] == "degraded" and health["store_reachable"] is False, health
    for error in errors:  # unreachable (-32001), or past the call timeout (-32005): both retryable, coded
        assert error.code in (-32001, -32005) and error.data["retryable"] is True, error


SLOW_MODEL = '''
import os, time, importlib.abc, importlib.machinery, sys

class _Slow(importlib.abc.MetaPathFinder):
    """Holds the embedding model's load until the test creates the release file (a model load of any length)."""
    def find_spec(self, name, path, target=None):
        if name != "research_agent.embeddings":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(mod):
            run(mod)
            real = mod.load_model
            def load_model(*a, **k):
                while not os.path.exists(os.environ["SLOW_MODEL_RELEASE"]):
                    time.sleep(0.05)
                return real(*a, **k)
            mod.load_model = load_model
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Slow())
'''


@pytest.mark.slow
def test_calls_fail_fast_and_model_free_calls_answer_while_the_model_loads(tmp_path, monkeypatch):
    """With the model load held: argument errors raised inside the services come back at once, model-free calls
    answer although 45 model calls wait (they once held every worker thread: -32005 for a list), and the waiting
    calls all finish once the model is there."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_MODEL)
    release = tmp_path / "release"
    monkeypatch.setenv("SLOW_MODEL_RELEASE", str(release))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nSome text about retries.\n")
    import test_mcp_http

    real_env = test_mcp_http._env
    monkeypatch.setattr(test_mcp_http, "_env", lambda *a, **k: {
        **real_env(*a, **k), "PYTHONPATH": f"{hooks}:{real_env(*a, **k)['PYTHONPATH']}"})
    with http_server(tmp_path, warmup="true", rerank="false", call_timeout="20", allowed_roots=str(docs)) as url:
        async def flow(session: Any) -> dict[str, Any]:
            await session.list_tools()  # starts the warm-up: the model load now waits for `release`
            await session.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
            seen: dict[str, Any] = {}
            with anyio.fail_after(HANG_BOUND):
                for name, args in (("query_knowledge_base", {"query": ""}),
                                   ("query_knowledge_base", {"query": "x", "collections": ["no-such-one"]}),
                                   ("ingest_documents", {"path": str(tmp_path), "collection": "kbase"}),
                                   ("augment_knowledge", {"collection": "kbase", "content": "", "source": "s"})):
                    with pytest.raises(MCPError) as info:
                        await session.call_tool(name, args)
                    seen[f"{name} {args}"] = info.value
            answers: list[Any] = []

            async def query() -> None:
                answers.append(await session.call_tool("query_knowledge_base", {"query": "retries"}))

            async with anyio.create_task_group() as tg:
                for _ in range(45):
                    tg.start_soon(query)
                await anyio.sleep(2)  # the 45 are queued behind the model load
                with anyio.fail_after(HANG_BOUND):
                    listed = await session.call_tool("manage_collections", {"action": "list"})
                    seen["list"] = listed.structured_content
                    seen["status"] = (await session.call_tool("get_status", {})).structured_content
                release.write_text("go")
            seen["answers"] = answers
            return seen

        seen = anyio.run(_sdk_session, url, None, flow)
    errors = {key: value for key, value in seen.items() if isinstance(value, MCPError)}
    assert len(errors) == 4
    for key, error in errors.items():
        assert error.code not in (-32000, -32005) and not error.data["retryable"], (key, error)
    assert [c["name"] for c in seen["list"]["collections"]] == ["kbase"]
    assert seen["status"]["warmup"] == "running" and seen["status"]["embedding_loaded"] is False
    assert len(seen["answers"]) == 45 and all(a.structured_content["results"] == [] for a in seen["answers"])



@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def _no_warmup(no_warmup):
    """conftest.no_warmup under this file's older name."""


def _size(error: MCPError) -> int:
    return len(error.error.message) + len(json.dumps(error.error.data))


@pytest.mark.anyio
async def test_errors_never_echo_megabytes_of_input(_no_warmup):
    """A 1 MB document name made a 1 MB error, a 100 KB tool name a 100 KB one (and its list of tools)."""
    huge = "d" * 1_000_000
    forged = base64.urlsafe_b64encode(json.dumps({"v": 1, "k": "x" * 200_000, "a": ""}).encode()).decode()
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        errors = []
        for name, args in (("t" * 100_000, {}),
                           ("manage_documents", {"action": "get", "collection": "kbase", "document": huge}),
                           ("manage_documents", {"action": "list", "collection": "kbase", "cursor": forged}),
                           ("manage_collections", {"action": "info", "collection_name": huge})):
            with pytest.raises(MCPError) as info:
                await client.call_tool(name, args)
            errors.append(info.value)
    for error in errors:
        assert error.error.code != -32000 and _size(error) < 4096, (error.error.code, _size(error))
        assert max(len(word) for word in error.error.message.split()) <= 201, error.error.message[:300]


@pytest.mark.anyio
async def test_a_deeply_nested_cursor_is_an_invalid_cursor(_no_warmup):
    """100000 `[` inside base64 raised RecursionError in json.loads: -32000 instead of the cursor's -32004."""
    nested = base64.urlsafe_b64encode(b"[" * 100_000).decode()
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        with pytest.raises(MCPError) as info:
            await client.call_tool("manage_documents", {"action": "list", "collection": "kbase", "cursor": nested})
    assert info.value.error.code == -32004 and info.value.error.data["argument"] == "cursor"
    assert _size(info.value) < 4096


def test_decode_cursor_refuses_nesting_without_recursion_error():
    from research_agent.catalog.common import decode_cursor
    from research_agent.errors import QueryError

    with pytest.raises(QueryError):
        decode_cursor("collections", base64.urlsafe_b64encode(b"[" * 100_000).decode())


@pytest.mark.slow
@pytest.mark.anyio
async def test_ingest_progress_moves_while_a_large_document_is_embedded(_no_warmup):
    """Progress was forwarded only when files_done grew: one large file showed nothing until it was written.
    The real model embeds ~100 chunks in slices of 32; the client sees fractional progress with chunk counts."""
    folder = Path.cwd() / "big"
    folder.mkdir()
    (folder / "big.md").write_text("\n\n".join(f"## Part {i}\n\n" + " ".join(f"word{i}x{j} retries backoff timeout"
                                                                               for j in range(60))
                                               for i in range(60)), encoding="utf-8")
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        result = await client.call_tool("ingest_documents", {"path": str(folder), "collection": "kbase"},
                                        progress_handler=on_progress)
    assert result.structured_content["added"] == 1
    values = [value for value, _, _ in seen]
    assert values == sorted(set(values)), values  # MCP: each notification's progress increases
    assert any(0 < value < 1 for value in values), seen
    assert any(message and "embedding" in message and "chunks" in message for _, _, message in seen), seen


def test_a_socket_that_never_answers_is_unreachable_within_the_connect_timeout(tmp_path):
    """Store._connect's heartbeat had no timeout: it blocked for ever (and every thread behind its lock)."""
    from research_agent.config import Settings
    from research_agent.errors import StoreUnavailableError
    from research_agent.storage.store import Store

    with silent_chroma() as port:
        store = Store(Settings(store=tmp_path / "s", chroma_host="127.0.0.1", chroma_port=port))
        box: list[BaseException] = []
        worker = threading.Thread(target=lambda: _capture(box, lambda: store.client), daemon=True)
        worker.start()
        worker.join(HANG_BOUND)
        assert not worker.is_alive(), "connecting to a silent server did not return"
    assert isinstance(box[0], StoreUnavailableError) and box[0].retryable, box


def _capture(box: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        box.append(exc)


@pytest.mark.anyio
async def test_both_names_of_an_aliased_argument_say_give_only_one(_no_warmup):
    """collection + collection_name was "Unexpected keyword argument", which names neither mistake nor fix."""
    async with Client(mcp_server.mcp) as client:
        await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
        with pytest.raises(MCPError) as info:
            await client.call_tool("manage_documents", {"action": "list", "collection": "kbase",
                                                        "collection_name": "kbase"})
    assert info.value.error.code == -32602
    assert "give only one of collection, collection_name" in info.value.error.message, info.value.error.message


async def query_with_held_model(monkeypatch: Any, *, warmup: bool, loads: bool) -> Any:
    """The error a query_knowledge_base call ends with while the embedding model's load is held past the 2 s
    call timeout (then the real loader when `loads`, else a ConfigError); warm-up on or off."""
    from research_agent import embeddings
    from research_agent.errors import ConfigError

    release = threading.Event()
    real = embeddings.load_model

    def held_load(*args: Any, **kwargs: Any) -> Any:
        release.wait(HANG_BOUND)
        if not loads:
            raise ConfigError("the held model never loads")
        return real(*args, **kwargs)

    monkeypatch.setattr(embeddings, "_cache", {})
    monkeypatch.setattr(embeddings, "load_model", held_load)
    for key, value in (("WARMUP", str(warmup).lower()), ("CALL_TIMEOUT", "2"), ("RERANK", "false")):
        monkeypatch.setenv(f"RESEARCH_AGENT_{key}", value)
    try:
        async with Client(mcp_server.mcp) as client:
            if warmup:
                await client.list_tools()  # starts the warm-up
            await client.call_tool("manage_collections", {"action": "create", "collection_name": "kbase"})
            with anyio.fail_after(HANG_BOUND), pytest.raises(MCPError) as info:
                await client.call_tool("query_knowledge_base", {"query": "retries", "collections": ["kbase"]})
    finally:
        release.set()
    return info.value.error


@pytest.mark.anyio
async def test_a_read_timed_out_by_the_model_warm_up_says_so(monkeypatch):
    """The warm-up wait now counts toward the call timeout; its -32005 blames the warm-up, not the request."""
    error = await query_with_held_model(monkeypatch, warmup=True, loads=False)
    assert error.code == -32005 and "warm-up" in error.message and error.data["warmup"] is True, error
