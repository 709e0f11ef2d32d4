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


#: What research_agent/config.py's Settings accept for `transport` and `port` (tests/test_mcp_startup_cli.py checks
#: they are the fields' own): kept here because importing the settings (pydantic) would cost the front its lead.
#: The front answers only launches these accept, so a launch the CLI or the settings reject (exit 2 or 3) never
#: shows a client a handshake first.
TRANSPORTS = ("stdio", "http")
PORT_RANGE = (1, 65535)
ENV_PREFIX = "RESEARCH_AGENT_"


def _acceptable(option: str, value: str) -> bool:
    """Whether `value` for `option` (--transport, --host, --port) is exactly what the CLI and the settings take:
    the transport as spelt in TRANSPORTS, a non-empty host, a port of plain digits in PORT_RANGE."""
    if option == "--transport":
        return value in TRANSPORTS
    if option == "--port":
        return value.isascii() and value.isdigit() and PORT_RANGE[0] <= int(value) <= PORT_RANGE[1]
    return value != ""


def launch_environment_ok() -> bool:
    """Whether RESEARCH_AGENT_TRANSPORT and _PORT, if set, are values the settings accept (empty is unset, as in
    config._env_layer): otherwise loading the settings fails (exit 3) and nothing may be answered before."""
    import os

    return all(_acceptable(option, os.environ[ENV_PREFIX + option[2:].upper()])
               for option in ("--transport", "--port") if os.environ.get(ENV_PREFIX + option[2:].upper()))


def early_serve_transport(args: list[str]) -> str | None:
    """The transport `research-agent <args>` serves on when it is `serve` with nothing but SERVE_VALUE_OPTIONS,
    each with a value the CLI and the settings accept, and a launch environment they accept (the --transport
    flag, else RESEARCH_AGENT_TRANSPORT, else stdio), or None: leave it to the CLI."""
    import os

    if not args or args[0] != "serve" or not launch_environment_ok():
        return None
    values: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        name, equals, value = arg.partition("=")
        if name not in SERVE_VALUE_OPTIONS:
            return None
        if not equals:
            value = next(rest, None)
        if value is None or not _acceptable(name, value):
            return None  # the CLI's usage error (2) or the settings' (3)
        values[name] = value
    return values.get("--transport") or os.environ.get(ENV_PREFIX + "TRANSPORT") or "stdio"


def start_front(args: list[str]) -> None:
    """Claim stdio and answer the handshake and the lists now (research_agent/mcp/stdio.py) if `args` (the
    command line after `research-agent`) is a plain `serve` on stdio; otherwise do nothing."""
    if early_serve_transport(args) == "stdio":
        from research_agent.mcp.stdio import start_early

        start_early("stdio")  # the command calls it again: a no-op once the wire is claimed


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

        if launch_environment_ok() and (port is None or _acceptable("--port", str(port))):  # else exit 3
            start_early(transport)  # answers `initialize` while the server imports (already, if start_front did)
        drop_working_directory_from_path()  # never a workspace's own research_agent package
        from research_agent.mcp.app import run

        state = get_state(ctx)
        run(transport=transport, host=host, port=port, config_file=state.config_file,
            settings_overrides={k: v for k, v in state.overrides().items() if v is not None})

    return serve


def __getattr__(name: str) -> Any:
    """`serve`, the typer command, built on first access."""
    if name == "serve":
        command = globals()["serve"] = _command()
        return command
    raise AttributeError(name)
