"""`research-agent serve`: the same MCP server as `python mcp_server.py` (research_agent.mcp.app.run); an
installed package has no top-level mcp_server module, so this is how installs start the server.

Importing this module imports neither typer nor the rest of the CLI: `research_agent.__main__.main` (the
`research-agent` command) calls `start_front` with the command line first, so a plain `research-agent serve`
(what every config in docs/clients runs) answers `initialize` and tools/list 0.03 s after spawn instead of
after typer and the CLI's modules load (0.2 s quiet, 1.2-1.6 s under load; benchmarks/handshake.py). The
typer command itself, `serve`, is built on first access (research_agent/cli/main.py registers it).
"""

from typing import Any, Literal, Optional

#: `serve` options that take a value: the only arguments `start_front` accepts after `serve`. Anything else
#: (`--help`, a global option before `serve`, an unknown flag) leaves the command line to the CLI, which may
#: print to stdout, so the front must not have claimed it.
SERVE_VALUE_OPTIONS = ("--transport", "--host", "--port")


def _plain_serve_flags(args: list[str]) -> dict[str, str] | None:
    """The flags of `research-agent <args>` when it is `serve` with nothing but SERVE_VALUE_OPTIONS, each with a
    value the CLI and the settings take (research_agent/mcp/stdio.py `acceptable`), else None."""
    if not args or args[0] != "serve":
        return None
    from research_agent.mcp.launch import acceptable

    values: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        name, equals, value = arg.partition("=")
        if name not in SERVE_VALUE_OPTIONS:
            return None
        if not equals:
            value = next(rest, None)
        if value is None or not acceptable(name, value):
            return None  # the CLI's usage error (2) or the settings' (3)
        values[name] = value
    return values


def early_serve_transport(args: list[str]) -> str | None:
    """The transport `research-agent <args>` serves on when it is a plain `serve` (`_plain_serve_flags`) whose
    transport and port, with the environment's, are ones the settings accept (research_agent/mcp/stdio.py
    `launch_transport`, the check every entry point's front shares), or None: leave it to the CLI."""
    flags = _plain_serve_flags(args)
    if flags is None:
        return None
    from research_agent.mcp.launch import launch_transport

    return launch_transport(flags.get("--transport"), flags.get("--port"))


def start_front(args: list[str]) -> None:
    """Claim stdio and answer the handshake and the lists now (research_agent/mcp/stdio.py) if `args` (the
    command line after `research-agent`) is a plain `serve` on stdio that the settings will accept; otherwise do
    nothing (start_early decides, with the same check as every entry point)."""
    flags = _plain_serve_flags(args)
    if flags is not None:
        from research_agent.mcp.stdio import start_early

        start_early(flags.get("--transport"), flags.get("--port"))  # the command calls it again: then a no-op


def _command() -> Any:
    """The typer command (typer imported here, not at module level: see the module docstring)."""
    import typer

    from research_agent.cli.state import get_state

    def serve(
        ctx: typer.Context,
        transport: Optional[Literal["stdio", "http"]] = typer.Option(
            None, "--transport",
            help="stdio for an editor or agent, http for the network (default from settings: stdio)."),
        host: Optional[str] = typer.Option(
            None, "--host", help="HTTP bind address (default from settings: 127.0.0.1)."),
        port: Optional[int] = typer.Option(None, "--port", help="HTTP port (default from settings: 8765)."),
    ) -> None:
        """Run the MCP server (stdio by default)."""
        from research_agent.mcp.stdio import drop_working_directory_from_path, start_early

        # Answers `initialize` while the server imports (already, if start_front did), unless the transport or port
        # is one the settings reject (then they exit 3 with nothing answered before).
        start_early(transport, None if port is None else str(port))
        drop_working_directory_from_path()  # never a workspace's own research_agent package
        from research_agent.errors import ResearchAgentError
        from research_agent.mcp.app import run
        from research_agent.mcp.stdio import refuse

        state = get_state(ctx)
        try:
            run(transport=transport, host=host, port=port, config_file=state.config_file,
                settings_overrides={k: v for k, v in state.overrides().items() if v is not None})
        except ResearchAgentError as exc:  # settings rejected after the front answered `initialize`
            refuse(exc)
            raise

    return serve


def __getattr__(name: str) -> Any:
    """`serve`, the typer command, built on first access."""
    if name == "serve":
        command = globals()["serve"] = _command()
        return command
    raise AttributeError(name)
