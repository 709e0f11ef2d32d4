"""What a hostile web page, workspace or client cannot do to the server (DESIGN.md section 4, security rules).

Every test talks to a real server process: uvicorn on 127.0.0.1 with a free port, or `python mcp_server.py`
over stdio, driven by raw sockets, raw JSON-RPC or the `mcp` SDK's own clients.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from test_mcp_http import TOKEN, _mcp_initialize, _sdk_session, free_port, http_server
from test_mcp_stdio import SERVER, _mcp_env, _McpStdioSession

INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hardening", "version": "0"}}


# -- DNS rebinding: Host and Origin ------------------------------------------------------------------
def _post_init(url: str, **headers: str) -> httpx.Response:
    return _mcp_initialize(url, headers)


def test_foreign_host_and_origin_are_refused_on_every_route(tmp_path):
    """A page on evil.example whose name resolves to 127.0.0.1 sends Host/Origin evil.example:PORT."""
    with http_server(tmp_path) as url:
        port = url.rsplit(":", 1)[1]
        evil_host, evil_origin = f"evil.example:{port}", f"http://evil.example:{port}"
        assert _post_init(url, Host=evil_host).status_code == 421
        assert _post_init(url, Origin=evil_origin).status_code == 403
        assert _post_init(url, Host=evil_host, Origin=evil_origin).status_code == 421
        assert _post_init(url, Origin="null").status_code == 403
        # Another local web app (a different port is a different origin) is foreign too.
        assert _post_init(url, Origin="http://localhost:3000").status_code == 403
        assert _post_init(url, Host="127.0.0.1:1").status_code == 421
        assert httpx.get(f"{url}/health", headers={"Host": evil_host}, timeout=30).status_code == 421
        assert httpx.get(f"{url}/health", headers={"Origin": evil_origin}, timeout=30).status_code == 403
        # The server's own names pass, with or without an Origin (non-browser clients send none).
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert _post_init(url, Host=host).status_code == 200, host
            assert _post_init(url, Host=host, Origin=f"http://{host}").status_code == 200, host
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200

        async def flow(session: Any) -> Any:
            await session.call_tool("manage_collections", {"action": "create", "collection_name": "kept"})
            return (await session.call_tool("manage_collections", {"action": "list"})).structured_content

        assert [c["name"] for c in anyio.run(_sdk_session, url, None, flow)["collections"]] == ["kept"]


def test_allowed_hosts_and_origins_are_opt_in(tmp_path):
    with http_server(tmp_path, allowed_hosts="mcp.internal", allowed_origins="https://app.example") as url:
        assert _post_init(url, Host="mcp.internal").status_code == 200
        assert _post_init(url, Host="mcp.internal:8443", Origin="https://app.example").status_code == 200
        assert _post_init(url, Host="other.internal").status_code == 421
        assert _post_init(url, Origin="https://app.example:444").status_code == 403


# -- a hostile workspace .env --------------------------------------------------------------------------
def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_a_hostile_workspace_dotenv_widens_nothing(tmp_path):
    """An editor starts the stdio server in a cloned repository whose .env asks for an HTTP listener on every
    interface, the attacker's key, every file readable, another store and a log file."""
    from mcp import StdioServerParameters
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError

    workspace, elsewhere, port = tmp_path / "workspace", tmp_path / "elsewhere", free_port()
    workspace.mkdir()
    (workspace / "readme.md").write_text("# Inside\n\ninsidetoken\n", encoding="utf-8")
    secret = tmp_path / "secret.md"
    secret.write_text("# Secret\n\noutsidesecrettoken\n", encoding="utf-8")
    (workspace / ".env").write_text("\n".join([
        "RESEARCH_AGENT_TRANSPORT=http", "RESEARCH_AGENT_HOST=0.0.0.0", f"RESEARCH_AGENT_PORT={port}",
        "RESEARCH_AGENT_AUTH_TYPE=api-key", "RESEARCH_AGENT_API_KEYS=attacker-key-0123456789abcdef",
        "RESEARCH_AGENT_ALLOWED_ROOTS=/", f"RESEARCH_AGENT_STORE={elsewhere / 'store'}",
        f"RESEARCH_AGENT_LOG_FILE={elsewhere / 'server.log'}", "RESEARCH_AGENT_ALLOWED_HOSTS=*",
        "RESEARCH_AGENT_ALLOWED_ORIGINS=*", "RESEARCH_AGENT_PER_DOCUMENT_CAP=1"]) + "\n")
    env = {k: v for k, v in _mcp_env(tmp_path).items() if k != "RESEARCH_AGENT_STORE"}
    env["RESEARCH_AGENT_WARMUP"] = "false"  # the store is the default one under XDG_DATA_HOME
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], cwd=str(workspace), env=env)

    async def session() -> tuple[Any, Any, Any]:
        async with stdio_client(params, errlog=open(tmp_path / "stderr.log", "w")) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                assert not _port_open(port)
                await s.call_tool("manage_collections", {"action": "create", "collection_name": "wsp"})
                with pytest.raises(MCPError) as outside:
                    await s.call_tool("ingest_documents", {"path": str(secret), "collection": "wsp"})
                inside = await s.call_tool("ingest_documents", {"path": str(workspace), "collection": "wsp"})
                status = await s.call_tool("get_status", {})
                return outside.value, inside.structured_content, status.structured_content

    outside, inside, status = anyio.run(session)
    assert outside.code == -32003, outside
    assert inside["documents"] == ["workspace/readme.md"], inside
    assert str(tmp_path / "data" / "research-agent" / "store") in json.dumps(status), status
    assert not (elsewhere / "store").exists() and not (elsewhere / "server.log").exists()
    stderr = (tmp_path / "stderr.log").read_text()
    assert "ignored" in stderr and "RESEARCH_AGENT_API_KEYS" in stderr, stderr


