"""The real server process over stdio, spoken to in raw newline-delimited JSON-RPC (what Cursor and Claude do)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "mcp_server.py"
HEAVY = ("torch", "sentence_transformers", "transformers", "chromadb", "FlagEmbedding")


def _mcp_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(RESEARCH_AGENT_STORE=str(tmp_path / "store"), HF_HUB_OFFLINE="1",
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
               PYTHONUNBUFFERED="1")
    return env


class _McpStdioSession:
    """A server subprocess; stdout lines are collected by a thread so reads can time out."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.stderr_path = cwd / "server-stderr.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self.lines: list[bytes] = []
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def send(self, message: dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def response(self, request_id: int, timeout: float = 60.0) -> dict[str, Any]:
        """The response to `request_id` (notifications in between are skipped but kept in self.lines)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no response to {request_id} within {timeout} s; stderr:\n{self.stderr()}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"server closed stdout before answering {request_id}; stderr:\n{self.stderr()}")
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    def request(self, request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        return self.response(request_id)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> int:
        # Close stdin only after every response was read: a call still running when stdin closes is dropped.
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=5)
        self._stderr.close()
        return code


@pytest.fixture
def _mcp_session(tmp_path):
    session = _McpStdioSession(tmp_path, _mcp_env(tmp_path))
    yield session
    if session.proc.poll() is None:
        session.proc.kill()
        session.proc.wait()


def test_stdio_handshake_tools_and_json_rpc_errors(_mcp_session):
    s = _mcp_session
    started = time.monotonic()
    init = s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw-test", "version": "0"}})
    handshake = time.monotonic() - started
    assert init["result"]["serverInfo"]["name"] == "research-agent"
    assert "tools" in init["result"]["capabilities"]
    # Measured about 1.5 s here (interpreter start + fastmcp import); torch must not be on this path.
    assert handshake < 10, f"initialize took {handshake:.1f} s"
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    tools = s.request(2, "tools/list")["result"]["tools"]
    assert {t["name"] for t in tools} == {"query_knowledge_base", "manage_collections", "manage_projects",
                                          "ingest_documents", "augment_knowledge", "manage_documents", "get_status"}

    created = s.request(3, "tools/call", {"name": "manage_collections",
                                          "arguments": {"action": "create", "collection_name": "wire-test"}})
    assert created["result"]["isError"] is False
    assert created["result"]["structuredContent"]["name"] == "wire-test"

    missing = s.request(4, "tools/call", {"name": "manage_collections",
                                          "arguments": {"action": "info", "collection_name": "no-such"}})
    assert "result" not in missing
    assert missing["error"]["code"] == -32002
    assert "no-such" in missing["error"]["message"]
    assert missing["error"]["data"]["type"] == "CollectionError" and missing["error"]["data"]["guidance"]

    outside = s.request(5, "tools/call", {"name": "ingest_documents",
                                          "arguments": {"path": "/etc/hostname", "collection": "wire-test"}})
    assert outside["error"]["code"] == -32003 and outside["error"]["data"]["type"] == "DocumentError"

    empty = s.request(6, "tools/call", {"name": "query_knowledge_base", "arguments": {"query": " "}})
    assert empty["error"]["code"] == -32004

    # The SDK's own answer to an unknown tool stays as FastMCP makes it.
    unknown = s.request(7, "tools/call", {"name": "no_such_tool", "arguments": {}})
    assert unknown.get("error") or unknown["result"]["isError"] is True

    assert s.close() == 0
    assert s.lines, "no output"
    for line in s.lines:  # nothing but JSON-RPC 2.0 on stdout: no banner, no print, no progress bar
        message = json.loads(line)
        assert message["jsonrpc"] == "2.0", line


def test_bad_settings_fail_before_serving_with_a_config_error(tmp_path):
    env = _mcp_env(tmp_path)
    env["RESEARCH_AGENT_CHROMA_PORT"] = "not-a-port"
    proc = subprocess.run([sys.executable, str(SERVER)], cwd=tmp_path, env=env, input=b"", capture_output=True,
                          timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == b""
    error = json.loads(proc.stderr.decode().strip().splitlines()[-1])["error"]
    assert error["code"] == -32001 and "chroma_port" in error["message"]


def test_importing_the_server_loads_no_heavy_libraries(tmp_path):
    code = ("import sys, time; t = time.perf_counter(); import mcp_server; "
            "print(round(time.perf_counter() - t, 2)); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_mcp_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seconds, loaded = proc.stdout.strip().splitlines()
    assert loaded == "[]", f"heavy imports at import time: {loaded}"
    assert float(seconds) < 8


def _mcp_free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_streamable_http_transport_serves_tools_and_errors_at_mcp(tmp_path):
    import socket

    import anyio
    from fastmcp import Client
    from mcp.shared.exceptions import MCPError

    port = _mcp_free_port()
    env = _mcp_env(tmp_path)
    env.update(RESEARCH_AGENT_TRANSPORT="http", RESEARCH_AGENT_PORT=str(port), RESEARCH_AGENT_WARMUP="false")
    with open(tmp_path / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "mcp_server"], cwd=tmp_path,
                                env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=stderr)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()
                    time.sleep(0.1)

            async def session() -> None:
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    assert len(await client.list_tools()) == 7
                    created = await client.call_tool("manage_collections",
                                                     {"action": "create", "collection_name": "http-test"})
                    assert created.structured_content["name"] == "http-test"
                    with pytest.raises(MCPError) as info:
                        await client.call_tool("manage_collections", {"action": "info", "collection_name": "nope"})
                    assert info.value.code == -32002 and info.value.data["guidance"]

            anyio.run(session)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=20)
    assert out == b""  # even over HTTP nothing is printed on stdout
