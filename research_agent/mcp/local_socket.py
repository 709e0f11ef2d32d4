"""The server's side of the local query socket (research_agent/search/local_server.py has the protocol and the
CLI's side): a long-lived MCP server (stdio or HTTP, never an in-memory or one-shot one) on an embedded store
answers `research-agent query` from the same user's processes with the same service call through the same read
policy as the query_knowledge_base tool (calls.py: warm-up, concurrency slot, store session, call timeout).

Threads: one daemon thread accepts (polling a stop flag every ACCEPT_POLL s, so the server's exit is not held
up); each connection gets a daemon thread (at most MAX_CONNECTIONS at once, others are declined) that reads the
request with a deadline and hands the call to the server's event loop (anyio.from_thread with the loop's token).
While a call runs, a second thread sends an empty line every KEEPALIVE s, so a CLI sees a stopped server within
IDLE_TIMEOUT (search/local_server.py). Any failure of one connection (a request that breaks json, RecursionError)
logs one line and closes that connection. The socket is removed at close, at exit (atexit) and on SIGTERM (a
handler chained before the one that was there, installed when listening starts in the main thread); at start the
folder's dead sockets (connect refused: their servers were killed) are swept. Nothing here writes to stdout; what it
logs is INFO or DEBUG, and WARNING once when the socket folder is unsafe (the feature is then off).
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import signal
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

from research_agent.discovery import discover_context
from research_agent.errors import ResearchAgentError
from research_agent.mcp import launch
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
    "discover": (discover_context, Calls("discover_context")),
}


def long_lived(state: ServerState) -> bool:
    """A stdio server (FastMCP marks the transport while it serves) or one launched for HTTP; not an in-memory
    server of a test or of the early front's self-check."""
    from fastmcp.server.context import _current_transport

    return _current_transport.get() == "stdio" or state.container.settings.transport == "http"


_warned_folder: set[str] = set()


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
        path, problem = wire.locate(settings, create=True)
        if path is None:
            if problem not in _warned_folder:  # a squatted folder turns the feature off for good: say it once
                _warned_folder.add(problem)
                log.warning("local socket: not listening: %s", problem)
            raise _NotListening(problem)
        self.path = path
        self.sock = _bind(path)
        self._inode = os.stat(path).st_ino
        atexit.register(self._unlink)
        launch.on_exit_now(self._unlink)  # a forced exit (the stop's grace ran out) runs no atexit
        self._sigterm = _chain_sigterm(self._unlink)
        self.thread = threading.Thread(target=self._accept, name="local-socket", daemon=True)
        self.thread.start()
        log.info("local socket: listening on %s", path)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2 * ACCEPT_POLL + 1)
        self.sock.close()
        self._unlink()
        atexit.unregister(self._unlink)
        launch.forget_on_exit_now(self._unlink)
        _unchain_sigterm(self._sigterm)

    def _unlink(self) -> None:
        """Remove the socket if it is still ours (a later server may have taken the name since)."""
        try:
            if os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    def _accept(self) -> None:
        try:
            swept = sweep(self.path.parent, keep=self.path)
            if swept:
                log.info("local socket: removed %d dead socket(s) from %s", swept, self.path.parent)
        except Exception as exc:  # noqa: BLE001 - a sweep is tidying only
            log.debug("local socket: sweep failed: %s", exc)
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
                conn.settimeout(wire.IDLE_TIMEOUT * 4)  # a client that stops reading does not hold a thread
                wire.send_line(conn, {"accepted": True, "timeout": self.state.call_timeout})
                payload = self._answer_alive(conn, request)
                if payload is not None:
                    conn.sendall(payload)
        except OSError as exc:  # the client went away (it runs the query itself)
            log.debug("local socket: connection ended: %s", exc)
        except BaseException as exc:  # noqa: BLE001 - one connection's failure never reaches the server
            log.info("local socket: a connection failed and was closed (%s)", type(exc).__name__)
        finally:
            self._slots.release()

    def _answer_alive(self, conn: socket.socket, request: dict[str, Any]) -> bytes | None:
        """The answer line, computed while another thread sends an empty line every KEEPALIVE s (sends under a
        lock: a keep-alive never lands inside the answer); None when the client went away meanwhile."""
        done, lock, gone = threading.Event(), threading.Lock(), threading.Event()

        def keep_alive() -> None:
            while not done.wait(wire.KEEPALIVE):
                with lock:
                    if done.is_set():
                        return
                    try:
                        conn.sendall(b"\n")
                    except OSError:
                        gone.set()
                        return

        beat = threading.Thread(target=keep_alive, name="local-socket-alive", daemon=True)
        beat.start()
        try:
            answer = self._answer(request)
            try:
                payload = json.dumps(answer, separators=(",", ":")).encode() + b"\n"
            except (TypeError, ValueError) as exc:
                payload = json.dumps({"fallback": f"the answer is not JSON ({exc})"[:300]}).encode() + b"\n"
        finally:
            with lock:
                done.set()
            beat.join()
        return None if gone.is_set() else payload

    def _check(self, line: bytes) -> tuple[dict[str, Any] | None, str]:
        try:
            request = json.loads(line)
        except (ValueError, RecursionError):
            return None, "not JSON (or nested too deep)"
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
            # the hash of the code rides with the result: the CLI prints it as it is only when its code is the same
            return {"result": anyio.from_thread.run(call, token=self._token), "code": wire.code_hash()}
        except ToolFailure as failure:
            # Only an error about the request the service raised itself is the answer (wire.request_error: an
            # unknown collection, an empty query). This server's store or settings failing (ConfigError,
            # StoreUnavailableError: its folder deleted or replaced), anything retryable, an unexpected exception
            # the policy wrapped (failure.__cause__ is not coded) or a time-out (an MCPError) is rerun by the CLI,
            # which opens the store afresh.
            if isinstance(failure.error, ResearchAgentError) and isinstance(failure.__cause__, ResearchAgentError) \
                    and wire.request_error(failure.error) and wire.request_error(failure.__cause__):
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


def sweep(folder: Any, keep: Any = None) -> int:
    """Remove the sockets in `folder` (ours: this user's) whose connect is refused (ECONNREFUSED: their server was
    killed); never a live one, never anything that is not a socket (a symbolic link, a file). How many went."""
    removed = 0
    for entry in os.scandir(folder):
        path = entry.path
        if keep is not None and path == str(keep):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(wire.CONNECT_TIMEOUT)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                try:
                    if os.lstat(path).st_ino == st.st_ino:
                        os.unlink(path)
                        removed += 1
                except OSError:
                    pass
        finally:
            probe.close()
    return removed


def _chain_sigterm(cleanup: Callable[[], None]) -> Any:
    """On SIGTERM run `cleanup` (remove the socket), then what SIGTERM did before: the handler that was there, or
    the default (the process ends by the signal, as before). Only from the main thread (signal.signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return None
    if previous is None or previous == signal.SIG_IGN:  # not installed from Python, or ignored: left alone
        return None

    def on_sigterm(signum: int, frame: Any) -> None:  # the local socket's (LocalListener.close restores it)
        cleanup()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        return None
    return on_sigterm, previous


def _unchain_sigterm(chained: Any) -> None:
    """Put back the SIGTERM handler `_chain_sigterm` replaced, if its own is still the one installed."""
    if chained is None or threading.current_thread() is not threading.main_thread():
        return
    ours, previous = chained
    try:
        if signal.getsignal(signal.SIGTERM) is ours:
            signal.signal(signal.SIGTERM, previous)
    except (ValueError, OSError):
        pass


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
