"""The MCP stdio transport, with `initialize` and the lists answered within milliseconds of spawn.

Importing FastMCP, the MCP SDK and every tool's models costs 0.6-1.3 s on 2 cores (2-3 s under load), and
MCP clients wait for the `initialize` answer, then list tools, before anything else. So `start_early()`,
called before those imports, claims the wire: it keeps private duplicates of stdin and stdout, points fds 0
and 1 at /dev/null and stderr (nothing a library prints can reach the wire), and a thread reads every line,
answering the client's `initialize` with the result the SDK would give (`early.initialize_result`), then
tools/list, prompts/list, resources/list and resources/templates/list from the SDK's own bytes, generated
from the live server (research_agent/mcp/early.py). Everything else waits in order. `serve()` then runs the
FastMCP server on the claimed streams, replaying every line to the SDK, so its session state and our
middleware see the ordinary session, and dropping the SDK's duplicate answers: a difference is logged, and
for a list a list_changed notification makes the client list again (a test keeps them equal).

More duties of the wire: a line the SDK cannot parse as a JSON-RPC message is answered here (the SDK
logs it and sends nothing, so a client waiting on that id would hang), and once the client closes stdin the
process exits within STDIN_EOF_GRACE_SECONDS, whatever a tool call is still waiting for. Ctrl-C (SIGINT) ends it
with INTERRUPTED_EXIT (130), as everywhere else in `research-agent`: at once while only the front answers (nothing
is open yet), else after the server winds down, at most launch.INTERRUPT_GRACE_SECONDS later; SIGTERM likewise,
with 143. A rejected line is logged escaped (launch.loggable). Settings rejected
once the front has answered (`refuse`): the requests received meanwhile get their error, not a closed pipe.

Only the standard library (and research_agent.mcp.early and .launch, which import only it) is imported at module
level: this runs before anything heavy.

Over 400 lines because every duty above shares the claimed descriptors and the Wire's state (what was answered
early, whether the SDK reads yet); the stateless JSON-RPC line checks (`rejection`, about 75 lines) are the part
to move out next.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from research_agent.mcp.early import LIST_CHANGED, REGENERATE, early_response, stored_answers
from research_agent.mcp.launch import (
    INTERRUPTED_EXIT,
    exit_later,
    interrupted,
    launch_transport,
    loggable,
    starting,
    stop_exit_code,
    stop_reason,
    stop_starting,
    watch_interrupts,
)

log = logging.getLogger("research_agent.mcp")

#: Seconds the process may take to wind down after the client closed stdin. Its answers can no longer be
#: delivered; a tool call waiting for another process's write lock (RESEARCH_AGENT_LOCK_TIMEOUT, 60 s) kept
#: it alive 143 s. A write cut short here is undone like a killed writer's (its intent record).
STDIN_EOF_GRACE_SECONDS = 5.0
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
#: A server refused by its settings (`refuse`) answers the lines its client sent until none came for this long
#: (0.2 s: a client's writes right after `initialize` are in flight), REFUSAL_WAIT_SECONDS at most.
REFUSAL_QUIET_SECONDS = 0.2
REFUSAL_WAIT_SECONDS = 2.0
#: Lines read ahead while the server loads (then reading waits, as a full pipe would): a bound on memory.
EARLY_QUEUE_LINES = 1024


def drop_working_directory_from_path() -> None:
    """Take the working directory ('' or its path) off sys.path before `research-agent serve` imports
    `mcp_server`: editors start servers in the open workspace, and a cloned repository's `mcp_server.py` must
    not be imported instead of ours (a PYTHONPATH with an empty entry would allow it). mcp_server.py does the
    same for itself in its first lines, before research_agent can be imported safely."""
    import sys

    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        return
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != cwd]


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Wire:
    """The claimed stdin/stdout. A thread reads every line the client sends into `lines`, in order; until the
    server starts reading (`received`), it answers a first `initialize` and then the lists of LIST_METHODS
    from the snapshot (research_agent/mcp/early.py). `answered` keeps what it sent, by request id, so the SDK's
    own answers to the replayed requests are checked and dropped (`_DedupStdout`)."""

    def __init__(self) -> None:
        self.in_fd = _dup_above_std(0)
        self.out_fd = _dup_above_std(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        self.reader = os.fdopen(self.in_fd, "rb", closefd=False)
        self.lines: queue.Queue[bytes | None] = queue.Queue(maxsize=EARLY_QUEUE_LINES)
        self.answered: dict[Any, tuple[str, dict[str, Any]]] = {}  # request id -> (method, response sent)
        self._lists = stored_answers() or {}
        self._version: str | None = None  # negotiated by an `initialize` answered here
        self._lock = threading.Lock()
        self._serving = False
        self._released = False
        self._thread = threading.Thread(target=self._read, name="mcp-handshake", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        # No imports and no logging here: the main thread is importing at the same time.
        first = True
        while not self._released:
            line = self.reader.readline()
            if not line:
                break
            with self._lock:
                if not self._serving:
                    try:
                        self._answer_early(line, first)
                    except Exception:  # noqa: BLE001 - this thread must live: it feeds the SDK every line
                        pass  # the SDK answers the line instead (a lone-surrogate id once killed this thread)
            first = first and not line.strip()  # a blank line before initialize is no message
            self.lines.put(line)  # after any early answer is recorded in `answered`, so the SDK's is recognised
        self.lines.put(None)

    def _answer_early(self, line: bytes, first: bool) -> None:
        if line.startswith(b"\xef\xbb\xbf"):  # json.loads takes a BOM, the SDK does not: it answers the line
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # the SDK's parser and `rejection` answer it
            return
        if isinstance(message, dict) and message.get("id") in self.answered:
            return  # a reused id: the SDK answers each request once, and its answers are matched by id
        answer = early_response(message, first, self._version, self._lists)
        if answer is None:
            return
        text, self._version = answer
        _write_all(self.out_fd, (text + "\n").encode())
        self.answered[message["id"]] = (message["method"], json.loads(text))

    async def received(self) -> Any:
        """Every line the client sent, decoded, in order (those answered early too: the SDK must see the whole
        session), until the client closes stdin. From the first read on, nothing more is answered early."""
        with self._lock:
            self._serving = True
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                line = await _in_daemon_thread(self.lines.get)
            if line is None:
                return
            yield line.decode("utf-8", errors="replace")

    def release(self) -> None:
        """Give fds 0 and 1 back (the HTTP transport does not use them); the reader stops after its next line."""
        self._released = True
        with self._lock:
            self._serving = True
        os.dup2(self.out_fd, 1)
        os.dup2(self.in_fd, 0)

    def refuse(self, error: dict[str, Any]) -> None:
        """Answer every request read so far, and those arriving until REFUSAL_QUIET_SECONDS pass without one,
        with the JSON-RPC `error`, but those answered early; then stop answering."""
        import time

        with self._lock:
            self._serving = True
        deadline = time.monotonic() + REFUSAL_WAIT_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(REFUSAL_QUIET_SECONDS, left))
            except queue.Empty:
                return
            if line is None:
                return
            request_id = _request_id(line)
            if request_id is not None and request_id not in self.answered:
                reply = {"jsonrpc": "2.0", "id": request_id, "error": error}
                _write_all(self.out_fd, (json.dumps(reply, separators=(",", ":")) + "\n").encode())

    def finish_line(self) -> None:
        """Wait (1 s at most: a client that stopped reading may never let it end) for an early answer being
        written, so a process ending now leaves stdout on a whole line."""
        self._lock.acquire(timeout=1.0)


async def _in_daemon_thread(call: Callable[[], Any]) -> Any:
    """`call()`'s result, waited for in a daemon thread. An AnyIO worker thread is no daemon, and the interpreter
    joins those at exit: one blocked reading stdin kept a Ctrl-C'd server alive for ever (finding 5). A wait
    cancelled meanwhile leaves its thread to end with the process."""
    import asyncio

    loop = asyncio.get_running_loop()
    result = loop.create_future()

    def wait() -> None:
        value = call()
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, result, value)

    threading.Thread(target=wait, name="mcp-stdin-wait", daemon=True).start()
    return await result


def _settle(future: Any, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _request_id(line: bytes) -> Any:
    """The id of a line that is a JSON-RPC request (a string or an integer), else None."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    request_id = message.get("id")
    return request_id if isinstance(request_id, (int, str)) and not isinstance(request_id, bool) else None


