"""Who may talk to the HTTP server, and how much of it one client may hold.

- `HostOriginGuard`: DNS rebinding. A web page on evil.example whose name resolves to 127.0.0.1 reaches a
  loopback server with `Host`/`Origin: evil.example:PORT`; every route refuses a foreign Host (421) and a
  present, foreign Origin (403). FastMCP 4.1.2 has a guard (`host_origin_protection`, off by default) but it
  ignores ports: any loopback Origin passes, so a page served by another local web app (http://localhost:3000)
  would too. Ours compares host and port.
- `AuthMiddleware`: no auth on loopback only, bearer tokens, or an `X-API-Key` header; `/health` is public; a
  refused request gets 401 and nothing else (no hint which part was wrong).
- `SessionLimiter`: at most `max_http_sessions` streamable-HTTP sessions; at the cap an idle one ends instead
  of the newcomer being refused (the SDK answers 503 at its own cap of 10,000, and sessions lived 30 minutes:
  a flood of `initialize` calls locked every new client out that long).
- `header_timeout_protocol`: uvicorn closes idle keep-alive connections but waits forever for the first
  request headers and for a trickled body; this closes a connection that has not sent its headers within
  `http_header_timeout`, or its whole request within `http_body_timeout`.
- `AcceptErrorLogLimit`: at the descriptor limit asyncio logged accept errors thousands of times a second;
  one per ACCEPT_ERROR_LOG_INTERVAL gets through.
- `MalformedRequestReplies`: the SDK's reply to a malformed message becomes stdio's (code, id, guidance).
- `HostOriginGuard` also answers 400 to a request with more than one Host or Origin header.

Over 400 lines because it holds six independent guards (each under ~100 lines) that only the HTTP transport
uses; one module per guard is the natural next split if it grows.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from research_agent.errors import ConfigError

log = logging.getLogger("research_agent.mcp")

AUTH_TYPES = ("none", "bearer", "api-key")
PUBLIC_PATHS = frozenset({"/health"})
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
#: Shorter keys can be guessed; 16 random characters are about 95 bits (a `secrets.token_urlsafe(32)` is 43).
MIN_API_KEY_CHARS = 16
#: The names a loopback server is reached by; with the bound port they are the default allowed Hosts.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_http_settings(settings: Any) -> tuple[str, list[str]]:
    """The auth type and keys to serve with; a ConfigError for a setup that would expose the store."""
    auth = getattr(settings, "auth_type", "none")
    keys = [k for k in (getattr(settings, "api_keys", None) or []) if k]
    host = getattr(settings, "host", "127.0.0.1")
    if auth not in AUTH_TYPES:
        raise ConfigError(f"Unknown auth_type {auth!r}", guidance=f"Use one of: {', '.join(AUTH_TYPES)}.")
    if auth == "none":
        if not is_loopback(host):
            raise ConfigError(
                f"Refusing to serve on {host} without authentication: anyone who can reach it could read and "
                "change the knowledge base",
                guidance="Set RESEARCH_AGENT_AUTH_TYPE=bearer (or api-key) and RESEARCH_AGENT_API_KEYS=<secret>, "
                "or bind to 127.0.0.1.",
                host=host,
            )
        return auth, []
    if not keys:
        raise ConfigError(
            f"auth_type {auth} needs at least one key",
            guidance="Set RESEARCH_AGENT_API_KEYS to one or more comma-separated secrets (long random strings).",
        )
    short = sum(len(k) < MIN_API_KEY_CHARS for k in keys)
    if short:
        raise ConfigError(
            f"{short} of the {len(keys)} keys in RESEARCH_AGENT_API_KEYS is shorter than {MIN_API_KEY_CHARS} "
            f"characters; keys must be at least {MIN_API_KEY_CHARS} characters long",
            guidance='Generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))".',
        )
    return auth, keys


def _refuse(status: int, error: str, extra: list[tuple[bytes, bytes]] | None = None) -> tuple[dict, dict]:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return ({"type": "http.response.start", "status": status, "headers": headers + (extra or [])},
            {"type": "http.response.body", "body": body})


async def _send_refusal(send: Any, status: int, error: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    for message in _refuse(status, error, extra):
        await send(message)


def _split_host(value: str) -> tuple[str, int | None]:
    """'Example.com:8765' -> ('example.com', 8765); '[::1]:80' -> ('[::1]', 80); a bad port -> port -1."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    if not port:
        return host, None
    return host, int(port) if port.isdigit() else -1


