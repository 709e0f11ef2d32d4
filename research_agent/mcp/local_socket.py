"""The server's side of the local query socket (research_agent/search/local_server.py has the protocol and the
CLI's side): a long-lived MCP server (stdio or HTTP, never an in-memory or one-shot one) on an embedded store
answers `research-agent query` from the same user's processes with the same service call through the same read
policy as the query_knowledge_base tool (calls.py: warm-up, concurrency slot, store session, call timeout).

Threads: one daemon thread accepts (polling a stop flag every ACCEPT_POLL s, so the server's exit is not held
up); each connection gets a daemon thread (at most MAX_CONNECTIONS at once, others are declined) that reads the
request with a deadline and hands the call to the server's event loop (anyio.from_thread with the loop's token).
Nothing here writes to stdout; what it logs is INFO or DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from research_agent.errors import ResearchAgentError
from research_agent.mcp.calls import Calls
from research_agent.mcp.errors import ToolFailure
from research_agent.mcp.lifespan import ServedContainer, ServerState
from research_agent.search import local_server as wire
from research_agent.search.service import query_knowledge

log = logging.getLogger("research_agent.local_server")

#: Seconds between the accept thread's looks at its stop flag.
ACCEPT_POLL = 0.25
#: Seconds a client has to send its whole request once connected.
REQUEST_DEADLINE = 5.0
#: Connections served at once; more are declined (the CLI then runs in-process) instead of queueing threads.
MAX_CONNECTIONS = 32
#: The operations the socket serves: the service function and the call policy named as the MCP tool it mirrors.
SERVICES: dict[str, tuple[Callable[..., Any], Calls]] = {
    "query": (query_knowledge, Calls("query_knowledge_base")),
}


def long_lived(state: ServerState) -> bool:
    """A stdio server (FastMCP marks the transport while it serves) or one launched for HTTP; not an in-memory
    server of a test or of the early front's self-check."""
    from fastmcp.server.context import _current_transport

    return _current_transport.get() == "stdio" or state.container.settings.transport == "http"


def start(state: ServerState, *, force: bool = False) -> LocalListener | None:
    """Listen for local queries when this server is long-lived and the settings allow it; None otherwise."""
    settings = state.container.settings
    why = wire.usable(settings)
    if why is not None or not (force or long_lived(state)):
        log.debug("local socket: not listening (%s)", why or "not a long-lived server")
        return None
    try:
        return LocalListener(state)
    except _NotListening as exc:
        log.info("local socket: not listening: %s", exc)
    except Exception as exc:  # noqa: BLE001 - the socket is an extra: the MCP server serves without it
        log.info("local socket: not listening: %s", exc)
    return None


class _NotListening(Exception):
    pass


