"""What a hostile web page, workspace or client cannot do to the server (DESIGN.md section 4, security rules).

Every test talks to a real server process: uvicorn on 127.0.0.1 with a free port, or `python mcp_server.py`
over stdio, driven by raw sockets, raw JSON-RPC or the `mcp` SDK's own clients.
"""

from __future__ import annotations

import json
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


def _raw_request(port: int, header_lines: list[str]) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("GET /health HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in header_lines)
                      + "Connection: close\r\n\r\n").encode())
        return sock.recv(200).split(b"\r\n")[0]


def test_duplicated_host_or_origin_headers_are_refused(tmp_path):
    """dup_host_origin.sh: the guard read the last of two Host headers, Starlette the first, so
    `Host: evil` + `Host: 127.0.0.1:P` passed. RFC 9112: a request with more than one Host gets 400."""
    with http_server(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1])
        own = f"Host: 127.0.0.1:{port}"
        assert _raw_request(port, [own]) == b"HTTP/1.1 200 OK"
        assert _raw_request(port, [f"Host: evil.example:{port}", own]).startswith(b"HTTP/1.1 400")
        assert _raw_request(port, [own, own]).startswith(b"HTTP/1.1 400")
        assert _raw_request(port, [own, "Origin: http://evil.example", f"Origin: http://127.0.0.1:{port}"]
                            ).startswith(b"HTTP/1.1 400")


def test_malformed_http_requests_get_a_short_coded_error_with_their_id(tmp_path):
    """http_malformed.sh: the SDK answered `"jsonrpc": "1.0"` or list params with id null, -32602 and
    pydantic's validation dump as the message; the same rules as stdio now apply (code, id, guidance)."""
    with http_server(tmp_path) as url:
        sid = _session_id(url)
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                   "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
        cases = {6: ({"jsonrpc": "1.0", "id": 6, "method": "ping"}, -32600),
                 7: ({"jsonrpc": "2.0", "id": 7, "method": "ping", "params": [1]}, -32602),
                 8: ({"jsonrpc": "2.0", "id": 8, "method": 5}, -32600)}
        for request_id, (body, code) in cases.items():
            reply = httpx.post(f"{url}/mcp", headers=headers, json=body, timeout=30)
            assert reply.status_code == 400, reply.text
            error = reply.json()
            assert error["id"] == request_id and error["error"]["code"] == code, error
            assert "pydantic" not in error["error"]["message"] and len(error["error"]["message"]) < 300, error
            assert error["error"]["data"]["guidance"], error
        broken = httpx.post(f"{url}/mcp", headers=headers, content=b'{"jsonrpc": "2.0", "id": 9, ', timeout=30)
        assert broken.status_code == 400 and broken.json()["error"]["code"] == -32700, broken.text
        assert _ping(url, sid) == 200


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


@pytest.mark.parametrize("dotenv, setting", [
    ("RESEARCH_AGENT_FUSION_METHOD=rrf\nRESEARCH_AGENT_RRF_K=-1\n", "RESEARCH_AGENT_RRF_K"),
    ("RESEARCH_AGENT_LOG_LEVEL=BOGUS\n", "RESEARCH_AGENT_LOG_LEVEL"),
])
def test_a_workspace_dotenv_with_nonsense_values_is_a_config_error(tmp_path, dotenv, setting):
    """workspace_env_dos.sh: knobs a workspace .env may set broke every hybrid query (RRF_K=-1) or killed the
    server with a raw traceback (LOG_LEVEL=BOGUS); now the server refuses them like any bad setting."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / ".env").write_text(dotenv)
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}) + "\n"
    proc = subprocess.run([sys.executable, str(SERVER)], cwd=workspace, env=_mcp_env(tmp_path), input=init.encode(),
                          capture_output=True, timeout=60)
    stderr = proc.stderr.decode()
    assert proc.returncode == 3, stderr
    assert "Traceback" not in stderr, stderr
    error = json.loads(stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == -32001 and setting in error["message"], error


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

        assert anyio.run(_sdk_session, url, None, flow) == {"collections": [], "total": 0, "next_cursor": None}


def _open_event_stream(port: int, session_id: str) -> socket.socket:
    """A raw `GET /mcp` event stream held open (what session_lockout.py does once per session)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall((f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
                  f"Mcp-Session-Id: {session_id}\r\nMcp-Protocol-Version: 2025-06-18\r\n\r\n").encode())
    assert sock.recv(200).startswith(b"HTTP/1.1 200"), "the event stream did not open"
    return sock


def test_open_event_streams_cannot_lock_out_new_clients(tmp_path):
    """session_lockout.py: a session holding an open GET stream but making no request is idle; at the cap the
    one with the least recent request ends (its stream closes, its next request gets 404) and a newcomer is
    served instead of getting 503 for as long as the streams stay open."""
    with http_server(tmp_path, max_http_sessions="3") as url:
        port = int(url.rsplit(":", 1)[1])
        held = []
        try:
            for _ in range(3):
                sid = _session_id(url)
                assert _ping(url, sid, "notifications/initialized") == 202
                held.append((sid, _open_event_stream(port, sid)))
            for _ in range(3):  # three newcomers, each at the cap
                newcomer = _post_init(url)
                assert newcomer.status_code == 200, newcomer.text
                assert _ping(url, newcomer.headers["mcp-session-id"]) == 200
            for sid, sock in held:  # every flooding session ended, its stream closed by the server
                assert _ping(url, sid) == 404
                sock.settimeout(30)
                while sock.recv(4096):
                    pass
        finally:
            for _, sock in held:
                sock.close()


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