def _bracketed(host: str) -> str:
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(settings: Any) -> list[str]:
    """Host header values the server answers: its loopback names and bind address at its port, plus the
    user's `allowed_hosts` (`name` for any port, `name:port`, `*` for anything)."""
    port, bind = int(settings.port), _bracketed(settings.host)
    own = list(LOOPBACK_HOSTS) + ([bind] if bind not in ("0.0.0.0", "[::]", "") else [])
    return list(dict.fromkeys([f"{h}:{port}" for h in own] + [str(h).strip().lower() for h in settings.allowed_hosts]))


def allowed_origins(settings: Any) -> list[str]:
    """Origin header values accepted: the server's own origins (http://<loopback name or bind address>:<port>)
    plus the user's `allowed_origins` (`*` for any)."""
    user = {str(h).strip().lower() for h in settings.allowed_hosts}
    own = [f"http://{h}" for h in allowed_hosts(settings) if h not in user]
    return own + [str(o).strip() for o in settings.allowed_origins]


def _host_allowed(value: str, allowed: list[str]) -> bool:
    host, port = _split_host(value)
    for entry in allowed:
        want_host, want_port = _split_host(entry)
        if entry == "*" or (host == want_host and want_port in (None, port)):
            return True
    return False


def _normalize_origin(value: str) -> str:
    """'HTTPS://App.example/' -> 'https://app.example:443'; anything unparsable stays as given, lower-cased."""
    value = value.strip().lower().rstrip("/")
    try:
        parts = urlsplit(value)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return value
    if not parts.hostname or port is None:
        return value
    return f"{parts.scheme}://{_bracketed(parts.hostname)}:{port}"


def _origin_allowed(value: str, allowed: list[str]) -> bool:
    origin = _normalize_origin(value)
    return any(entry == "*" or _normalize_origin(entry) == origin for entry in allowed)


