"""Which launches the early stdio front may answer: the transport and port a launch will serve on, checked
without loading the settings.

Importing the settings (pydantic) costs the front its ~0.03 s lead, so this stdlib-only module keeps what
research_agent/config.py's Settings accept for `transport` and `port` (tests/test_mcp_startup_cli.py checks they
are the fields' own). Every entry point's front (mcp_server.py, `research-agent serve`, `python -m research_agent
serve`) goes through `launch_transport`: a launch the settings will reject (a ConfigError, exit 3) never shows a
client a handshake first. Other settings are checked when they load, after the early answers.
"""

from __future__ import annotations

import os

#: What Settings accept (see the module docstring).
TRANSPORTS = ("stdio", "http")
PORT_RANGE = (1, 65535)
ENV_PREFIX = "RESEARCH_AGENT_"


def acceptable(option: str, value: str) -> bool:
    """Whether `value` for `option` (--transport, --host, --port) is exactly what the CLI and the settings take:
    the transport as spelt in TRANSPORTS (the settings do not fold case), a non-empty host, a port of plain
    digits in PORT_RANGE."""
    if option == "--transport":
        return value in TRANSPORTS
    if option == "--port":
        return value.isascii() and value.isdigit() and PORT_RANGE[0] <= int(value) <= PORT_RANGE[1]
    return value != ""


def launch_transport(transport: str | None = None, port: str | None = None) -> str | None:
    """The transport a launch serves on (the --transport flag, else RESEARCH_AGENT_TRANSPORT, else stdio), or None
    when the transport or port the settings will get (a flag, which overrides the variable, else
    RESEARCH_AGENT_TRANSPORT / _PORT; empty is unset, as in config._env_layer) is a value they reject: loading them
    will fail (exit 3), so nothing may be answered before. The one check every entry point's front goes through
    (mcp_server.py, `research-agent serve`, `python -m research_agent serve`)."""
    chosen = {option: flag if flag is not None else os.environ.get(ENV_PREFIX + option[2:].upper()) or None
              for option, flag in (("--transport", transport), ("--port", port))}
    if not all(acceptable(option, value) for option, value in chosen.items() if value is not None):
        return None
    return chosen["--transport"] or "stdio"