def _closed_by_server(sock: socket.socket, deadline: float, trickle: bytes = b"") -> bool:
    """Keep sending `trickle` every 0.5 s until the server closes the socket (True) or `deadline` passes."""
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:  # reset or broken pipe: closed by the server
            return True
    return False


def test_a_slowly_sent_body_is_cut_off_at_the_body_timeout(tmp_path):
    """slow_body_fd_exhaustion.sh: complete headers, then the body a byte at a time; such sockets were never
    closed, so enough of them used up the server's file descriptors."""
    with http_server(tmp_path, http_body_timeout="3") as url:
        port = int(url.rsplit(":", 1)[1])
        head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Length: 1000000\r\n\r\n{").encode()
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        try:
            for sock in slow:
                sock.sendall(head)
            assert _post_init(url).status_code == 200
            deadline = time.monotonic() + 30
            assert all(_closed_by_server(sock, deadline, trickle=b" ") for sock in slow), "a slow body outlived 30 s"
            assert _post_init(url).status_code == 200  # an ordinary request is untouched by the deadline
        finally:
            for sock in slow:
                sock.close()


def test_running_out_of_file_descriptors_logs_a_bounded_amount(tmp_path):
    """At the descriptor limit asyncio retried accept() in a loop and logged each failure with a traceback:
    200 MB of stderr in 40 s. The server must log that condition a bounded number of times and recover."""
    import resource

    port, log_path = free_port(), tmp_path / "fd.log"
    env = {**_http_env(tmp_path, port), "RESEARCH_AGENT_HTTP_HEADER_TIMEOUT": "60"}
    with open(log_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(SERVER)], cwd=Path.cwd(), env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128)))
        socks: list[socket.socket] = []
        try:
            _wait_for_health(proc, port, log_path)
            for _ in range(200):  # silent sockets held past the limit (the header timeout is 60 s here)
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(5)
            for sock in socks:
                sock.close()
            socks.clear()
            _wait_for_health(proc, port, log_path)  # recovers once descriptors are free again
        finally:
            for sock in socks:
                sock.close()
            proc.terminate()
            proc.wait(timeout=30)
    text = log_path.read_text(errors="replace")
    assert 1 <= text.count("Too many open files") <= 10, (text.count("Too many open files"), text[-2000:])


def _http_env(tmp_path: Path, port: int) -> dict[str, str]:
    from test_mcp_http import _env

    return _env(tmp_path, port=str(port))


def _wait_for_health(proc: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"no /health within 60 s:\n{log_path.read_text()[-3000:]}"
        time.sleep(0.3)


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


def _stdio_session(tmp_path: Path) -> _McpStdioSession:
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    s.request(1, "initialize", INIT)
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return s


def test_a_deeply_nested_line_gets_an_error_reply_and_the_server_keeps_serving(tmp_path):
    """stdio_nested_crash.sh: 5,000 nested arrays made json.loads raise RecursionError in the reader, which
    ended the process (exit 1) without a reply to that request or any later one."""
    s = _stdio_session(tmp_path)
    try:
        nested = "[" * 5000 + "]" * 5000
        for request_id, line in ((2, '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_status",'
                                     f'"arguments":{nested}}}}}'),
                                 (3, f'{{"jsonrpc":"2.0","params":{{"a":{nested}}},"method":"ping","id":3}}'),
                                 (None, '{"jsonrpc":"2.0","id":' + nested + ',"method":"ping"}')):
            s.proc.stdin.write(line.encode() + b"\n")
            s.proc.stdin.flush()
            reply = s.response(request_id, timeout=30)
            assert reply["error"]["code"] in (-32700, -32600), reply
            assert reply["error"]["data"]["guidance"], reply
        assert s.request(4, "ping")["result"] == {}
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_a_deeply_nested_first_line_is_answered_without_a_traceback(tmp_path):
    """The first line is read by the early-handshake thread before the SDK runs (research_agent/mcp/stdio.py)."""
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    try:
        s.proc.stdin.write(('{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + "[" * 5000 + "]" * 5000
                            + "}\n").encode())
        s.proc.stdin.flush()
        assert s.response(1, timeout=30)["error"]["code"] == -32600
        assert s.request(2, "initialize", INIT)["result"]["serverInfo"]["name"] == "research-agent"
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert "Traceback" not in s.stderr(), s.stderr()


def test_a_request_with_an_id_of_the_wrong_type_gets_invalid_request(tmp_path):
    """stdio_bad_id.sh: the SDK reads a request whose id is a float, bool or object as a notification and never
    answers it; JSON-RPC wants -32600 with id null (the id cannot be echoed)."""
    s = _stdio_session(tmp_path)
    try:
        for bad_id in (1.5, True, {"a": 1}, [1]):
            s.send({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
            reply = s.response(None, timeout=30)
            assert reply["error"]["code"] == -32600 and "id" in reply["error"]["message"], reply
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}})
        assert s.request(9, "ping")["result"] == {}  # a real notification still gets no reply
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert [json.loads(line).get("id") for line in s.lines] == [1, None, None, None, None, 9]


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
                "params": {"name": "manage_collections",
                           "arguments": {"action": "create", "collection_name": "waits"}}})
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
            return (
                await client.call_tool("ingest_documents", {"path": "notes", "collection": "rec"})
            ).structured_content

    report = anyio.run(main)
    assert sorted(report["documents"]) == ["notes/deep/a.md", "notes/top.md"], report
