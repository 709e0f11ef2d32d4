"""The local query socket (issues 12 and 16): a long-lived MCP server on an embedded store answers `research-agent
query` and `research-agent discover` (OPS) from the same user's other processes over a Unix socket, so they skip
loading Chroma's index and the models (a query: 4.1-5.4 s at 1M chunks) and read what the server's freshness
watcher has already caught up.

This module is the protocol and the CLI's side of it, on the standard library only: the CLI knows whether a server
answers before it imports chromadb, numpy or torch. The server's side is research_agent/mcp/local_socket.py.

Who may answer: only a server whose fingerprint (search/local_identity.py `fingerprint`: the resolved store, every
setting but the transport/log/limit ones, the state of the files the settings name, the package version, and
`code_hash` of the package's .py files, so a server running other code never answers) equals the CLI's. The
fingerprint names the socket (`socket_path`), so a server with other settings never sees the request; the server
compares the whole fingerprint again and declines a mismatch. Never with a Chroma server (chroma_host): those
queries stay in-process.

Where: `$XDG_RUNTIME_DIR/research-agent/<fingerprint>.sock`, else `/tmp/research-agent-<uid>/...`; the folder is
the user's own, 0700, not a symbolic link (checked with lstat on both sides: anything else, no socket), the socket
0600, and each side checks the other's uid (SO_PEERCRED). Not the store folder: a long store path would pass the
~107-byte limit of a socket path, and a store on a network or synced folder may not hold sockets. Linux only
(SO_PEERCRED); elsewhere the CLI runs in-process.

Wire: one connection per request. The CLI sends one JSON line (`{"protocol", "fingerprint", "op", "args"}`, at most
MAX_REQUEST bytes); the server answers one line at once (`{"accepted": true, "timeout": s}` or `{"declined": why}`),
then, while the call runs, an empty line every KEEPALIVE s, then one line with the answer (`{"result": ...}`,
`{"error": ResearchAgentError.to_dict(), "exit_code": n}`, or `{"fallback": why}`). Time bounds on the CLI side:
connect CONNECT_TIMEOUT, the first line ACK_TIMEOUT (a stopped server accepts connections but never answers), then
no byte for IDLE_TIMEOUT (a server stopped mid-call: the keep-alives stop), and the answer in all by the server's
own call timeout plus ANSWER_MARGIN. Any failure, decline or time-out means the CLI runs the query in-process as it
always did. Only an error about the request itself is the answer (`request_error`: a coded, not retryable
collection/document/query error, e.g. an unknown collection or an empty query); an error about the server's own
store or settings (ConfigError, StoreUnavailableError: its store folder deleted or replaced) or anything retryable
means the CLI runs it here, where the store is opened afresh. The server sends `fallback` for those, and the CLI
checks again (defence in depth); the CLI also reruns an answer that does not validate as its result model
(cli/state.py `served_result`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any

from research_agent.config import Settings
from research_agent.errors import ResearchAgentError
from research_agent.search.local_identity import PROTOCOL, code_hash, fingerprint, usable

log = logging.getLogger("research_agent.local_server")

#: The largest request line: a 1 MB document context (text a user pipes in) plus the rest of the query.
MAX_REQUEST = 1_100_000
#: The largest answer the CLI reads (a top_k of max_top_k whole chunks is well under 1 MB).
MAX_RESPONSE = 64 * 1024 * 1024
#: Seconds the CLI gives connect(); a server that does not accept by then is passed over.
CONNECT_TIMEOUT = 0.2
#: Seconds the CLI waits for the server's first line (accepted or declined) after sending its request.
ACK_TIMEOUT = 1.0
#: Seconds between the server's keep-alive lines while a call runs.
KEEPALIVE = 0.5
#: Seconds without a byte from the server, once it accepted, after which the CLI runs the query itself.
IDLE_TIMEOUT = 1.5
#: Seconds the CLI waits for an answer beyond the server's own call timeout (which bounds the call server-side).
ANSWER_MARGIN = 5.0
#: What the socket answers: the read-only operations that load models (the server half, mcp/local_socket.py
#: SERVICES, maps each to its service and call policy; tests/test_local_server.py checks they agree).
OPS = frozenset({"query", "discover"})
_MAX_SOCKET_PATH = 100  # bytes; sun_path holds 108 on Linux (107 and a NUL), kept clear of it


def request_error(error: Any) -> bool:
    """Whether a coded error is about the request itself (the answer the CLI shows) rather than about the
    server's store or settings or passing (then the CLI runs the query itself): a collection, document or query
    error that is not retryable. A ConfigError (exit 3), a StoreUnavailableError, anything retryable is not.
    `error` is the exception (server side) or its wire form, ResearchAgentError.to_dict() (CLI side)."""
    from research_agent.errors import CollectionError, DocumentError, QueryError

    if isinstance(error, ResearchAgentError):
        return isinstance(error, (CollectionError, DocumentError, QueryError)) and not error.retryable
    if not isinstance(error, dict):
        return False
    data = error.get("data")
    retryable = not isinstance(data, dict) or data.get("retryable", True) is not False
    return error.get("code") in (-32002, -32003, -32004) and not retryable


def runtime_dir() -> Path:
    """The per-user folder of sockets: $XDG_RUNTIME_DIR/research-agent, else /tmp/research-agent-<uid>. Not
    TMPDIR: a server started by an editor and a shell must agree on the folder."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_absolute():
        return Path(base) / "research-agent"
    return Path("/tmp") / f"research-agent-{os.getuid()}"