class LocalListener:
    """The bound socket and its accept thread; `close` stops both and removes the socket if it is still ours."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        settings = state.container.settings
        self.fingerprint = wire.fingerprint(settings)
        self.container = _cli_container(state)
        self._token = anyio.lowlevel.current_token()  # the server's event loop, where the call policy runs
        self._ctx = SimpleNamespace(lifespan_context={"state": state})  # all a read policy reads of a Context
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        path = wire.socket_path(settings, create=True)
        if path is None:
            raise _NotListening("no secure socket folder (see the log line above)")
        self.path = path
        self.sock = _bind(path)
        self._inode = os.stat(path).st_ino
        self.thread = threading.Thread(target=self._accept, name="local-socket", daemon=True)
        self.thread.start()
        log.info("local socket: listening on %s", path)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2 * ACCEPT_POLL + 1)
        self.sock.close()
        try:
            if os.lstat(self.path).st_ino == self._inode:  # a later server may have taken the name since
                os.unlink(self.path)
        except OSError:
            pass

    def _accept(self) -> None:
        self.sock.settimeout(ACCEPT_POLL)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                log.debug("local socket: accept failed", exc_info=True)
                time.sleep(ACCEPT_POLL)
                continue
            if not self._slots.acquire(blocking=False):
                _quietly(partial(wire.send_line, conn, {"declined": "the server is busy"}))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="local-socket-call", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                if wire.peer_uid(conn) != os.getuid():
                    log.info("local socket: refused a connection from another user")
                    return
                try:
                    line = wire.LineReader(conn).line(wire.MAX_REQUEST, time.monotonic() + REQUEST_DEADLINE)
                except (OSError, ValueError) as exc:  # TimeoutError is an OSError
                    _quietly(partial(wire.send_line, conn, {"declined": f"unreadable request ({exc})"}))
                    return
                if line is None:
                    return
                request, reason = self._check(line)
                if request is None:
                    wire.send_line(conn, {"declined": reason})
                    return
                conn.settimeout(None)
                wire.send_line(conn, {"accepted": True, "timeout": self.state.call_timeout})
                wire.send_line(conn, self._answer(request))
        except OSError as exc:  # the client went away (it runs the query itself)
            log.debug("local socket: connection ended: %s", exc)
        finally:
            self._slots.release()

    def _check(self, line: bytes) -> tuple[dict[str, Any] | None, str]:
        try:
            request = json.loads(line)
        except ValueError:
            return None, "not JSON"
        if not isinstance(request, dict) or request.get("protocol") != wire.PROTOCOL:
            return None, "another protocol version"
        if request.get("fingerprint") != self.fingerprint:
            return None, "this server's store or settings differ"
        if request.get("op") not in SERVICES or not isinstance(request.get("args"), dict):
            return None, "unknown operation"
        if not self.state.warmup.models_ready:
            self.state.warmup.start()  # an HTTP server no client has initialized yet warms up now
            return None, "the server is still loading its models"
        return request, ""

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the request through the tool's read policy in the event loop; a coded service error is the answer,
        anything else (a time-out, an unexpected failure, the server shutting down) tells the CLI to run it."""
        fn, policy = SERVICES[request["op"]]
        args = dict(request["args"])
        text = args.pop("query", None)
        call = partial(policy.read, self._ctx, fn, self.container, text, **args)
        try:
            return {"result": anyio.from_thread.run(call, token=self._token)}
        except ToolFailure as failure:
            # Only an error the service raised itself, coded, is the answer; an unexpected exception the policy
            # wrapped (failure.__cause__ is not coded) or a time-out (an MCPError) is rerun by the CLI.
            if isinstance(failure.error, ResearchAgentError) and isinstance(failure.__cause__, ResearchAgentError):
                return {"error": failure.error.to_dict(), "exit_code": failure.error.exit_code}
            return {"fallback": str(failure)[:500] or "the call failed"}
        except Exception as exc:  # noqa: BLE001 - the CLI reruns the query and reports what it raises
            log.debug("local socket: call failed", exc_info=True)
            return {"fallback": f"{type(exc).__name__}"}


def _cli_container(state: ServerState) -> ServedContainer:
    """The container socket calls use: the server's, except that its reranker is the one a CLI process picks.

    Why: a one-shot process always reranks with the float32 numpy cross-encoder, a server with `auto` precision on
    a CPU with native bfloat16 with torch in bfloat16 (rerank.Reranker._numpy_model): scores that differ in the
    third decimal. Elsewhere both pick the same reranker, so the server's loaded one is shared."""
    from research_agent.rerank import cpu_computes_bfloat16  # models layer, not needed by the handshake

    served = state.container
    if served.settings.rerank_precision == "auto" and cpu_computes_bfloat16():
        cli = ServedContainer.adopt(served)
        cli.one_shot = True
        return cli
    return served


def _bind(path: Any) -> socket.socket:
    """Bind `path`, replacing a socket nobody accepts on (its server was killed); a live one (another server with
    the same store and settings) or anything that is not a socket is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise _NotListening(f"{path} exists and is not a socket")
        if _answers(path):
            raise _NotListening(f"another server with this store and these settings listens on {path}")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))  # inside a 0700 folder of ours (local_server.secure_dir)
        os.chmod(path, 0o600)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def _answers(path: Any) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(wire.CONNECT_TIMEOUT)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _quietly(send: Callable[[], Any]) -> None:
    try:
        send()
    except OSError:
        pass
