"""Who may talk to the HTTP server: no auth on loopback only, bearer tokens, or an `X-API-Key` header.

The check is one small ASGI middleware in front of the whole app (the MCP endpoint and anything else),
with `/health` left public; a refused request gets 401 and nothing else (no hint which part was wrong).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from typing import Any

from research_agent.errors import ConfigError

AUTH_TYPES = ("none", "bearer", "api-key")
PUBLIC_PATHS = frozenset({"/health"})
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


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
    return auth, keys


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
        body = json.dumps({"error": "unauthorized"}).encode()
        response_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if self.auth_type == "bearer":
            response_headers.append((b"www-authenticate", b'Bearer realm="research-agent"'))
        await send({"type": "http.response.start", "status": 401, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})


__all__ = ["AUTH_TYPES", "AuthMiddleware", "check_http_settings", "is_loopback"]
