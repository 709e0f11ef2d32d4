"""A launch whose settings are rejected only when they load (anything but the transport and port, which the early
front checks first: research_agent/mcp/launch.py) has already answered `initialize`; the requests its client sent
meanwhile then get the settings' error, -32001 with data.guidance naming the setting, before the process exits 3,
instead of a closed pipe. Real subprocesses over real stdio."""

from __future__ import annotations

import json

import pytest

from test_mcp_signals import ENTRIES
from test_mcp_startup import HELLO, _request, _send_all, _stop, _wait_for
from test_mcp_stdio import ROOT, _mcp_env, _McpStdioSession

BAD_SETTING = "RESEARCH_AGENT_LOG_LEVEL"  # rejected by the settings at load time, never by the front


@pytest.mark.parametrize("entry", [
    "mcp_server.py",
    "research-agent serve",
    "python -m research_agent serve",
])
def test_requests_sent_before_bad_settings_are_found_get_the_config_error(tmp_path, entry):
    env = {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false", BAD_SETTING: "LOUD"}
    s = _McpStdioSession(ROOT, env, ENTRIES[entry])
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      _request(2, "tools/list"),
                      _request(3, "tools/call", {"name": "list_collections", "arguments": {}}),
                      _request("four", "ping")])
        hello, tools, call, ping = _wait_for(s, 1, 2, 3, "four")
        code = s.proc.wait(timeout=60)
    finally:
        _stop(s)
    assert code == 3, s.stderr()
    assert "result" in hello and "result" in tools  # the front answered these before the settings loaded
    for refused in (call, ping):
        assert refused["error"]["code"] == -32001, refused
        assert BAD_SETTING in refused["error"]["data"]["guidance"], refused
        assert refused["error"]["data"]["type"] == "ConfigError", refused
    replies = [json.loads(line) for line in s.lines]
    assert all(r["jsonrpc"] == "2.0" for r in replies)
    assert sorted(map(str, (r["id"] for r in replies))) == ["1", "2", "3", "four"]  # each answered once
    assert "Traceback" not in s.stderr(), s.stderr()

