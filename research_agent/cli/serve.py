"""`research-agent serve`: the same MCP server as `python mcp_server.py` (research_agent.mcp.app.run); an
installed package has no top-level mcp_server module, so this is how installs start the server."""

from __future__ import annotations

from typing import Literal, Optional

import typer

from research_agent.cli.state import get_state


def serve(
    ctx: typer.Context,
    transport: Optional[Literal["stdio", "http"]] = typer.Option(
        None, "--transport", help="stdio for an editor or agent, http for the network (default from settings: stdio)."
    ),
    host: Optional[str] = typer.Option(None, "--host", help="HTTP bind address (default from settings: 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="HTTP port (default from settings: 8765)."),
) -> None:
    """Run the MCP server (stdio by default)."""
    from research_agent.mcp.stdio import drop_working_directory_from_path, start_early

    start_early(transport)  # answers `initialize` while the server imports
    drop_working_directory_from_path()  # never a workspace's own research_agent package
    from research_agent.mcp.app import run

    state = get_state(ctx)
    run(transport=transport, host=host, port=port, config_file=state.config_file,
                   settings_overrides={k: v for k, v in state.overrides().items() if v is not None})
