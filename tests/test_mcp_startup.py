"""Issue 16: the stdio server is ready when the client is. The front (research_agent/mcp/stdio.py) answers
`initialize` and then tools/list, prompts/list, resources/list and resources/templates/list from the SDK's own
bytes (research_agent/mcp/early.py) while FastMCP loads; everything else waits, in order, for the server.

Real subprocesses over real stdio throughout; the timings live in benchmarks/handshake.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from research_agent.mcp import early
from test_mcp_stdio import ROOT, SERVER, _mcp_env, _McpStdioSession

LISTS = early.LIST_METHODS
HELLO = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "startup-test", "version": "0"}}
# Only the front: it claims stdio and answers what it can; no server is ever imported or run. What the process
# prints meanwhile (as an import might) must not reach the wire.
FRONT_ONLY = ("from research_agent.mcp.stdio import start_early; start_early(); "
              "import os, time; print('noise from an import', flush=True); os.write(1, b'raw noise\\n'); "
              "time.sleep(120)")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _session(tmp_path: Path, command: list[str] | None = None) -> _McpStdioSession:
    return _McpStdioSession(ROOT, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"}, command)


def _stop(s: _McpStdioSession) -> None:
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()
    s._reader.join(timeout=10)


def _request(request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    return message if params is None else {**message, "params": params}


def _send_all(s: _McpStdioSession, messages: list[dict[str, Any]]) -> None:
    """Everything in one write, right after spawn: what a client does that does not wait between messages."""
    s.proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
    s.proc.stdin.flush()


def _raw_lines(s: _McpStdioSession) -> dict[Any, bytes]:
    """Each response's exact line by id (every stdout line must be JSON-RPC 2.0: nothing else is on the wire)."""
    by_id: dict[Any, bytes] = {}
    for line in s.lines:
        message = json.loads(line)
        assert message["jsonrpc"] == "2.0", line
        if "id" in message:
            assert message["id"] not in by_id, f"answered twice: {line[:200]!r}"
            by_id[message["id"]] = line.rstrip(b"\n")
    return by_id


def _wait_for(s: _McpStdioSession, *ids: int) -> list[dict[str, Any]]:
    """The responses to `ids`, whatever order they come in (the session's own `response` skips other ids)."""
    deadline = time.monotonic() + 120  # a bound against a hang, not a timing goal
    while True:
        found = {m.get("id"): m for m in map(json.loads, list(s.lines))}
        if all(i in found for i in ids):
            return [found[i] for i in ids]
        assert time.monotonic() < deadline and s.proc.poll() is None, s.stderr()
        time.sleep(0.05)


def _without_id(line: bytes, request_id: int) -> bytes:
    head = b'{"jsonrpc":"2.0","id":%d,' % request_id
    assert line.startswith(head), line[:100]
    return line[len(head):]


def test_the_snapshot_is_what_the_live_server_answers():
    """The stored lists are the SDK's bytes for every protocol version; a tool, resource or prompt changed without
    regenerating fails here (the running server would also log it and send list_changed)."""
    stored, live = early.stored_answers(), early.live_answers()
    assert stored is not None, f"no snapshot: run {early.REGENERATE}"
    stale = sorted(f"{version} {method}" for version in live for method in live[version]
                   if stored.get(version, {}).get(method) != live[version][method])
    assert not stale and stored.keys() == live.keys(), (
        f"research_agent/mcp/early_lists.py is stale ({', '.join(stale) or 'protocol versions'}): run "
        f"{early.REGENERATE} (or python scripts/gen_mcp_docs.py) and commit the result")


def test_the_front_alone_answers_initialize_and_every_list_and_nothing_else(tmp_path):
    """No server at all: the front answers the handshake and the four lists with the snapshot's bytes, and leaves
    a tool call, a paged list and anything before `initialize` to the server (here: never answered)."""
    s = _session(tmp_path, [sys.executable, "-c", FRONT_ONLY])
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      *(_request(i, m) for i, m in enumerate(LISTS, 2)),
                      _request(6, "tools/call", {"name": "get_status", "arguments": {}}),
                      _request(7, "tools/list", {"cursor": "x"}), _request(8, "prompts/list", {"_meta": {}})])
        for request_id in (1, 2, 3, 4, 5, 8):
            s.response(request_id)
    finally:
        _stop(s)
    lines = _raw_lines(s)
    assert sorted(lines) == [1, 2, 3, 4, 5, 8], sorted(lines)
    stored = early.stored_answers()["2025-06-18"]
    for request_id, method in [*enumerate(LISTS, 2), (8, "prompts/list")]:
        assert lines[request_id] == b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (request_id,
                                                                                 stored[method].encode())


