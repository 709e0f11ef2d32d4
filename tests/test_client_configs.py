"""The copy-paste client configs in docs/clients start the server exactly as the editor would: the test reads
each file, fills in this checkout's paths, and speaks MCP to it with the `mcp` SDK's own stdio client.
Optionally the MCP Inspector CLI from npm does the same (skipped without npm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "docs" / "clients"
VENV = Path(sys.executable).parent.parent  # the interpreter running the tests is the checkout's venv
PLACEHOLDER = "/ABSOLUTE/PATH/TO/research-agent"
CONFIGS = {
    "cursor": (CLIENTS / "cursor" / ".cursor" / "mcp.json", "mcpServers"),
    "claude-desktop": (CLIENTS / "claude-desktop" / "claude_desktop_config.json", "mcpServers"),
    "vscode": (CLIENTS / "vscode" / ".vscode" / "mcp.json", "servers"),
}


def _fill(value: str, workspace: Path, notes: Path) -> str:
    # The docs point at <checkout>/.venv; tests run from whatever venv holds this interpreter.
    value = value.replace(f"{PLACEHOLDER}/.venv", str(VENV)).replace(PLACEHOLDER, str(ROOT))
    return value.replace("${workspaceFolder}", str(workspace)).replace("/ABSOLUTE/PATH/TO/YOUR/NOTES", str(notes))


def server_entry(client: str, workspace: Path, notes: Path) -> dict[str, Any]:
    path, key = CONFIGS[client]
    entry = json.loads(path.read_text(encoding="utf-8"))[key]["research-agent"]
    assert entry.get("type", "stdio") == "stdio"
    return {"command": _fill(entry["command"], workspace, notes),
            "args": [_fill(a, workspace, notes) for a in entry.get("args", [])],
            "env": {k: _fill(v, workspace, notes) for k, v in entry.get("env", {}).items()},
            "cwd": _fill(entry["cwd"], workspace, notes) if "cwd" in entry else None}


def _isolated_env(tmp_path: Path) -> dict[str, str]:
    # What the editor's environment would hold, minus anything pointing at the user's real store.
    return {"RESEARCH_AGENT_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1",
            "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"),
            "RESEARCH_AGENT_WARMUP": "false"}


async def _session(entry: dict[str, Any], env: dict[str, str], body: Any) -> Any:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=entry["command"], args=entry["args"], env={**env, **entry["env"]},
                                   cwd=entry["cwd"] or str(Path.cwd()))
    # The server's stderr goes beside the test's store, never into the working directory (a clone stays clean).
    with open(Path(env["RESEARCH_AGENT_STORE"]).parent / "server-stderr.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "research-agent"
                return await body(session)


@pytest.mark.parametrize("client", ["claude-desktop", "vscode"])
def test_config_starts_the_server_over_stdio(client, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    entry = server_entry(client, Path.cwd(), notes)
    assert Path(entry["command"]).exists(), entry["command"]

    async def body(session: Any) -> set[str]:
        return {t.name for t in (await session.list_tools()).tools}

    tools = anyio.run(_session, entry, _isolated_env(tmp_path), body)
    assert {"query_knowledge_base", "ingest_documents", "get_status"} <= tools


def test_cursor_config_ingests_and_queries_through_the_sdk_stdio_client(tmp_path):
    """The Cursor config, then a real ingest and query on the real embedding model over stdio."""
    workspace = Path.cwd()
    (workspace / "guide.md").write_text("# Backups\n\nNightly backups go to the walrus bucket at 02:00 UTC.\n",
                                        encoding="utf-8")
    entry = server_entry("cursor", workspace, workspace)
    assert entry["env"]["RESEARCH_AGENT_ALLOWED_ROOTS"] == str(workspace)

    async def body(session: Any) -> dict[str, Any]:
        from test_mcp import TOOLS

        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        await session.call_tool("manage_collections", {"action": "create", "collection_name": "workspace"})
        report = await session.call_tool("ingest_documents", {"path": str(workspace / "guide.md"),
                                                              "collection": "workspace"})
        assert report.structured_content["added"] == 1, report
        found = await session.call_tool("query_knowledge_base", {"query": "where do nightly backups go?",
                                                                 "collections": ["workspace"]})
        assert "walrus" in found.content[0].text
        return found.structured_content

    found = anyio.run(_session, entry, _isolated_env(tmp_path), body)
    assert found["results"][0]["source_document"] == "guide.md"


def _inspector() -> Path:
    """The MCP Inspector CLI, installed once per checkout into .pytest_cache (npm needs the registry)."""
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        pytest.skip("npm/node not available: the MCP Inspector check needs Node (CI has it)")
    prefix = ROOT / ".pytest_cache" / "mcp-inspector-0.17.2"
    exe = prefix / "node_modules" / ".bin" / "mcp-inspector"
    if not exe.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
                               "@modelcontextprotocol/inspector@0.17.2"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not exe.exists():
            pytest.skip(f"npm install of the MCP Inspector failed (no registry access?): {done.stderr[-300:]}")
    return exe


def test_mcp_inspector_cli_lists_tools_and_calls_one(tmp_path):
    exe = _inspector()
    entry = server_entry("cursor", Path.cwd(), Path.cwd())
    env = {**os.environ, **_isolated_env(tmp_path), **entry["env"]}
    base = [str(exe), "--cli", entry["command"], *entry["args"]]
    listed = subprocess.run([*base, "--method", "tools/list"], capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    assert {"query_knowledge_base", "manage_collections"} <= {t["name"] for t in json.loads(listed.stdout)["tools"]}
    called = subprocess.run([*base, "--method", "tools/call", "--tool-name", "manage_collections",
                             "--tool-arg", "action=list"], capture_output=True, text=True, timeout=120, env=env)
    assert called.returncode == 0, called.stderr
    listed = json.loads(called.stdout)["structuredContent"]  # a page: `total` and `next_cursor` ride along
    assert listed["collections"] == [] and listed.get("next_cursor") is None, listed


# -- a hostile workspace: no shipped launch may import code from it ------------------------------------------
_PAYLOAD = "open({marker!r}, 'a').write({who!r} + '\\n')\n"


def _hostile_workspace(tmp_path: Path) -> tuple[Path, Path]:
    """A cloned repository carrying its own `mcp_server.py` and `research_agent` package, each of which writes
    a marker when imported (what `python -m mcp_server` with cwd=${workspaceFolder} used to run)."""
    workspace, marker = tmp_path / "hostile", tmp_path / "PWNED"
    (workspace / "research_agent" / "cli").mkdir(parents=True)
    (workspace / "mcp_server.py").write_text(_PAYLOAD.format(marker=str(marker), who="mcp_server.py"))
    for init in ("research_agent/__init__.py", "research_agent/cli/__init__.py"):
        (workspace / init).write_text(_PAYLOAD.format(marker=str(marker), who=init))
    return workspace, marker


def _initialize_over_stdio(command: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Start `command`, send `initialize`, return the first reply (close stdin; the server then exits)."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    done = subprocess.run(command, cwd=cwd, env=env, input=(json.dumps(init) + "\n").encode(),
                          capture_output=True, timeout=120)
    lines = done.stdout.decode().splitlines()
    assert lines, f"no reply (exit {done.returncode}): {done.stderr.decode()[-2000:]}"
    return json.loads(lines[0])


@pytest.mark.parametrize("client", list(CONFIGS))
def test_shipped_config_never_runs_code_from_the_workspace(client, tmp_path):
    """Editors start the server in the open workspace (VS Code's `cwd`, or the editor's own choice when the
    config names none: assume the workspace). `python -m` would put that folder first on sys.path."""
    workspace, marker = _hostile_workspace(tmp_path)
    entry = server_entry(client, workspace, workspace)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_") and k != "PYTHONPATH"}
    env.update(_isolated_env(tmp_path), **entry["env"])
    reply = _initialize_over_stdio([entry["command"], *entry["args"]], Path(entry["cwd"] or workspace), env)
    assert not marker.exists(), f"{client}: workspace code ran: {marker.read_text()}"
    assert reply["result"]["serverInfo"]["name"] == "research-agent", reply


@pytest.mark.parametrize("launch", [["-m", "mcp_server"], ["-c", "import mcp_server; mcp_server.main()"]])
def test_the_server_drops_the_working_directory_from_sys_path(launch, tmp_path):
    """Defence in depth for hand-written launches: with our checkout on PYTHONPATH and a workspace holding only
    a `research_agent` package, `python -m mcp_server` (cwd first on sys.path) must still import ours."""
    workspace, marker = _hostile_workspace(tmp_path)
    (workspace / "mcp_server.py").unlink()  # a workspace mcp_server.py itself wins before any code of ours runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(_isolated_env(tmp_path), PYTHONPATH=str(ROOT))
    reply = _initialize_over_stdio([sys.executable, *launch], workspace, env)
    assert not marker.exists(), f"workspace code ran: {marker.read_text()}"
    assert reply["result"]["serverInfo"]["name"] == "research-agent", reply


def test_research_agent_serve_never_imports_a_workspace_mcp_server(tmp_path):
    """`research-agent serve` once imported `mcp_server` by name; with the working directory on sys.path (here
    via PYTHONPATH=.) a workspace's own mcp_server.py would be the one imported."""
    workspace, marker = _hostile_workspace(tmp_path)
    for init in ("research_agent/cli/__init__.py", "research_agent/__init__.py"):
        (workspace / init).unlink()  # the console script imports research_agent before any code of ours runs
    (workspace / "research_agent" / "cli").rmdir()
    (workspace / "research_agent").rmdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(_isolated_env(tmp_path), PYTHONPATH=".")
    reply = _initialize_over_stdio([str(VENV / "bin" / "research-agent"), "serve"], workspace, env)
    assert not marker.exists(), f"workspace code ran: {marker.read_text()}"
    assert reply["result"]["serverInfo"]["name"] == "research-agent", reply