def folder_problem(path: Path, create: bool) -> str | None:
    """Why `path` is not a folder of this user's that only they can enter (missing, a symbolic link, another
    user's, open to others), or None; with `create`, made 0700 when missing. A folder someone else made first is
    refused, never repaired."""
    if create:
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot create the socket folder {path} ({exc.strerror or exc})"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "no local server for this store and these settings (no socket folder)"
    except OSError as exc:
        return f"cannot read the socket folder {path} ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"the socket folder {path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"the socket folder {path} is not a folder"
    if st.st_uid != os.getuid():
        return f"the socket folder {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & 0o077:
        return f"the socket folder {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, not 700)"
    return None


def secure_dir(path: Path, create: bool) -> bool:
    """Whether `path` is a folder of this user's that only they can enter (`folder_problem`)."""
    return folder_problem(path, create) is None


def locate(settings: Settings, create: bool = False) -> tuple[Path | None, str]:
    """(the socket of servers with these settings in a secure folder, "") or (None, why there is none)."""
    folder = runtime_dir()
    problem = folder_problem(folder, create)
    if problem is not None:
        return None, problem
    path = folder / f"{fingerprint(settings)[:32]}.sock"
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        return None, f"{path} is longer than a socket path may be"
    return path, ""


def socket_path(settings: Settings, create: bool = False) -> Path | None:
    """The socket of servers with these settings, in a secure folder; None when there is none (`locate` says
    why)."""
    return locate(settings, create)[0]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class LineReader:
    """Lines from a socket, each of at most `limit` bytes, read by a deadline (the bytes after a line are kept
    for the next: the server's two lines often arrive in one read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def line(self, limit: int, deadline: float, idle: float | None = None) -> bytes | None:
        """The next line without its newline; None when the peer closed first. Raises TimeoutError past the
        deadline (time.monotonic) or after `idle` s without a byte, ValueError past the limit."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 1]
                return line
            if len(self.buf) > limit:
                raise ValueError(f"line longer than {limit} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete line in time")
            self.sock.settimeout(remaining if idle is None else min(remaining, idle))
            try:
                chunk = self.sock.recv(min(1 << 20, limit + 2 - len(self.buf)))
            except TimeoutError:
                if idle is not None and idle < remaining:
                    raise TimeoutError(f"no byte from the server for {idle} s") from None
                raise
            if not chunk:
                if self.buf:
                    raise ValueError("the connection closed inside a line")
                return None
            self.buf += chunk


def send_line(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


class RemoteError(ResearchAgentError):
    """A coded error the server's service raised, carried over as it was (code, type, message, data, exit code)."""

    def __init__(self, error: dict[str, Any], exit_code: int) -> None:
        super().__init__(str(error["message"]))
        self.code, self.type_name, self.exit_code = int(error["code"]), str(error["type"]), int(exit_code)
        self.data = dict(error["data"])


class _Fallback(Exception):
    """The server does not answer this request: run it in-process (the message says why, at -v)."""


def ask(settings: Settings, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """The result of `op(**args)` from a matching local server, or None (logged at INFO: why) to run it here.
    Raises RemoteError for a coded error the server's service raised."""
    why = usable(settings)
    path = None
    if why is None:
        path, why = locate(settings)
    if path is None:
        log.info("%s runs in this process: %s", op, why)
        return None
    started = time.monotonic()
    try:
        answer = _exchange(path, {"protocol": PROTOCOL, "fingerprint": fingerprint(settings), "op": op,
                                  "args": args})
    except _Fallback as exc:
        log.info("%s runs in this process: %s", op, exc)
        return None
    if "error" in answer and not request_error(answer["error"]):  # the server's store, not the request
        log.info("%s runs in this process: the local server's store or settings failed (%s)", op,
                 str(answer["error"].get("message", ""))[:300])
        return None
    if "error" in answer:
        log.info("%s answered by the local server %s (%.3f s): an error", op, path, time.monotonic() - started)
        raise RemoteError(answer["error"], answer["exit_code"])
    log.info("%s answered by the local server %s (%.3f s)", op, path, time.monotonic() - started)
    return answer["result"]


def _exchange(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    payload = json.dumps(request, separators=(",", ":")).encode() + b"\n"
    if len(payload) > MAX_REQUEST:
        raise _Fallback(f"the request ({len(payload)} bytes) is larger than the socket takes ({MAX_REQUEST})")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _Fallback("no local server for this store and these settings") from None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise _Fallback(f"{path} is not this user's socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(str(path))
        except OSError as exc:  # refused: a server that was killed left its socket behind
            raise _Fallback(f"the local server does not accept ({errno.errorcode.get(exc.errno or 0, exc)})") from None
        if peer_uid(sock) != os.getuid():
            raise _Fallback("the local server runs as another user")
        try:
            sock.settimeout(ACK_TIMEOUT)
            sock.sendall(payload)
            lines = LineReader(sock)
            first = _decode(lines.line(64 * 1024, time.monotonic() + ACK_TIMEOUT))
            if "declined" in first:
                raise _Fallback(f"the local server declined: {first['declined']}")
            deadline = time.monotonic() + float(first.get("timeout", 30.0)) + ANSWER_MARGIN
            line = b""
            while line == b"":  # an empty line: the server is alive and the call still runs
                line = lines.line(MAX_RESPONSE, deadline, idle=IDLE_TIMEOUT)
            answer = _decode(line)
        except TimeoutError as exc:
            raise _Fallback(f"the local server did not answer in time ({exc})") from None
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            raise _Fallback(f"the local server's answer broke off ({type(exc).__name__}: {exc})"[:300]) from None
    finally:
        sock.close()
    if "fallback" in answer:
        raise _Fallback(f"the local server could not answer: {answer['fallback']}")
    if not (isinstance(answer.get("result"), dict) or (isinstance(answer.get("error"), dict)
                                                       and isinstance(answer.get("exit_code"), int))):
        raise _Fallback("the local server's answer is not one this version reads")
    if "result" in answer and answer.get("code") != code_hash():
        # Same code, same shape: `--json` then prints the result as it came, without importing the result models
        # (search/service.py: 250-600 ms) to check it; human output validates it anyway to render it.
        raise _Fallback("the local server's answer is not this version's result (other code)")
    if "error" in answer:
        try:
            RemoteError(answer["error"], answer["exit_code"])
        except (KeyError, TypeError, ValueError):
            raise _Fallback("the local server's error is not one this version reads") from None
    return answer


def _decode(line: bytes | None) -> dict[str, Any]:
    if line is None:
        raise ValueError("the server closed the connection")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message
