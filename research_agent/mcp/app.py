"""Running the MCP server: `run()` (stdio or streamable HTTP, from the settings) and `main()`, the process
entry that mcp_server.py and `research-agent serve` end in. `run()` also sends FastMCP's log records through our
handlers, one line each, a client's mistake without a traceback (errors.UserErrorsInOneLine), and escapes control and
line-breaking characters in every record's message (launch.loggable: a client's bytes must not forge a log line).

Over HTTP the server's stop is ours, not uvicorn's (`_run_http`): uvicorn installed its own SIGINT and SIGTERM
handlers over an inherited SIG_IGN (one Ctrl-C then stopped a nohup'd server, exit 0), a Ctrl-C as it started
printed a CancelledError traceback, and a second one a KeyboardInterrupt traceback. Ctrl-C or SIGTERM now stops it
as over stdio (launch.handle_stops): uvicorn shuts down, the lifespan's clean-up runs, exit 130 or 143 within
launch.INTERRUPT_GRACE_SECONDS, one warning line if calls were cut short."""

from __future__ import annotations

import contextlib
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
from research_agent.mcp.launch import (
    INTERRUPTED_EXIT,
    handle_stops,
    interrupted,
    loggable,
    starting,
    stop_exit_code,
    stop_reason,
)
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
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _Escaped) for f in handler.filters):
            handler.addFilter(_Escaped())
    if settings.transport == "http":
        stdio.release()  # an explicit HTTP choice after start_early() claimed stdio (a programmatic run())
        starting()  # Ctrl-C exits at once until _run_http handles it: nothing is open before the lifespan
        _run_http(settings)
    else:
        stdio.serve(create_server(settings))


class _Escaped(logging.Filter):
    """A record's message with control and line-breaking characters escaped (launch.loggable); its traceback, if
    any, is left as it is (ours, not the client's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - logging reports a bad format itself
            return True
        escaped = loggable(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True


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
    import anyio
    import fastmcp
    import uvicorn
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
    calls = _Calls()
    # What FastMCP.run(transport="http") does (fastmcp 4.1.2 run_http_async), with a uvicorn server that leaves the
    # signals to us. log_config=None: uvicorn logs through our stderr logging, no access lines on stdout.
    app = server.http_app(path="/mcp", transport="http", middleware=[ASGIMiddleware(_CountCalls, calls=calls),
                                                                      *middleware],
                          stateless_http=fastmcp.settings.stateless_http, host_origin_protection=False,
                          allowed_hosts=fastmcp.settings.http_allowed_hosts)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, timeout_graceful_shutdown=2, lifespan="on",
                            ws="websockets-sansio", log_config=None, log_level=settings.log_level.lower(),
                            http=protocol)
    uvicorn_server = _uvicorn_server_class()(config)
    logging.getLogger("uvicorn.error").addFilter(_QuietStop())
    handle_stops(lambda: setattr(uvicorn_server, "should_exit", True), calls.cut_short)
    anyio.run(_serve_http, server, uvicorn_server)
    if interrupted():
        cut = calls.cut_short()
        if cut:
            log.warning("%s: %d call%s cut short", stop_reason(), cut, "" if cut == 1 else "s")
        raise SystemExit(stop_exit_code())


async def _serve_http(server: Any, uvicorn_server: Any) -> None:
    async with server._lifespan_manager():
        if not uvicorn_server.should_exit:  # a stop signal while the lifespan started: nothing to serve
            await uvicorn_server.serve()


def _uvicorn_server_class() -> Any:
    import uvicorn

    class SignalsLeftToUs(uvicorn.Server):
        """uvicorn's server without its signal handling (`capture_signals` installed handlers over an inherited
        SIG_IGN and re-raised the signal after shutdown): launch.handle_stops sets `should_exit` instead."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    return SignalsLeftToUs


class _Calls:
    """POST requests (calls) being served, and those a stop signal ended without their response."""

    def __init__(self) -> None:
        self.open = 0
        self.unanswered = 0

    def cut_short(self) -> int:
        return self.open + self.unanswered


class _CountCalls:
    """ASGI middleware counting the calls a stop cuts short (`_Calls`) for the one line the stop logs."""

    def __init__(self, app: Any, calls: _Calls) -> None:
        self.app, self.calls = app, calls

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        answered = False

        async def watched(message: Any) -> None:
            nonlocal answered
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        self.calls.open += 1
        try:
            await self.app(scope, receive, watched)
        finally:
            self.calls.open -= 1
            if not answered and interrupted():
                self.calls.unanswered += 1


#: uvicorn's error records about requests a stop ends (`_QuietStop`): the stop's own line counts them instead.
_STOP_NOISE = ("ASGI callable returned without completing response.",
               "Cancel %s running task(s), timeout graceful shutdown exceeded", "Exception in ASGI application\n")


class _QuietStop(logging.Filter):
    """Once a stop signal arrived, uvicorn's records about the requests it ends are dropped (a call cut short is
    counted in the stop's one warning line instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (interrupted() and record.msg in _STOP_NOISE)


def main() -> None:
    try:
        run()
    except ResearchAgentError as exc:
        stdio.refuse(exc)  # requests the early front took in get this error too, not a closed pipe
        sys.stderr.write(json.dumps({"error": exc.to_dict()}) + "\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED_EXIT)  # what shells and the CLI report for Ctrl-C (HTTP too)