class HostOriginGuard:
    """Pure ASGI, outermost: 421 for a foreign Host, 403 for a foreign Origin (none at all is fine: only
    browsers send one, and non-browser clients cannot be rebound), on every route, /health included; 400 for
    more than one Host or Origin header (this guard would check one, Starlette read another: RFC 9112 §3.2)."""

    def __init__(self, app: Any, hosts: list[str], origins: list[str]) -> None:
        self.app, self.hosts, self.origins = app, hosts, origins

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        names = [name.lower() for name, _ in scope.get("headers", [])]
        if names.count(b"host") > 1 or names.count(b"origin") > 1:
            log.warning("refused a request with more than one Host or Origin header")
            await _send_refusal(send, 400, "bad request: more than one Host or Origin header")
            return
        headers = {name.lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        if not _host_allowed(headers.get(b"host", ""), self.hosts):
            log.warning("refused a request for Host %r (not in allowed hosts)", headers.get(b"host", "")[:100])
            await _send_refusal(send, 421, "misdirected request: unknown Host")
        elif b"origin" in headers and not _origin_allowed(headers[b"origin"], self.origins):
            log.warning("refused a request from Origin %r (not in allowed origins)", headers[b"origin"][:100])
            await _send_refusal(send, 403, "forbidden origin")
        else:
            await self.app(scope, receive, send)


class AuthMiddleware:
    """Pure ASGI: lets a request through when it carries one of the keys, answers 401 otherwise."""

    def __init__(self, app: Any, auth_type: str, keys: list[str]) -> None:
        self.app = app
        self.auth_type = auth_type
        self._keys = [k.encode() for k in keys]

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self.auth_type == "none":
            return True
        if self.auth_type == "bearer":
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer":
                return False
            presented = token.strip()
        else:
            presented = headers.get(b"x-api-key", b"").strip()
        if not presented:
            return False
        # Compare against every key so timing says nothing about which one nearly matched.
        return any([hmac.compare_digest(presented, key) for key in self._keys])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        if self._authorized(headers):
            await self.app(scope, receive, send)
            return
        extra = [(b"www-authenticate", b'Bearer realm="research-agent"')] if self.auth_type == "bearer" else []
        await _send_refusal(send, 401, "unauthorized", extra)

SESSION_HEADER = b"mcp-session-id"
#: Requests a session makes for `initialize` and `notifications/initialized`; a session that made no more was
#: never used, and is the first to end at the cap.
_HANDSHAKE_REQUESTS = 2


class SessionLimiter:
    """Pure ASGI in front of the MCP endpoint: keeps the SDK's sessions at or under `max_sessions`.

    The SDK (mcp 2.3.0) refuses a new session with 503 once 10,000 are open and ends a session after 30 idle
    minutes, so 10,000 bare `initialize` calls locked every new client out for half an hour. Here, before a
    request that opens a session, idle sessions are ended while the cap is reached: those never used after the
    handshake first, then the one whose last request is oldest. An ended session's next request gets 404,
    after which an MCP client re-initializes (the spec's rule). Only when every session has a request in
    flight is the newcomer refused (503).

    Idle means no POST or DELETE in flight: an open `GET /mcp` event stream neither makes a session busy nor
    counts as a use (the SDK counts it as in flight and suspends its idle timeout, so N sessions holding one
    stream each locked every newcomer out for as long as the streams stayed open). The trade-off: at the cap,
    a client that only listens on its stream loses its session before one that makes requests; it gets 404
    next time and re-initializes. This reads the session manager's private `_server_instances` and
    `_discard_session` (pinned SDK; a test covers it).
    """

    def __init__(self, app: Any, max_sessions: int, path: str = "/mcp") -> None:
        self.app, self.max_sessions, self.path = app, max_sessions, path
        self._requests: OrderedDict[str, int] = OrderedDict()  # session id -> requests, least recent first
        self._in_flight: dict[str, int] = {}  # session id -> POST/DELETE requests being served

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        session = dict(scope.get("headers", [])).get(SESSION_HEADER)
        if session is not None:
            await self._serve_session(session.decode("latin-1"), scope, receive, send)
            return
        manager = _session_manager(scope)
        if manager is not None and not await self._make_room(manager):
            log.warning("refused a new MCP session: all %d sessions are busy", self.max_sessions)
            await _send_refusal(send, 503, "too many busy sessions")
            return
        created: list[str] = []
        try:
            await self.app(scope, receive, self._recording(send, created))
        finally:
            for sid in created:
                self._done(sid)

    async def _serve_session(self, sid: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("method") == "GET":  # an event stream: neither a use nor busy (see the class docstring)
            await self.app(scope, receive, send)
            return
        if sid in self._requests:
            self._requests[sid] += 1
            self._requests.move_to_end(sid)
        self._in_flight[sid] = self._in_flight.get(sid, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._done(sid)

    def _done(self, sid: str) -> None:
        left = self._in_flight.get(sid, 0) - 1
        if left > 0:
            self._in_flight[sid] = left
        else:
            self._in_flight.pop(sid, None)

    def _recording(self, send: Any, created: list[str]) -> Any:
        async def record(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sid = dict(message.get("headers", [])).get(SESSION_HEADER)
                if sid is not None:
                    sid_text = sid.decode("latin-1")
                    self._requests[sid_text] = 1
                    self._in_flight[sid_text] = self._in_flight.get(sid_text, 0) + 1  # until `initialize` ends
                    created.append(sid_text)
            await send(message)
        return record

    def _victim(self, sessions: dict[str, Any]) -> str | None:
        idle = [sid for sid in sessions if not self._in_flight.get(sid)]
        if not idle:
            return None
        order = {sid: n for n, sid in enumerate(self._requests)}
        # Never used first, then least recently used; sessions we never saw (none, normally) count as oldest.
        return min(idle, key=lambda sid: (self._requests.get(sid, 0) > _HANDSHAKE_REQUESTS, order.get(sid, -1)))

    async def _make_room(self, manager: Any) -> bool:
        sessions = manager._server_instances
        for sid in [s for s in self._requests if s not in sessions]:
            del self._requests[sid]  # ended by the client (DELETE) or the idle timeout
        while len(sessions) >= self.max_sessions:
            sid = self._victim(sessions)
            if sid is None:
                return False
            await manager._discard_session(sid, sessions[sid])  # forgets it at once, then terminates it
            self._requests.pop(sid, None)
            log.info("ended idle MCP session %s to make room (max_http_sessions=%d)", sid[:8], self.max_sessions)
        return True


#: The SDK's request body cap (mcp 2.3.0, 4 MiB, answered 413); a body is recorded for the reply no further.
_MAX_RECORDED_BODY = 4 * 1024 * 1024
_SDK_REJECTIONS = ("Validation error:", "Parse error:")


class MalformedRequestReplies:
    """Pure ASGI in front of the MCP endpoint: rewrites the SDK's reply to a POST body that is not a JSON-RPC
    message (400, id null, -32602 and pydantic's multi-line validation dump as the message) into the reply
    stdio gives (research_agent.mcp.stdio.rejection: -32700/-32600/-32602, the request's id, one sentence and
    data.guidance). It only watches: the body is recorded as the SDK reads it, and only a 400 whose message
    starts like the SDK's parse or validation errors is replaced; everything else passes unchanged."""

    def __init__(self, app: Any, path: str = "/mcp") -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path", "").rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def recording() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request" and len(body) <= _MAX_RECORDED_BODY:
                body.extend(message.get("body", b""))
            return message

        await self.app(scope, recording, _RewritingSend(send, body))


class _RewritingSend:
    """`send` for MalformedRequestReplies: holds a 400's start until its body shows whose error it is."""

    def __init__(self, send: Any, request_body: bytearray) -> None:
        self._send, self._request_body, self._held = send, request_body, None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 400:
            self._held = message
            return
        if self._held is not None and message["type"] == "http.response.body":
            start, self._held = self._held, None
            answer = None if message.get("more_body") else self._answer(message.get("body", b""))
            if answer is not None:
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                start = {**start, "headers": headers + [(b"content-length", str(len(answer)).encode())]}
                message = {**message, "body": answer}
            await self._send(start)
        await self._send(message)

    def _answer(self, sdk_body: bytes) -> bytes | None:
        from research_agent.mcp.stdio import rejection

        try:
            sdk_error = json.loads(sdk_body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return None
        if not str(sdk_error).startswith(_SDK_REJECTIONS) or len(self._request_body) > _MAX_RECORDED_BODY:
            return None
        answer = rejection(self._request_body.decode("utf-8", errors="replace"))
        return json.dumps(answer).encode() if answer is not None else None


def _session_manager(scope: dict[str, Any]) -> Any:
    """The streamable-HTTP session manager of the Starlette app serving this request (FastMCP sets it on the
    MCP route's endpoint when the app starts)."""
    for route in getattr(scope.get("app"), "routes", ()):
        manager = getattr(getattr(route, "endpoint", None), "session_manager", None)
        if manager is not None and hasattr(manager, "_server_instances"):
            return manager
    return None


class _RequestDeadlines:
    """Mixed in before uvicorn's protocol class by `header_timeout_protocol` (which sets the two deadlines)."""

    header_seconds: float = 10.0
    body_seconds: float | None = None
    _header_timer: Any = None
    _armed_cycle: Any = None
    _started: float = 0.0
    _body_timer: Any = None
    _body_cycle: Any = None

    def _arm(self) -> None:
        self._armed_cycle, self._started = self.cycle, self.loop.time()
        self._header_timer = self.loop.call_later(self.header_seconds, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.cycle is self._armed_cycle and not self.transport.is_closing():
            self.transport.close()  # no request's headers arrived in time

    def _watch_body(self) -> None:
        cycle = self.cycle
        if cycle is None or self.body_seconds is None:
            return
        if cycle.more_body and cycle is not self._body_cycle:
            self._cancel_body_timer()
            self._body_cycle = cycle
            self._body_timer = self.loop.call_at(self._started + self.body_seconds, self._body_deadline)
        elif not cycle.more_body and cycle is self._body_cycle:
            self._cancel_body_timer()  # the request has been read whole

    def _body_deadline(self) -> None:
        self._body_timer = None
        cycle = self._body_cycle
        if cycle is self.cycle and cycle.more_body and not self.transport.is_closing():
            log.info("closed a connection whose request body was still incomplete after %g s", self.body_seconds)
            self.transport.close()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        between_requests = self.cycle is None or self.cycle.response_complete
        if between_requests and (self._header_timer is None or self._armed_cycle is not self.cycle):
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._arm()  # a new request on a kept-alive connection
        super().data_received(data)  # type: ignore[misc]
        self._watch_body()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._cancel_body_timer()
        super().connection_lost(exc)  # type: ignore[misc]


def header_timeout_protocol(seconds: float, body_seconds: float | None = None) -> type:
    """uvicorn's HTTP protocol class with a deadline for request headers and one for the whole request.

    uvicorn 0.54 times out idle keep-alive connections (5 s) but arms nothing when a connection opens, nor
    while a request trickles in: a socket that sends nothing, headers a byte a minute, or complete headers and
    then a body a byte at a time, holds a descriptor forever, and enough of them starve real clients
    (descriptors run out: 260 such sockets at a desktop's 256). The header deadline (`seconds`) is armed when a
    connection opens and when a new request starts on a kept-alive one; if no request's headers have completed
    by then, the connection is closed. The request deadline (`body_seconds`, counted from the same start) closes
    a connection whose request body is still incomplete by then; a streamed response (an open GET event
    stream, a POST answered as SSE) is not affected once its request has been read.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # uvicorn without httptools uses h11; the hooks used exist on both
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type("HeaderTimeoutProtocol", (_RequestDeadlines, base),
                {"header_seconds": seconds, "body_seconds": body_seconds})


#: Seconds between two logged "socket.accept() out of system resource" errors. At the descriptor limit
#: asyncio (CPython 3.11) logs that error with a traceback for every accept attempt of its 2,048-long batch
#: and schedules as many retries: 45,000 tracebacks in 5 s, 200 MB of stderr in 40 s.
ACCEPT_ERROR_LOG_INTERVAL = 30.0
_ACCEPT_ERRORS = ("socket.accept() out of system resource",
                  "Exception in callback BaseSelectorEventLoop._start_serving")


class AcceptErrorLogLimit:
    """A logging filter for the `asyncio` logger: lets one accept error (descriptors or memory ran out) through
    per ACCEPT_ERROR_LOG_INTERVAL, with the number left out since the last one; other records pass."""

    def __init__(self, interval: float = ACCEPT_ERROR_LOG_INTERVAL, clock: Any = None) -> None:
        import time

        self.interval, self._clock = interval, clock or time.monotonic
        self._last: float | None = None
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_ACCEPT_ERRORS):
            return True
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            self._dropped += 1
            return False
        if self._dropped:
            record.msg = f"{record.msg} ({self._dropped} more like it in the last {now - self._last:.0f} s not logged)"
        self._last, self._dropped = now, 0
        return True


def limit_accept_error_logs() -> None:
    """Install AcceptErrorLogLimit on the `asyncio` logger (once)."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptErrorLogLimit) for f in logger.filters):
        logger.addFilter(AcceptErrorLogLimit())


__all__ = ["AUTH_TYPES", "MIN_API_KEY_CHARS", "AcceptErrorLogLimit", "AuthMiddleware", "HostOriginGuard",
           "MalformedRequestReplies", "SessionLimiter", "allowed_hosts", "allowed_origins", "check_http_settings",
           "header_timeout_protocol", "is_loopback", "limit_accept_error_logs"]
