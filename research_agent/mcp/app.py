"""Running the MCP server: `run()` (stdio or streamable HTTP, from the settings) and `main()`, the process
entry that mcp_server.py and `research-agent serve` end in. `run()` also sends FastMCP's log records through our
handlers, one line each, a client's mistake without a traceback (errors.UserErrorsInOneLine)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from research_agent.config import Settings, load_settings
from research_agent.container import configure_logging
from research_agent.errors import ResearchAgentError
from research_agent.mcp import stdio
from research_agent.mcp.errors import UserErrorsInOneLine
from research_agent.mcp.launch import INTERRUPTED_EXIT
from research_agent.mcp.server import create_server

log = logging.getLogger("research_agent.mcp")

# Keep model libraries' progress bars and advisory warnings off every stream; they would go to stderr,
# but a quiet stderr is what MCP clients show users as the server log.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def run(transport: str | None = None, host: str | None = None, port: int | None = None,
        config_file: Path | str | None = None, settings_overrides: dict[str, Any] | None = None) -> None:
    """Run the server until the client disconnects (stdio) or the process is stopped (http).

    Arguments left None come from the settings (docs/configuration.md); a file never chooses the transport.
    Raises ResearchAgentError (a ConfigError) when the settings are invalid or would expose the store.
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # Log to stderr from the first moment: stdout carries JSON-RPC on stdio.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    overrides = {**(settings_overrides or {}), "transport": transport, "host": host, "port": port}
    settings = load_settings(config_file, **{k: v for k, v in overrides.items() if v is not None})
    configure_logging(settings)
    _fastmcp_logs_like_ours(settings.log_level.upper())
    if settings.transport == "http":
        stdio.release()  # an explicit HTTP choice after start_early() claimed stdio (a programmatic run())
        _run_http(settings)
    else:
        stdio.serve(create_server(settings))


class _ThroughOurHandlers(logging.Handler):
    """FastMCP's records, with a user error's in one line (errors.UserErrorsInOneLine), handed to the root
    logger's handlers (configure_logging's: stderr, the log file), so they read like ours."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(UserErrorsInOneLine())

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


def _fastmcp_logs_like_ours(level: str) -> None:
    """FastMCP's logger without its rich handlers (they wrapped one warning over 3-4 lines at 80 columns, and
    printed a traceback for a client's missing prompt argument), through ours instead."""
    fastmcp_log = logging.getLogger("fastmcp")
    for handler in fastmcp_log.handlers[:]:
        fastmcp_log.removeHandler(handler)
    fastmcp_log.addHandler(_ThroughOurHandlers())
    fastmcp_log.propagate = False  # the handler above hands each record to the root's handlers once
    fastmcp_log.setLevel(level)


def _run_http(settings: Settings) -> None:
    """Streamable HTTP behind, outermost first: the Host/Origin guard, authentication, the session cap, the
    stdio-style replies to malformed messages; and uvicorn with deadlines for request headers and bodies and
    bounded accept-error logs (research_agent/mcp/auth.py says why each)."""
    import fastmcp
    from starlette.middleware import Middleware as ASGIMiddleware

    from research_agent.mcp import auth as guard

    auth_type, keys = guard.check_http_settings(settings)
    if not guard.is_loopback(settings.host) and not settings.allowed_hosts:
        log.warning("only loopback Host names are accepted; set RESEARCH_AGENT_ALLOWED_HOSTS to the names clients "
                    "use to reach %s", settings.host)
    server = create_server(settings)
    # FastMCP's documented setting; `run()` offers no parameter for it. Its own Host/Origin guard stays off
    # (the default): ours checks ports too.
    fastmcp.settings.http_session_idle_timeout = settings.http_session_idle_timeout
    log.warning("research-agent MCP server on http://%s:%s/mcp (auth: %s)", settings.host, settings.port, auth_type)
    middleware = [ASGIMiddleware(guard.HostOriginGuard, hosts=guard.allowed_hosts(settings),
                                 origins=guard.allowed_origins(settings)),
                  ASGIMiddleware(guard.AuthMiddleware, auth_type=auth_type, keys=keys),
                  ASGIMiddleware(guard.SessionLimiter, max_sessions=settings.max_http_sessions),
                  ASGIMiddleware(guard.MalformedRequestReplies)]
    guard.limit_accept_error_logs()
    protocol = guard.header_timeout_protocol(settings.http_header_timeout, settings.http_body_timeout)
    # log_config=None: uvicorn logs through our stderr logging instead of printing access lines on stdout.
    server.run(transport="http", host=settings.host, port=settings.port, path="/mcp", show_banner=False,
               middleware=middleware, host_origin_protection=False,
               uvicorn_config={"log_config": None, "log_level": settings.log_level.lower(), "http": protocol})


def main() -> None:
    try:
        run()
    except ResearchAgentError as exc:
        stdio.refuse(exc)  # requests the early front took in get this error too, not a closed pipe
        sys.stderr.write(json.dumps({"error": exc.to_dict()}) + "\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED_EXIT)  # what shells and the CLI report for Ctrl-C (HTTP too)
