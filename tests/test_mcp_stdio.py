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

from test_mcp import TOOLS

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

    def __init__(self, cwd: Path, env: dict[str, str], command: list[str] | None = None) -> None:
        # beside the test's store, never in the working directory (tests/test_mcp_startup.py runs from the repo root)
        self.stderr_path = Path(env.get("RESEARCH_AGENT_STORE", cwd / "store")).parent / "server-stderr.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(command or [sys.executable, str(SERVER)], cwd=cwd, env=env, stdin=subprocess.PIPE,
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
        if not self._stderr.closed:
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
    session = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    yield session
    if session.proc.poll() is None:
        session.proc.kill()
        session.proc.wait()


def test_stdio_handshake_tools_and_json_rpc_errors(_mcp_session):
    s = _mcp_session
    started = time.monotonic()
    init = s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw-test", "version": "0"}})
    assert init["result"]["serverInfo"]["name"] == "research-agent"
    assert {"tools", "resources", "prompts"} <= set(init["result"]["capabilities"])
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    tools = s.request(2, "tools/list")["result"]["tools"]
    handshake = time.monotonic() - started
    # About 1 s on an idle 2-core machine (see benchmarks/handshake.py); torch must not be on this path.
    assert handshake < 15, f"initialize + tools/list took {handshake:.1f} s"
    assert {t["name"] for t in tools} == TOOLS

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

    # Unknown tools, unknown actions, missing and mistyped arguments: -32602 with what to send instead.
    unknown = s.request(7, "tools/call", {"name": "no_such_tool", "arguments": {}})
    assert unknown["error"]["code"] == -32602 and "query_knowledge_base" in unknown["error"]["data"]["guidance"]
    action = s.request(8, "tools/call", {"name": "manage_documents", "arguments": {"action": "purge",
                                                                                  "collection": "wire-test"}})
    assert action["error"]["code"] == -32602 and "list, get, remove, reindex" in action["error"]["data"]["guidance"]
    missing = s.request(9, "tools/call", {"name": "ingest_documents", "arguments": {"path": "/tmp"}})
    assert missing["error"]["code"] == -32602 and "collection" in missing["error"]["message"]
    typed = s.request(10, "tools/call", {"name": "query_knowledge_base", "arguments": {"query": ["a", "list"]}})
    assert typed["error"]["code"] == -32602 and "query" in typed["error"]["message"]
    required = s.request(11, "tools/call", {"name": "manage_collections", "arguments": {"action": "info"}})
    assert required["error"]["code"] == -32602 and "collection_name" in required["error"]["message"]

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
    assert float(seconds) < 45  # a bound against a hang, not a timing goal (benchmarks/handshake.py has those)


@pytest.mark.parametrize("asked, negotiated", [("2024-11-05", "2024-11-05"), ("2025-11-25", "2025-11-25"),
                                                ("1999-01-01", "2025-11-25")])
def test_early_initialize_answer_is_the_sdks_own_and_sent_once(tmp_path, asked, negotiated):
    """The initialize answer comes from research_agent/mcp/stdio.py before FastMCP is imported; the SDK then
    answers the replayed request too, its answer is compared (a difference is logged) and dropped. The same
    holds for the tools/list after it (tests/test_mcp_startup.py has the details)."""
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    init = s.request(1, "initialize", {"protocolVersion": asked, "capabilities": {"roots": {"listChanged": True}},
                                       "clientInfo": {"name": "raw-test", "version": "0"}})
    assert init["result"]["protocolVersion"] == negotiated
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert {t["name"] for t in s.request(2, "tools/list")["result"]["tools"]} == TOOLS
    assert s.close() == 0
    # tools/list comes early too (research_agent/mcp/early.py); a list_changed notification here (id None) means
    # its snapshot is stale: python -m research_agent.mcp.early
    assert [json.loads(line).get("id") for line in s.lines] == [1, 2], s.stderr()
    assert "differs" not in s.stderr(), s.stderr()


