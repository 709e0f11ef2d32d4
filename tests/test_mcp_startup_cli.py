"""Issue 16 through the installed entry: `research-agent serve` (what every config in docs/clients runs) starts the
MCP front before the CLI (typer and its modules) loads, so its lists are as early as `python mcp_server.py`'s.

Real subprocesses over real stdio; the timings live in benchmarks/handshake.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
import typing

import pytest

from research_agent.mcp import early
from test_mcp import TOOLS
from test_mcp_startup import HELLO, _raw_lines, _request, _send_all, _session, _stop, _wait_for, _without_id
from test_mcp_stdio import ROOT, SERVER, _mcp_env, _McpStdioSession

# The CLI entry, but importing typer blocks for 120 s: whatever is answered meanwhile came before the CLI loaded.
HOLD_TYPER = ("import signal, sys, time\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)  # not inherited SIG_IGN (see below)\n"
              "class Hold:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'typer':\n"
              "            time.sleep(120)\n"
              "sys.meta_path.insert(0, Hold())\n"
              "sys.argv = ['research-agent', 'serve']\n"
              "import runpy\n"
              "runpy.run_module('research_agent', run_name='__main__')\n")


def _console_script() -> list[str]:
    """`research-agent` as pyproject.toml's [project.scripts] declares it (what pip writes into .venv/bin)."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["research-agent"]
    module, attr = target.split(":")
    return [sys.executable, "-c", f"import sys; sys.argv[0] = 'research-agent'; from {module} import {attr}; "
                                  f"sys.exit({attr}())"]


def test_the_cli_entry_answers_initialize_and_tools_list_before_the_cli_loads(tmp_path):
    """With typer's import held up, the entry still answers the handshake and tools/list from the snapshot (the
    old entry imported the whole CLI first: nothing came until typer had loaded)."""
    s = _session(tmp_path, [sys.executable, "-c", HOLD_TYPER])
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      _request(2, "tools/list")])
        hello, tools = _wait_for(s, 1, 2)
    finally:
        _stop(s)
    assert hello["result"]["serverInfo"]["name"] == early.SERVER_NAME
    stored = early.stored_answers()["2025-06-18"]["tools/list"]
    assert _raw_lines(s)[2] == b'{"jsonrpc":"2.0","id":2,"result":%s}' % stored.encode()
    assert sorted(t["name"] for t in tools["result"]["tools"]) == sorted(TOOLS)


@pytest.mark.parametrize("entry", ["console script", "python -m research_agent"])
def test_research_agent_serve_lists_what_the_server_lists_and_nothing_else_on_stdout(tmp_path, entry):
    """The whole session through the CLI entry: the early tools/list equals (but for the id, byte for byte) the
    server's own answer once it is up, a tool call sent with the handshake works, stdout holds only JSON-RPC, no
    list_changed (a stale early list) is sent, and closing stdin ends the process cleanly."""
    command = _console_script() if entry == "console script" else [sys.executable, "-m", "research_agent"]
    s = _session(tmp_path, [*command, "serve"])
    try:
        _send_all(s, [_request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                      _request(2, "tools/list"), _request(3, "tools/call", {"name": "get_status", "arguments": {}})])
        (status,) = _wait_for(s, 3)
        assert status["result"]["structuredContent"]["version"]
        assert "result" in s.request(4, "tools/list")  # the server is serving: the SDK answers this one
        assert s.close() == 0
    finally:
        _stop(s)
    lines = _raw_lines(s)  # every stdout line is JSON-RPC 2.0, each id answered once
    assert sorted(lines) == [1, 2, 3, 4] and len(s.lines) == 4, s.lines
    assert _without_id(lines[2], 2) == _without_id(lines[4], 4)
    assert "differs" not in s.stderr(), s.stderr()