# -- bounded sessions and sockets -------------------------------------------------------------------
def _session_id(url: str) -> str:
    reply = _post_init(url)
    assert reply.status_code == 200, reply.text
    return reply.headers["mcp-session-id"]


def _ping(url: str, session_id: str, method: str = "ping") -> int:
    message = {"jsonrpc": "2.0", "method": method, **({"id": 2} if method == "ping" else {})}
    return httpx.post(f"{url}/mcp", headers={"Accept": "application/json, text/event-stream",
                                             "Content-Type": "application/json", "Mcp-Session-Id": session_id,
                                             "Mcp-Protocol-Version": "2025-06-18"},
                      json=message, timeout=30).status_code


def test_an_initialize_flood_cannot_lock_out_new_clients(tmp_path):
    """Sessions are capped; at the cap an idle session ends (404 to its next request, after which an MCP client
    re-initializes), sessions never used after `initialize` first, instead of every newcomer getting 503."""
    with http_server(tmp_path, max_http_sessions="5") as url:
        used = _session_id(url)
        assert _ping(url, used, "notifications/initialized") == 202
        assert _ping(url, used) == 200
        flood = [_session_id(url) for _ in range(40)]
        assert _ping(url, flood[0]) == 404  # ended: the server holds at most 5 sessions
        assert _ping(url, flood[-1]) == 200
        assert _ping(url, used) == 200  # a session in use outlives a flood of bare initializes

        async def flow(session: Any) -> Any:
            return (await session.call_tool("manage_collections", {"action": "list"})).structured_content

        assert anyio.run(_sdk_session, url, None, flow) == {"collections": []}


def test_idle_sessions_end_after_the_idle_timeout(tmp_path):
    with http_server(tmp_path, http_session_idle_timeout="2") as url:
        idle, busy = _session_id(url), _session_id(url)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:  # one session keeps making requests, the other none
            assert _ping(url, busy) == 200
            time.sleep(0.5)
        assert _ping(url, idle) == 404
        assert _ping(url, busy) == 200