def test_requests_the_early_answer_does_not_handle_reach_the_sdk(tmp_path):
    """Invalid initialize params, and a request before initialize, are answered by the SDK, once each."""
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    bad = s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})  # no clientInfo
    assert bad["error"]["code"] == -32602
    good = s.request(2, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw-test", "version": "0"}})
    assert good["result"]["serverInfo"]["name"] == "research-agent"
    assert s.close() == 0
    assert [json.loads(line).get("id") for line in s.lines] == [1, 2]

    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    assert s.request(1, "ping")["result"] == {}
    assert s.close() == 0


def test_the_early_handshake_module_imports_only_the_standard_library(tmp_path):
    code = (
        "import sys; import research_agent.mcp.stdio; "
        "print(sorted(m for m in ('pydantic', 'mcp', 'mcp_types', 'fastmcp', 'anyio', 'typer') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_mcp_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_no_file_turns_a_stdio_launch_into_a_listener(tmp_path):
    """The transport is the launch's choice (flag or environment): the user's own .env and config file saying
    http are ignored with a warning, and the server answers on stdio without binding a port."""
    import socket

    from test_mcp_http import free_port

    port = free_port()
    config = tmp_path / "config" / "research-agent"
    config.mkdir(parents=True)
    (config / ".env").write_text(f"RESEARCH_AGENT_TRANSPORT=http\nRESEARCH_AGENT_PORT={port}\n")
    (config / "config.yaml").write_text(f"transport: http\nport: {port}\n")
    s = _McpStdioSession(tmp_path, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"})
    try:
        _initialize(s)
        assert {t["name"] for t in s.request(2, "tools/list")["result"]["tools"]} == TOOLS
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert "never chooses the transport" in s.stderr()


def _initialize(s: _McpStdioSession) -> None:
    s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "raw-test", "version": "0"}})
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


def _call(s: _McpStdioSession, request_id: int, tool: str, timeout: float = 120, **arguments: Any) -> dict[str, Any]:
    s.send(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    )
    reply = s.response(request_id, timeout=timeout)
    assert "result" in reply and reply["result"]["isError"] is False, reply
    return reply["result"]["structuredContent"]


def test_real_models_warm_up_after_the_handshake_and_other_processes_writes_are_seen(tmp_path):
    """One long stdio session on the real embedding model: the warm-up loads it in the background with nothing
    on stdout, and a document that `research-agent kb add-document` adds from another process while the session
    is open is found by the session's next query."""
    env = _mcp_env(tmp_path)
    work = tmp_path / "work"  # the autouse fixture made it
    s = _McpStdioSession(work, env)
    try:
        _initialize(s)
        assert len(s.request(2, "tools/list")["result"]["tools"]) == len(TOOLS)  # starts the warm-up
        _call(s, 3, "manage_collections", action="create", collection_name="shared")
        deadline, status, request_id = time.monotonic() + 120, {}, 10
        while time.monotonic() < deadline:
            request_id += 1
            status = _call(s, request_id, "get_status")
            if status["warmup"] in ("done", "failed"):
                break
            time.sleep(0.5)
        assert status["warmup"] == "done" and status["embedding_loaded"] is True, status

        (work / "deploy.md").write_text("# Deploying\n\nThe blue-green deployment switches traffic with the "
                                        "zebracorn router after health checks pass.\n", encoding="utf-8")
        cli = Path(sys.executable).parent / "research-agent"
        done = subprocess.run([str(cli), "kb", "add-document", "deploy.md", "--collection", "shared"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr

        found = _call(s, 100, "query_knowledge_base", query="zebracorn router", collections=["shared"])
        assert found["results"] and found["results"][0]["source_document"] == "deploy.md"
        assert "zebracorn" in found["results"][0]["content"]
        assert s.close() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    for line in s.lines:  # model loading printed nothing on stdout: every line is JSON-RPC
        assert json.loads(line)["jsonrpc"] == "2.0", line


def test_on_the_wire_errors_carry_mcp_guidance_in_the_message_and_text_keeps_its_heading(_mcp_session):
    """Issue 15, over real stdio: some clients show only an error's message, so the guidance is in it too, naming
    the MCP tool call (never a `research-agent` command); a created collection's text is not headed "Projects"."""
    s = _mcp_session
    _initialize(s)
    created = s.request(2, "tools/call", {"name": "manage_collections",
                                          "arguments": {"action": "create", "collection_name": "wire-text"}})
    text = created["result"]["content"][0]["text"]
    assert text.startswith("## Manage collections") and "Projects (" not in text, text
    missing = s.request(3, "tools/call", {"name": "manage_collections",
                                          "arguments": {"action": "info", "collection_name": "no-such"}})
    error = missing["error"]
    assert error["code"] == -32002 and error["data"]["guidance"] in error["message"], error
    assert 'manage_collections(action="list")' in error["message"] and "research-agent " not in error["message"]