def test_serve_help_still_prints_on_stdout():
    """`serve --help` is not a server: the fast path leaves it to the CLI, whose help goes to stdout."""
    done = subprocess.run([sys.executable, "-m", "research_agent", "serve", "--help"], cwd=ROOT, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"--transport" in done.stdout


@pytest.mark.parametrize("args, env, expected", [
    (["serve"], None, "stdio"),
    (["serve", "--transport", "stdio", "--port=9000"], "http", "stdio"),
    (["serve", "--transport=http"], None, "http"),
    (["serve"], "http", "http"),
    (["serve"], "HTTP", None),
    (["serve"], "", "stdio"),
    (["serve"], "garbage", None),
    (["serve", "--transport", "stdio"], "garbage", "stdio"),  # the flag overrides the variable, as in the settings
    (["serve", "--port", "abc"], None, None),
    (["serve", "--transport", ""], None, None),
    (["serve", "--port=0"], None, None),
    (["serve", "--host="], None, None),
    (["serve", "--help"], None, None),
    (["serve", "--transport"], None, None),
    (["serve", "--json"], None, None),
    (["--store", "/x", "serve"], None, None),
    (["query", "serve"], None, None),
    ([], None, None),
])
def test_only_a_plain_serve_command_line_takes_the_fast_path(monkeypatch, args, env, expected):
    from research_agent.cli.serve import early_serve_transport

    if env is None:
        monkeypatch.delenv("RESEARCH_AGENT_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("RESEARCH_AGENT_TRANSPORT", env)
    assert early_serve_transport(args) == expected


# A launch the CLI or the settings reject, and the exit code the CLI gave before the fast path existed (d107746):
# 2 is typer's usage error, 3 a ConfigError from the settings. A client must see no handshake from any of them
# ("connected, 14 tools" and then a dead server), only the error on stderr.
REJECTED_LAUNCHES = [
    (["serve", "--port", "abc"], {}, 2),
    (["serve", "--transport", ""], {}, 2),
    (["serve", "--transport", "STDIO"], {}, 2),
    (["serve", "--port", "0"], {}, 3),
    (["serve", "--port=70000"], {}, 3),
    (["serve"], {"RESEARCH_AGENT_TRANSPORT": "Stdio"}, 3),
    (["serve"], {"RESEARCH_AGENT_TRANSPORT": "garbage"}, 3),
    (["serve"], {"RESEARCH_AGENT_PORT": "abc"}, 3),
]


@pytest.mark.parametrize("args, env, code", REJECTED_LAUNCHES)
def test_a_rejected_serve_launch_exits_with_the_cli_error_and_nothing_on_stdout(tmp_path, args, env, code):
    """The handshake is on stdin from the start; the process must still exit with the CLI's code, stdout empty."""
    handshake = "".join(json.dumps(m) + "\n" for m in (
        _request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
        _request(2, "tools/list")))
    done = subprocess.run([sys.executable, "-m", "research_agent", *args], cwd=tmp_path, input=handshake.encode(),
                          env={**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false", **env}, capture_output=True,
                          timeout=120)
    assert done.stdout == b"", done.stdout[:300]
    assert done.returncode == code, done.stderr.decode(errors="replace")[-500:]
    assert b"Traceback" not in done.stderr


# Launch environments the settings reject (exit 3, a ConfigError). Each entry point must refuse them before claiming
# stdio: `python mcp_server.py` lowercased RESEARCH_AGENT_TRANSPORT and answered the handshake for "garbage" and
# "Stdio", then exited 3 (a client saw "connected" and then a dead server).
REJECTED_ENVIRONMENTS = [
    {"RESEARCH_AGENT_TRANSPORT": "garbage"},
    {"RESEARCH_AGENT_TRANSPORT": "Stdio"},
    {"RESEARCH_AGENT_TRANSPORT": "HTTP"},
    {"RESEARCH_AGENT_PORT": "abc"},
    {"RESEARCH_AGENT_PORT": "0"},
]
ENTRIES = ["python mcp_server.py", "research-agent serve", "python -m research_agent serve"]


def _entry(name: str) -> list[str]:
    if name == "python mcp_server.py":
        return [sys.executable, str(SERVER)]
    return [*(_console_script() if name == "research-agent serve" else [sys.executable, "-m", "research_agent"]),
            "serve"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("env", REJECTED_ENVIRONMENTS, ids=lambda env: "=".join(*env.items()))
def test_every_entry_refuses_a_rejected_environment_before_any_answer(tmp_path, entry, env):
    """All three launch paths, the handshake on stdin from the start: exit 3 (ConfigError), the bad variable named
    on stderr, nothing on stdout (no early `initialize` answer), no traceback."""
    handshake = "".join(json.dumps(m) + "\n" for m in (
        _request(1, "initialize", HELLO), {"jsonrpc": "2.0", "method": "notifications/initialized"},
        _request(2, "tools/list")))
    done = subprocess.run(_entry(entry), cwd=tmp_path, input=handshake.encode(),
                          env={**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false", **env}, capture_output=True,
                          timeout=120)
    stderr = done.stderr.decode(errors="replace")
    assert done.stdout == b"", done.stdout[:300]
    assert done.returncode == 3, stderr[-500:]
    assert "Invalid settings" in stderr and next(iter(env)) in stderr, stderr[-500:]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_answers_early_with_valid_launch_variables_set(tmp_path, entry):
    """The shared check lets through what the settings accept (the variables spelt as they take them): the
    handshake is answered by the front, as with nothing set."""
    s = _McpStdioSession(ROOT, {**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false",
                                "RESEARCH_AGENT_TRANSPORT": "stdio", "RESEARCH_AGENT_PORT": "9000"}, _entry(entry))
    try:
        _send_all(s, [_request(1, "initialize", HELLO)])
        (hello,) = _wait_for(s, 1)
    finally:
        _stop(s)
    assert hello["result"]["serverInfo"]["name"] == early.SERVER_NAME


def test_the_fast_path_accepts_what_the_settings_accept():
    """The front (research_agent/mcp/launch.py) cannot import research_agent.config (pydantic costs it its lead), so
    it keeps its own copy of the transport names, the port range and the variables' prefix: they must be the
    settings' own."""
    from research_agent import config
    from research_agent.config import Settings
    from research_agent.mcp import launch

    assert launch.TRANSPORTS == typing.get_args(Settings.model_fields["transport"].annotation)
    bounds = {type(m).__name__: m for m in Settings.model_fields["port"].metadata}
    assert launch.PORT_RANGE == (bounds["Ge"].ge, bounds["Le"].le)
    assert launch.ENV_PREFIX == config.ENV_PREFIX


def test_ctrl_c_while_serve_starts_exits_quietly(tmp_path):
    """Ctrl-C (SIGINT) once the handshake is answered but while the CLI and the server still load: exit 130 and no
    traceback on stderr. typer's import is held so the signal lands in that window on any machine (a fast one had
    finished loading, and a running stdio server waits for its client to close stdin, as it always has). The child
    takes Ctrl-C as a terminal gives it even when the test process ignores SIGINT (an ignored signal is inherited:
    the full suite's process had it ignored by the time this ran)."""
    s = _session(tmp_path, [sys.executable, "-c", HOLD_TYPER])
    try:
        _send_all(s, [_request(1, "initialize", HELLO)])
        _wait_for(s, 1)
        s.proc.send_signal(signal.SIGINT)
        code = s.proc.wait(timeout=60)
    finally:
        _stop(s)
    assert code == 130, s.stderr()
    assert "Traceback" not in s.stderr(), s.stderr()