def _dup_above_std(fd: int) -> int:
    try:
        import fcntl
    except ImportError:  # Windows: fds 0-2 are open, so a duplicate lands above them
        return os.dup(fd)
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


_early: Wire | None = None

def start_early(transport: str | None = None, port: str | None = None) -> None:
    """Claim the wire and answer `initialize` in the background when the launch is stdio and its transport and
    port (`transport`, `port`: the flags, if any; else the environment) are ones the settings accept
    (`launch_transport`). When the settings later turn out to select HTTP, `release()` undoes this."""
    global _early
    if _early is not None or launch_transport(transport, port) != "stdio":
        return
    try:
        _early = Wire()
    except OSError:  # no stdin/stdout to claim (closed descriptors): serve() claims them or fails itself
        _early = None
        return
    # Ctrl-C now exits at once (launch.exit_while_starting) after any early answer being written: nothing is open
    # yet, and a KeyboardInterrupt raised in the middle of an import printed a traceback.
    starting(finish=_early.finish_line)


def release() -> None:
    """The server will not use stdio: restore fds 0 and 1 if `start_early` claimed them, and Ctrl-C's default."""
    global _early
    if _early is not None:
        _early.release()
        _early = None
    stop_starting()


def refuse(error: Exception) -> None:
    """The server will not start: its settings were rejected (a ConfigError, exit 3) after the front had answered
    `initialize`. Requests the client sent meanwhile get `error` as their JSON-RPC error (-32001, data.guidance
    naming the setting) instead of a closed pipe; those answered early keep their answers. A no-op when the
    front did not claim stdio."""
    global _early
    wire, _early = _early, None
    if wire is None:
        return
    try:
        from research_agent.mcp.errors import to_mcp_error

        wire.refuse(to_mcp_error(error).error.model_dump(exclude_none=True))
    except Exception:  # noqa: BLE001 - the caller reports `error` and exits either way
        log.exception("could not answer the requests received before the server failed to start")


