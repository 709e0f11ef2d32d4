"""The real server over streamable HTTP on 127.0.0.1, spoken to by the `mcp` SDK's own client (code nobody
here wrote): auth modes, 401s that reveal nothing, the public /health, refusal to expose an open server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TOKEN = "s3cret-token-for-tests-0123456789"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(RESEARCH_AGENT_STORE=str(tmp_path / "store"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
               RESEARCH_AGENT_TRANSPORT="http", RESEARCH_AGENT_WARMUP="false")
    env.update({f"RESEARCH_AGENT_{k.upper()}": v for k, v in settings.items()})
    return env


@contextmanager
def http_server(tmp_path: Path, hub_env: dict[str, str] | None = None, **settings: str) -> Iterator[str]:
    """`python -m mcp_server` over HTTP on a free port; yields its base URL once /health answers. `hub_env`
    replaces HF_HUB_OFFLINE with the given hub settings (downloads on)."""
    port = free_port()
    work = Path.cwd()
    stderr_path = tmp_path / f"http-{port}.log"
    env = _env(tmp_path, port=str(port), **settings)
    if hub_env is not None:
        env = {k: v for k, v in env.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))} | hub_env
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "mcp_server"], cwd=work,
                                env=env, stdout=subprocess.PIPE, stderr=stderr)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, stderr_path.read_text()
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"no /health within 60 s:\n{stderr_path.read_text()}"
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
    assert out == b"", out  # nothing on stdout, even over HTTP


async def _sdk_session(url: str, headers: dict[str, str] | None, body: Any) -> Any:
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _mcp_initialize(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/mcp", headers={"Accept": "application/json, text/event-stream",
                                             "Content-Type": "application/json", **headers},
                      json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "t", "version": "0"}}}, timeout=30)


def test_bearer_auth_sdk_client_lists_ingests_and_queries_and_wrong_tokens_get_401(tmp_path):
    notes = Path.cwd() / "notes"
    notes.mkdir()
    (notes / "ops.md").write_text("# Operations\n\nRotate the quokka credentials every ninety days.\n",
                                  encoding="utf-8")
    with http_server(tmp_path, auth_type="bearer", api_keys=f"other-key-0123456789,{TOKEN}") as url:
        health = httpx.get(f"{url}/health", timeout=30)
        assert health.status_code == 200  # public, no credentials
        assert health.json()["version"] and health.json()["store_reachable"] is True
        assert "store" not in json.dumps(health.json()).replace("store_reachable", "").replace("store_kind", "")

        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                        {"X-API-Key": TOKEN}):
            refused = _mcp_initialize(url, headers)
            assert refused.status_code == 401, headers
            assert refused.json() == {"error": "unauthorized"}
        assert _mcp_initialize(url, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200

        async def flow(session: Any) -> dict[str, Any]:
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"query_knowledge_base", "ingest_documents", "get_status"} <= tools
            created = await session.call_tool("manage_collections", {"action": "create", "collection_name": "ops"})
            assert created.structured_content["name"] == "ops"
            report = await session.call_tool("ingest_documents", {"path": str(notes), "collection": "ops"})
            assert report.structured_content["added"] == 1, report
            found = await session.call_tool("query_knowledge_base", {"query": "quokka credentials",
                                                                     "collections": ["ops"], "mode": "keyword"})
            assert "Rotate the quokka" in found.content[0].text  # the Markdown rendering
            return found.structured_content

        found = anyio.run(_sdk_session, url, {"Authorization": f"Bearer {TOKEN}"}, flow)
        assert found["results"][0]["source_document"] == "notes/ops.md"

        async def no_token(session: Any) -> None:
            raise AssertionError("connected without a token")

        from mcp.shared.exceptions import MCPError

        with pytest.raises(BaseException) as info:  # the SDK reports the 401 as a failed initialize
            anyio.run(_sdk_session, url, None, no_token)
        leaves = _leaves(info.value)
        assert leaves and all(isinstance(e, MCPError) for e in leaves), repr(info.value)


def test_api_key_header_auth(tmp_path):
    with http_server(tmp_path, auth_type="api-key", api_keys=TOKEN) as url:
        assert _mcp_initialize(url, {}).status_code == 401
        assert _mcp_initialize(url, {"X-API-Key": "nope"}).status_code == 401
        assert _mcp_initialize(url, {"Authorization": f"Bearer {TOKEN}"}).status_code == 401

        async def flow(session: Any) -> Any:
            return (await session.call_tool("manage_collections", {"action": "list"})).structured_content

        assert anyio.run(_sdk_session, url, {"X-API-Key": TOKEN}, flow) == {"collections": [], "total": 0,
                                                                            "next_cursor": None}


def test_no_auth_is_served_on_loopback(tmp_path):
    from mcp.shared.exceptions import MCPError

    with http_server(tmp_path) as url:
        async def flow(session: Any) -> Any:
            with pytest.raises(MCPError) as info:
                await session.call_tool("manage_collections", {"action": "info", "collection_name": "nope"})
            return info.value

        error = anyio.run(_sdk_session, url, None, flow)
        assert error.code == -32002 and error.data["type"] == "CollectionError"


def test_an_idle_server_is_healthy_and_names_its_store_kind(tmp_path):
    """Issue 15: with the warm-up on, /health said "starting" (and no store_kind) until a client connected."""
    with http_server(tmp_path, warmup="true") as url:
        health = httpx.get(f"{url}/health", timeout=60).json()
    assert health["status"] == "ok" and health["store_reachable"] is True, health
    assert health["store_kind"] == "embedded"


@pytest.mark.slow
def test_calls_that_need_no_model_do_not_wait_for_the_model_warm_up(tmp_path, tiny_cross_encoder):
    """Lists, status, /health and a service's validation error answer while the warm-up is still loading the
    reranker (a hub download the test holds open: the warm-up state they see is "running" however fast the
    machine); a query waits for it and answers once the download ends. Issue 15: first calls waited 11-28 s."""
    import threading

    from mcp.shared.exceptions import MCPError

    from test_model_loading import DEFAULT_RERANKER, FakeHub

    release = threading.Event()
    hub = FakeHub(DEFAULT_RERANKER, tiny_cross_encoder, hold=release)
    hub_env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DOWNLOAD_TIMEOUT": "300",
               "HF_HUB_ETAG_TIMEOUT": "300"}
    try:
        with http_server(tmp_path, hub_env=hub_env, warmup="true") as url:
            async def flow(session: Any) -> dict[str, Any]:
                await session.list_tools()  # starts the warm-up at once
                seen = {}
                deadline = time.monotonic() + 120
                while not any(method == "GET" for method, _ in hub.requests):  # the warm-up is downloading
                    assert time.monotonic() < deadline, hub.requests
                    await anyio.sleep(0.05)
                listed = await session.call_tool("manage_collections", {"action": "list"})
                seen["list"] = listed.structured_content
                with pytest.raises(MCPError) as info:
                    await session.call_tool("manage_documents", {"action": "list", "collection": "no-such-one"})
                seen["error"] = info.value
                seen["status"] = (await session.call_tool("get_status", {})).structured_content
                seen["health"] = httpx.get(f"{url}/health", timeout=60).json()
                await session.call_tool("manage_collections", {"action": "create", "collection_name": "warm"})
                threading.Timer(2.0, release.set).start()  # the query below waits for the download's end
                found = await session.call_tool("query_knowledge_base", {"query": "anything", "collections": ["warm"]})
                seen["released_before_answer"] = release.is_set()
                seen["query"] = found.structured_content
                seen["after"] = (await session.call_tool("get_status", {})).structured_content
                return seen

            seen = anyio.run(_sdk_session, url, None, flow)
    finally:
        release.set()
        hub.stop()
    assert seen["list"]["collections"] == [] and seen["error"].code == -32002
    assert seen["status"]["warmup"] == "running", seen["status"]  # it did not wait for the model
    assert seen["health"]["status"] == "ok" and seen["health"]["store_kind"] == "embedded"
    assert seen["released_before_answer"] is True  # the query waited for the warm-up
    assert seen["query"]["results"] == [] and seen["after"]["warmup"] == "done"
    assert seen["after"]["embedding_loaded"] is True and seen["after"]["reranker_loaded"] is True


@pytest.mark.parametrize("settings, needle", [
    ({"host": "0.0.0.0"}, "without authentication"),
    ({"host": "0.0.0.0", "auth_type": "bearer"}, "needs at least one key"),
    ({"auth_type": "bearer", "api_keys": "x"}, "at least 16 characters"),
    ({"auth_type": "api-key", "api_keys": f"{TOKEN},short-key"}, "at least 16 characters"),
])
def test_unsafe_http_settings_refuse_to_start_with_a_config_error(tmp_path, settings, needle):
    proc = subprocess.run([sys.executable, "-m", "mcp_server"], cwd=Path.cwd(),
                          env=_env(tmp_path, port=str(free_port()), **settings), capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == b""
    error = json.loads(proc.stderr.decode().strip().splitlines()[-1])["error"]
    assert error["code"] == -32001 and error["type"] == "ConfigError" and needle in error["message"]


def test_loopback_detection():
    from research_agent.mcp.auth import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.com"))