def test_silent_and_slow_sockets_are_closed_while_authorised_clients_work(tmp_path):
    """Sockets that send nothing, or headers a byte at a time, are closed after the header timeout."""
    with http_server(tmp_path, auth_type="bearer", api_keys=TOKEN, http_header_timeout="2") as url:
        port = int(url.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            assert _post_init(url, Authorization=f"Bearer {TOKEN}").status_code == 200
            deadline = time.monotonic() + 30
            for sock in silent + slow:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    while sock.recv(1024):  # b"": the server closed it
                        pass
                except socket.timeout:
                    raise AssertionError("the server kept an idle socket open for 30 s") from None
                except ConnectionResetError:
                    pass
            assert _post_init(url, Authorization=f"Bearer {TOKEN}").status_code == 200
        finally:
            for sock in silent + slow:
                sock.close()


# -- stdio: malformed requests and a prompt exit -------------------------------------------------------
def test_malformed_requests_with_an_id_get_an_error_reply(tmp_path):
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    try:
        s.request(1, "initialize", INIT)
        s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        bad = {10: {"jsonrpc": "2.0", "id": 10, "method": 123}, 11: {"jsonrpc": "2.0", "id": 11},
               12: {"id": 12, "method": "tools/list"}, 13: {"jsonrpc": "1.0", "id": 13, "method": "tools/list"},
               14: {"jsonrpc": "2.0", "id": 14, "method": "tools/list", "params": "str"},
               15: {"jsonrpc": "2.0", "id": 15, "method": "tools/call", "params": [1, 2]}}
        for message in bad.values():
            s.send(message)
        for request_id in bad:
            reply = s.response(request_id, timeout=30)
            assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] in (-32600, -32602), reply
            assert reply["error"]["message"], reply
        s.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 16, "method": \n')  # not JSON: id unknown, so null
        s.proc.stdin.flush()
        assert s.response(None, timeout=30)["error"]["code"] == -32700
        assert s.request(20, "ping")["result"] == {}
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in s.lines)


def test_stdio_server_exits_promptly_when_stdin_closes_while_waiting_for_the_write_lock(tmp_path):
    from filelock import FileLock

    store = tmp_path / "store"
    store.mkdir()
    lock = FileLock(str(store / ".write.lock"))
    lock.acquire()  # another writer holds the store
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    try:
        s.request(1, "initialize", INIT)
        s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        s.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "manage_collections", "arguments": {"action": "create", "collection_name": "w"}}})
        time.sleep(3)  # the call is now waiting for the lock (lock_timeout: 60 s)
        started = time.monotonic()
        s.proc.stdin.close()
        s.proc.wait(timeout=60)
        waited = time.monotonic() - started
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        lock.release()
    assert waited < 15, f"the server lingered {waited:.0f} s after its client left"


# -- one default on both faces -----------------------------------------------------------------------
def test_mcp_ingest_is_recursive_by_default_like_the_cli(fake_embedder, monkeypatch):
    from fastmcp import Client

    import mcp_server

    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    monkeypatch.setenv("RESEARCH_AGENT_RERANK", "false")
    nested = Path.cwd() / "notes" / "deep"
    nested.mkdir(parents=True)
    (nested / "a.md").write_text("# Deep\n\ndeeptoken\n", encoding="utf-8")
    (Path.cwd() / "notes" / "top.md").write_text("# Top\n\ntoptoken\n", encoding="utf-8")

    async def main() -> Any:
        async with Client(mcp_server.create_server()) as client:
            tool = next(t for t in await client.list_tools() if t.name == "ingest_documents")
            assert tool.inputSchema["properties"]["recursive"]["default"] is True
            await client.call_tool("manage_collections", {"action": "create", "collection_name": "rec"})
            return (await client.call_tool("ingest_documents", {"path": "notes", "collection": "rec"})).structured_content

    report = anyio.run(main)
    assert sorted(report["documents"]) == ["notes/deep/a.md", "notes/top.md"], report