def _error(request_id: Any, code: int, message: str, guidance: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": f"{message}. {guidance}",
            "data": {"type": "InvalidRequest" if code != INVALID_PARAMS else "InvalidParams", "guidance": guidance,
                     "retryable": False}}}


_GUIDANCE = 'Send one JSON object per line: {"jsonrpc": "2.0", "id": 1, "method": "...", "params": {...}}.'


def _top_level_id(line: str) -> Any:
    """The top-level "id" (a string or an integer) of a line too deeply nested for json.loads, else None.

    json.loads recurses once per level and raises RecursionError near 1,000 levels; this scan keeps a depth
    counter instead, decoding only strings (flat) and the id's own value.
    """
    decoder, depth, i = json.JSONDecoder(), 0, 0
    while i < len(line):
        char = line[i]
        if char == '"':
            try:
                text, i = decoder.raw_decode(line, i)
            except ValueError:
                return None
            rest = line[i:].lstrip()
            if depth == 1 and text == "id" and rest.startswith(":"):
                try:
                    value = decoder.raw_decode(rest[1:].lstrip())[0]
                except (ValueError, RecursionError):
                    return None
                return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None
            continue
        depth += (char in "{[") - (char in "}]")
        i += 1
    return None


def rejection(line: str) -> dict[str, Any] | None:
    """The error response for a line the SDK rejected, or None when no answer is due (a notification or a
    client's response: JSON-RPC answers neither)."""
    guidance = _GUIDANCE
    try:
        message = json.loads(line)
    except ValueError:
        return _error(None, PARSE_ERROR, "Parse error: the line is not valid JSON", guidance)
    except RecursionError:
        return _error(_top_level_id(line), INVALID_REQUEST, "Invalid Request: the message is nested too deeply "
                      "(about 200 levels at most)", guidance)
    if not isinstance(message, dict):
        return _error(None, INVALID_REQUEST, "Invalid Request: expected a JSON object (batches are not supported)",
                      guidance)
    if "id" not in message or ("method" not in message and ("result" in message or "error" in message)):
        return None
    request_id = message["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return _error(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer", guidance)
    if message.get("jsonrpc") != "2.0":
        return _error(request_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', guidance)
    if not isinstance(message.get("method"), str):
        return _error(request_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string', guidance)
    if not isinstance(message.get("params", {}), dict):
        return _error(request_id, INVALID_PARAMS, 'Invalid params: "params" must be a JSON object',
                      "Send the method's arguments as an object (see tools/list for a tool's inputSchema).")
    return _error(request_id, INVALID_REQUEST, "Invalid Request: the message does not match the JSON-RPC schema",
                  guidance)


_PASS = object()  # `_ReplayStdin._check`: hand the line to the SDK


class _ReplayStdin:
    """The SDK's stdin: the first message again, then the rest of the stream; lines the SDK would drop
    unanswered are answered through `reply` instead, and `on_eof` runs when the client closes stdin."""

    def __init__(self, first: str, rest: Any, validate: Callable[[str], Any], reply: Callable[[dict], Any],
                 on_eof: Callable[[], None]) -> None:
        self._first, self._rest = first, rest
        self._validate, self._reply, self._on_eof = validate, reply, on_eof

    def __aiter__(self) -> Any:
        return self._lines()

    async def _lines(self) -> Any:
        if await self._accept(self._first):
            yield self._first
        async for line in self._rest:
            if await self._accept(line):
                yield line
        self._on_eof()

    async def _accept(self, line: str) -> bool:
        """True to pass the line to the SDK; otherwise it is answered here (or dropped, for a notification).
        Nothing raised on this path may escape: it would end the server and every later request with it."""
        if not line.strip():
            return False
        try:
            answer = self._check(line)
        except Exception:
            log.exception("could not check a JSON-RPC line; answering it as invalid")
            answer = _error(None, INVALID_REQUEST, "Invalid Request: the message could not be read", _GUIDANCE)
        if answer is _PASS:
            return True
        # The client's bytes, escaped: a raw ESC sequence, \r or U+2028 would forge a log line or clear a terminal.
        log.warning("rejected a malformed JSON-RPC line (%s): %s", "answered" if answer else "not answered",
                    loggable(line.strip()[:200]))
        if answer is not None:
            await self._reply(answer)
        return False

    def _check(self, line: str) -> Any:
        """_PASS, or the error reply for the line (None: no reply due)."""
        try:
            message = self._validate(line)  # the SDK's own parser: what it accepts goes to it unchanged
        except Exception:
            return rejection(line)
        if hasattr(message, "method") and not hasattr(message, "id") and '"id"' in line:
            # The SDK reads a request whose id is a float, bool, object or array as a notification and would
            # never answer it; JSON-RPC wants -32600 with id null. (An explicit null id stays a notification.)
            parsed = json.loads(line)
            if isinstance(parsed, dict) and parsed.get("id") is not None:
                return rejection(line)
        return _PASS


def exit_after_grace(seconds: float = STDIN_EOF_GRACE_SECONDS) -> None:
    """The client is gone: end the process in `seconds` if it has not ended by itself (a daemon timer)."""
    exit_later(seconds, 0, "client closed stdin")


class _DedupStdout:
    """The SDK's stdout, minus its answers to the requests the early thread already answered (`Wire.answered`)."""

    def __init__(self, out: Any, answered: dict[Any, tuple[str, dict[str, Any]]]) -> None:
        import anyio

        self._out, self._answered = out, answered
        self._lock = anyio.Lock()  # our own replies and the SDK's share the stream, one whole line at a time

    async def send(self, message: dict[str, Any]) -> None:
        async with self._lock:
            await self._out.write(json.dumps(message, separators=(",", ":")) + "\n")
            await self._out.flush()

    async def write(self, data: str) -> None:
        if self._answered and await self._answered_early(data):
            return
        async with self._lock:
            await self._out.write(data)
            await self._out.flush()

    async def _answered_early(self, data: str) -> bool:
        """Whether `data` is the SDK's answer to a request answered early (then it is dropped). A different
        answer is logged; for a list, the client is told to list again, so it ends up with the SDK's."""
        try:
            message = json.loads(data)
        except ValueError:
            return False
        if not (isinstance(message, dict) and "method" not in message and message.get("id") in self._answered):
            return False
        method, sent = self._answered.pop(message["id"])
        if "error" in message:  # e.g. -32000 "Connection closed": the client left once it had the early answer
            log.debug("the SDK answered the early-answered %s with an error: %.300s", method, message)
        elif message != sent:
            stale = f" (a stale snapshot: run {REGENERATE})" if method in LIST_CHANGED else ""
            log.warning("early %s answer differs from the SDK's%s: sent %.300s, SDK %.300s", method, stale, sent,
                        message)
            if stale:
                await self.send({"jsonrpc": "2.0", "method": LIST_CHANGED[method]})
        return True

    async def flush(self) -> None:
        pass  # every write is flushed under the lock


def serve(server: Any) -> None:
    """Run a FastMCP server over stdio until the client closes stdin (what `FastMCP.run("stdio")` does, on
    the wire `start_early` claimed, or claimed now)."""
    global _early
    wire, _early = _early or Wire(), None

    import anyio

    stop_starting()  # the event loop's handling takes over (watch_interrupts: Ctrl-C and SIGTERM)
    try:
        anyio.run(_serve, server, wire)
    except KeyboardInterrupt:
        raise SystemExit(stop_exit_code() if interrupted() else INTERRUPTED_EXIT) from None
    except BaseException as exc:  # noqa: BLE001 - re-raised unless a stop signal ended the session
        # Cancelled by a stop signal, the session ends in CancelledError, or (the cancel meeting the SDK's stdin
        # relay mid-send, seen under load) in an ExceptionGroup of anyio.BrokenResourceError: a stopped server
        # exits the signal's code, not 1 with a traceback. Anything else (a clean-up that failed) is logged with
        # its traceback first.
        if isinstance(exc, SystemExit) or not interrupted():
            raise
        if not _ended_by_the_stop(exc):
            log.warning("the server stopped (%s) and its session ended in an error", stop_reason(), exc_info=exc)
    if interrupted():
        raise SystemExit(stop_exit_code())


def _ended_by_the_stop(exc: BaseException) -> bool:
    """Whether `exc` is what cancelling a session leaves: CancelledError, or an exception group of those and of
    anyio's Broken/ClosedResourceError (streams closed under a task mid-send)."""
    import asyncio

    import anyio

    if isinstance(exc, BaseExceptionGroup):
        return all(_ended_by_the_stop(inner) for inner in exc.exceptions)
    return isinstance(exc, (asyncio.CancelledError, anyio.BrokenResourceError, anyio.ClosedResourceError))


async def _serve(server: Any, wire: Wire) -> None:
    import anyio
    import mcp_types
    from fastmcp.server.context import reset_transport, set_transport
    from mcp.server.stdio import stdio_server

    watch_interrupts()  # Ctrl-C: the session is cancelled, and the process ends within a few seconds
    token = set_transport("stdio")
    try:
        # FastMCP.run_stdio_async (fastmcp 4.1.2) with our streams: it offers no parameter for them.
        async with server._lifespan_manager():
            lines = wire.received()
            first = await anext(lines, None)
            if first is None:
                return
            stdout = _DedupStdout(anyio.wrap_file(io.TextIOWrapper(os.fdopen(wire.out_fd, "wb", closefd=False),
                                                                   encoding="utf-8")), wire.answered)
            stdin = _ReplayStdin(first, lines,
                                 validate=lambda line: mcp_types.jsonrpc_message_adapter.validate_json(
                                     line, by_name=False),
                                 reply=stdout.send, on_eof=exit_after_grace)
            async with stdio_server(stdin, stdout) as (read_stream, write_stream):
                await server._mcp_server.run(read_stream, write_stream,
                                             server._mcp_server.create_initialization_options())
    finally:
        reset_transport(token)