# -- one config: docs/clients.md, the shipped files and the README agree ------------------------------------
def _the_documented_config(markdown: Path) -> dict[str, Any]:
    """The first ```json block of a Markdown file holding an `mcpServers.research-agent` entry."""
    import re

    for block in re.findall(r"```json\n(.*?)```", markdown.read_text(encoding="utf-8"), flags=re.S):
        entry = json.loads(block).get("mcpServers", {}).get("research-agent")
        if entry:
            return entry
    raise AssertionError(f"{markdown}: no ```json block with mcpServers.research-agent")


def _launch(entry: dict[str, Any]) -> tuple[str, list[str], set[str]]:
    return Path(entry["command"]).name, entry.get("args", []), set(entry.get("env", {}))


def test_every_shipped_config_is_the_one_in_docs_clients_md():
    """One launch (the console script's `serve`, which works from a checkout and from a pip install) and the
    allowed roots set, in every file a user copies."""
    one = _the_documented_config(ROOT / "docs" / "clients.md")
    assert _launch(one) == ("research-agent", ["serve"], {"RESEARCH_AGENT_ALLOWED_ROOTS"})
    for client, (path, key) in CONFIGS.items():
        entry = json.loads(path.read_text(encoding="utf-8"))[key]["research-agent"]
        assert entry["command"] == one["command"], client
        assert _launch(entry) == _launch(one), client


def test_the_readme_shows_the_same_config():
    assert _the_documented_config(ROOT / "README.md") == _the_documented_config(ROOT / "docs" / "clients.md")
