"""Every CLI command is covered by an MCP tool (and action), so the two faces cannot drift apart."""

from __future__ import annotations

import asyncio

import typer.main

from research_agent.cli.main import app

# CLI command path -> (MCP tool, action or None). Both call the same library function.
PARITY = {
    "collections create": ("manage_collections", "create"),
    "collections list": ("manage_collections", "list"),
    "collections info": ("manage_collections", "info"),
    "collections delete": ("manage_collections", "delete"),
    "projects create": ("manage_projects", "create"),
    "projects list": ("manage_projects", "list"),
    "projects info": ("manage_projects", "info"),
    "projects delete": ("manage_projects", "delete"),
    "projects link": ("manage_projects", "link"),
    "projects unlink": ("manage_projects", "unlink"),
    "projects set-defaults": ("manage_projects", "set-defaults"),
    "kb add-document": ("ingest_documents", None),
    "kb add-folder": ("ingest_documents", None),
    "kb add-research": ("augment_knowledge", None),
    "kb add-url": ("ingest_documents", None),
    "kb add-records": ("ingest_documents", None),
    "export": ("manage_collections", "export"),
    "import": ("manage_collections", "import"),
    "kb add-note": ("manage_documents", "add-note"),
    "kb update-note": ("manage_documents", "update-note"),
    "kb get": ("manage_documents", "get"),
    "kb list-documents": ("manage_documents", "list"),
    "kb remove-document": ("manage_documents", "remove"),
    "kb reindex": ("manage_documents", "reindex"),
    "kb prune": ("manage_documents", "prune"),
    # A watch is one long-running loop of incremental ingests: over MCP, a client calls
    # ingest_documents (the same library function) whenever it wants a sync.
    "kb watch": ("ingest_documents", None),
    "query": ("query_knowledge_base", None),
    "discover": ("discover_context", None),
    "retrieve": ("retrieve_knowledge", None),
    "dependencies": ("get_dependencies", None),
    "eval": ("evaluate_retrieval", None),
    "doctor": ("check_store", None),
    "status": ("get_status", None),
}
# The server itself is not a tool.
NOT_TOOLS = {"serve"}


def cli_commands() -> set[str]:
    root = typer.main.get_command(app)
    found = set()

    def walk(cmd, prefix: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            found.add(prefix)

    walk(root, "")
    return found


def mcp_tools() -> dict[str, dict]:
    from fastmcp import Client

    import mcp_server

    async def go():
        async with Client(mcp_server.mcp) as client:
            return {t.name: t.input_schema for t in await client.list_tools()}

    return asyncio.run(go())


def _actions(schema: dict) -> set[str]:
    prop = schema.get("properties", {}).get("action", {})
    if "enum" in prop:
        return set(prop["enum"])
    for alt in prop.get("anyOf", []) + prop.get("oneOf", []):
        if "enum" in alt:
            return set(alt["enum"])
    ref = prop.get("$ref", "")
    if ref:
        return set(schema.get("$defs", {}).get(ref.split("/")[-1], {}).get("enum", []))
    return set()


def test_every_cli_command_has_an_mcp_tool(monkeypatch):
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    commands = cli_commands() - NOT_TOOLS
    unmapped = commands - set(PARITY)
    assert not unmapped, f"CLI commands without an MCP tool mapping: {sorted(unmapped)}"
    tools = mcp_tools()
    for command in sorted(commands):
        tool, action = PARITY[command]
        assert tool in tools, f"`{command}` maps to missing MCP tool {tool}"
        if action:
            assert action in _actions(tools[tool]), f"`{command}` maps to {tool}(action={action!r}), not offered"


def test_no_tool_without_a_capability(monkeypatch):
    """Every listed tool is reachable from the CLI too (or is a documented MCP-only view)."""
    monkeypatch.setenv("RESEARCH_AGENT_WARMUP", "false")
    mcp_only = {"list_knowledge_bases", "search_knowledge"}  # views over `collections list` / `query --mode`
    mapped = {tool for tool, _ in PARITY.values()}
    assert set(mcp_tools()) - mapped - mcp_only == set()