def test_lists_sent_with_the_handshake_are_byte_identical_to_the_servers_later_answers(tmp_path):
    """Over the real server: everything sent at once right after spawn is answered once each, the early lists
    equal (byte for byte, but for the id) the SDK's answers to the same lists after the server is up, the tool
    call queued behind them is answered correctly, and stdout carries only JSON-RPC."""
    s = _session(tmp_path)
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      *(_request(i, m) for i, m in enumerate(LISTS, 2)),
                      _request(6, "tools/call", {"name": "manage_collections",
                                                 "arguments": {"action": "create", "collection_name": "early"}}),
                      _request(7, "tools/call", {"name": "get_status", "arguments": {}})])
        created, status = _wait_for(s, 6, 7)  # the calls run concurrently, as ever: either may finish first
        assert created["result"]["isError"] is False and created["result"]["structuredContent"]["name"] == "early"
        assert status["result"]["structuredContent"]["version"]
        later = [s.request(i, m) for i, m in enumerate(LISTS, 12)]  # the server is serving: the SDK answers
        assert all("result" in answer for answer in later)
        assert s.close() == 0
    finally:
        _stop(s)
    lines = _raw_lines(s)
    assert sorted(lines) == [1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    for i in range(4):
        assert _without_id(lines[2 + i], 2 + i) == _without_id(lines[12 + i], 12 + i), LISTS[i]
    assert len(s.lines) == len(lines), "a notification was sent (list_changed: the early answer was stale)"
    assert "differs" not in s.stderr(), s.stderr()


def test_lists_the_server_refuses_are_still_refused(tmp_path):
    """The front answers a list only after an `initialize` it answered itself: a list before `initialize`, or
    after one the SDK rejects, gets the SDK's refusal as before."""
    s = _session(tmp_path)
    try:
        _send_all(s, [_request(1, "tools/list"), _request(2, "initialize", {"protocolVersion": "2025-06-18"}),
                      _request(3, "prompts/list")])
        assert [s.response(i)["error"]["code"] for i in (1, 2, 3)] == [-32602] * 3
        assert s.request(4, "initialize", HELLO)["result"]["serverInfo"]["name"] == "research-agent"
        assert "tools" in s.request(5, "tools/list")["result"]
        assert s.close() == 0
    finally:
        _stop(s)
    assert sorted(_raw_lines(s)) == [1, 2, 3, 4, 5]


def test_a_stale_snapshot_is_logged_and_the_client_told_to_list_again(tmp_path):
    """A snapshot that no longer matches the server (here: one claiming no tools) still answers early, but the
    SDK's own answer shows the difference: it is logged and `notifications/tools/list_changed` follows, so the
    client lists again and gets the server's tools."""
    tampered = ("import research_agent.mcp.early_lists as e, runpy, sys; e.RESULTS += ('{\"tools\":[]}',); "
                "[by_method.update({'tools/list': len(e.RESULTS) - 1}) for by_method in e.ANSWERS.values()]; "
                f"sys.argv = [{str(SERVER)!r}]; runpy.run_path({str(SERVER)!r}, run_name='__main__')")
    s = _session(tmp_path, [sys.executable, "-c", tampered])
    try:
        _send_all(s, [_request(1, "initialize", HELLO), _request(2, "tools/list")])
        assert s.response(2)["result"] == {"tools": []}
        deadline = time.monotonic() + 60  # a bound against a hang, not a timing goal
        while not any(b"notifications/tools/list_changed" in line for line in s.lines):
            assert time.monotonic() < deadline and s.proc.poll() is None, s.stderr()
            time.sleep(0.05)
        assert len(s.request(3, "tools/list")["result"]["tools"]) == len(json.loads(
            early.stored_answers()["2025-06-18"]["tools/list"])["tools"])
        assert s.close() == 0
    finally:
        _stop(s)
    assert "early tools/list answer differs from the SDK's" in s.stderr()
    assert early.REGENERATE in s.stderr()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_fastmcp_client_lists_the_live_surface_and_calls_a_tool_at_once(tmp_path, mode):
    """The real client over the real server process: its first lists, right after connecting, equal what the
    live server reports in-process (research_agent/mcp/surface.py), and a tool call that follows works.
    "legacy" is the `initialize` handshake editors use (lists answered by the front); "auto" is a 2026-era
    client (`server/discover`, per-request `_meta`), which the front leaves entirely to the server."""
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    from research_agent.mcp.surface import _wire, live_surface

    env = {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false"}
    transport = StdioTransport(sys.executable, [str(SERVER)], env=env, cwd=str(ROOT))
    async with Client(transport, timeout=120, mode=mode) as client:
        got = {"tools": _wire(await client.list_tools_mcp(), "tools"),
               "prompts": _wire(await client.list_prompts_mcp(), "prompts"),
               "resources": _wire(await client.list_resources_mcp(), "resources"),
               "resource_templates": _wire(await client.list_resource_templates_mcp(), "resourceTemplates")}
        created = await client.call_tool("manage_collections", {"action": "create", "collection_name": "quick"})
    assert created.structured_content["name"] == "quick"
    live = await live_surface()
    assert got == {key: live[key] for key in got}


@pytest.mark.anyio
async def test_the_front_alone_serves_a_legacy_fastmcp_client_its_lists(tmp_path):
    """The editors' handshake through the real client, against the front only: initialize and all four lists
    are answered before (here: without) the server, as the snapshot holds them."""
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    transport = StdioTransport(sys.executable, ["-c", FRONT_ONLY], env=_mcp_env(tmp_path), cwd=str(ROOT))
    async with Client(transport, timeout=60, mode="legacy") as client:
        tools, prompts = await client.list_tools(), await client.list_prompts()
        resources, templates = await client.list_resources(), await client.list_resource_templates()
    stored = {m: json.loads(text) for m, text in early.stored_answers()["2025-11-25"].items()}
    assert [t.name for t in tools] == [t["name"] for t in stored["tools/list"]["tools"]]
    assert [p.name for p in prompts] == [p["name"] for p in stored["prompts/list"]["prompts"]]
    assert len(resources) == len(stored["resources/list"]["resources"]) > 0
    assert len(templates) == len(stored["resources/templates/list"]["resourceTemplates"]) > 0


@pytest.mark.parametrize("params, early_answer", [
    (None, True), ({}, True), ({"_meta": {}}, True), ({"_meta": {"progressToken": 7}}, True),
    ({"cursor": "abc"}, False), ({"_meta": {"progressToken": True}}, False), ({"_meta": []}, False),
    ({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}, False), ("text", False),
    ({"extra": 1}, False)])
def test_only_plain_list_requests_are_answered_early(params, early_answer):
    """A cursor, odd params or a malformed `_meta` go to the SDK, which pages, validates or refuses them."""
    from research_agent.mcp.early import plain_list_request

    message = _request(1, "tools/list", params)
    assert plain_list_request(message) is early_answer
    assert plain_list_request({**message, "method": "tools/call"}) is False


def _lines_when(s: _McpStdioSession, done: Any) -> list[dict[str, Any]]:
    """The messages on stdout once `done(messages)` holds (bounded against a hang, not a timing goal)."""
    deadline = time.monotonic() + 120
    while True:
        messages = [json.loads(line) for line in list(s.lines)]
        if done(messages):
            return messages
        assert time.monotonic() < deadline and s.proc.poll() is None, (messages, s.stderr()[-2000:])
        time.sleep(0.05)


def test_a_lone_surrogate_id_does_not_kill_the_front(tmp_path):
    """Outside tester (A4): `"id":"\\ud800"` on tools/list before the server was ready raised in the early
    thread, which died: nothing after it was answered and closing stdin did not end the process. Now the SDK
    answers that line (-32600), and the requests after it are answered."""
    s = _session(tmp_path)
    try:
        raw = (json.dumps(_request(1, "initialize", HELLO)) + "\n"
               + '{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
               + '{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}\n'
               + json.dumps(_request(3, "ping")) + "\n" + json.dumps(_request(4, "tools/list")) + "\n")
        s.proc.stdin.write(raw.encode())
        s.proc.stdin.flush()
        messages = _lines_when(s, lambda ms: {3, 4} <= {m.get("id") for m in ms})
        assert next(m for m in messages if m.get("id") == 4)["result"]["tools"]
        assert s.close() == 0
    finally:
        _stop(s)


def test_a_reused_id_is_answered_once_per_request_and_no_false_staleness(tmp_path):
    """Outside tester (A4): initialize id 1 then tools/list id 1 twice gave five answers with id 1 and a
    list_changed notification (the SDK's initialize answer was compared with an early tools/list answer)."""
    s = _session(tmp_path)
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      _request(1, "tools/list"), _request(1, "tools/list"), _request(9, "ping")])
        messages = _lines_when(s, lambda ms: any(m.get("id") == 9 for m in ms))
        time.sleep(1.0)  # anything still to come for id 1 would come right after the server's own answers
        messages = [json.loads(line) for line in list(s.lines)]
        assert sum(m.get("id") == 1 for m in messages) == 3, messages
        assert not [m for m in messages if str(m.get("method", "")).endswith("list_changed")], messages
    finally:
        _stop(s)


def test_a_line_the_sdk_cannot_parse_is_not_answered_early(tmp_path):
    """Outside tester (A4): an initialize line starting with a byte-order mark got a success answer from the
    front and a -32700 from the SDK for the same line. Now only the SDK answers it."""
    s = _session(tmp_path)
    try:
        s.proc.stdin.write(b"\xef\xbb\xbf" + json.dumps(_request(1, "initialize", HELLO)).encode() + b"\n"
                           + json.dumps(_request(2, "ping")).encode() + b"\n")
        s.proc.stdin.flush()
        messages = _lines_when(s, lambda ms: len(ms) >= 2)
        time.sleep(0.5)
        messages = [json.loads(line) for line in list(s.lines)]
        assert not [m for m in messages if m.get("id") == 1 and "result" in m], messages
    finally:
        _stop(s)
