"""How a stdio launch begins and ends: which launches the early front may answer (the transport and port a launch
will serve on, checked without loading the settings), and how Ctrl-C and a departed client end the process.

Importing the settings (pydantic) costs the front its ~0.03 s lead, so this stdlib-only module keeps what
research_agent/config.py's Settings accept for `transport` and `port` (tests/test_mcp_startup_cli.py checks they
are the fields' own). Every entry point's front (mcp_server.py, `research-agent serve`, `python -m research_agent
serve`) goes through `launch_transport`: a launch the settings will reject (a ConfigError, exit 3) never shows a
client a handshake first. Other settings are checked when they load, after the early answers
(research_agent/mcp/stdio.py `refuse` then answers the requests received meanwhile).

Ctrl-C (SIGINT) exits INTERRUPTED_EXIT, quietly, at any moment from the entry's first line on. While the server starts
(`starting` until `stop_starting`: mcp_server.py's first lines, the stdio front) nothing is open yet, so it exits at
once (`exit_while_starting`); a KeyboardInterrupt raised in the middle of an import printed a traceback (exit -2 or
1), for about 1 s of an HTTP launch of mcp_server.py. While serving, asyncio's own handling cancels the session (the
lifespan closes the store) and `watch_interrupts` arms an exit INTERRUPT_GRACE_SECONDS later, whatever a tool call
waits for. SIGTERM stops a serving server the same way (`handle_stops`: the lifespan's clean-up runs, the store closed
and the local query socket removed, within the same grace) and exits TERMINATED_EXIT; a second signal exits at once;
an inherited SIG_IGN (nohup, `&` in a script) is kept for either. Before the entry's first line runs (the
interpreter's start-up, and `site` with the venv's .pth files: 10-30 ms) Ctrl-C is Python's own: killed by the signal
(which a shell reports as 130), Python's "Fatal Python error: init_import_site", or a KeyboardInterrupt traceback
and exit 1 (an interrupt landing inside `site` or the editable install's .pth finder).

`loggable` escapes what our MCP code logs from a client (control and line-breaking characters): a forged log line or a
terminal escape on `tail -f` of the log.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

#: What Settings accept (see the module docstring).
TRANSPORTS = ("stdio", "http")
PORT_RANGE = (1, 65535)
ENV_PREFIX = "RESEARCH_AGENT_"
#: Exit status for Ctrl-C (128 + SIGINT): research_agent/__main__.py's INTERRUPTED_EXIT, which a module of the
#: MCP face may not import (tests/test_mcp_signals.py checks they are equal).
INTERRUPTED_EXIT = 130
#: Seconds a Ctrl-C'd server has to wind down (close the store, finish its history) before it exits anyway: a
#: tool call waiting for another process's write lock (60 s) would hold the exit up. A write cut short is undone
#: like a killed writer's (its intent record), as after SIGTERM.
INTERRUPT_GRACE_SECONDS = 3.0
#: Exit status for SIGTERM (128 + 15), after the same clean-up as Ctrl-C's.
TERMINATED_EXIT = 143
#: The signals that stop a serving server: exit status and what the log calls it.
STOP_SIGNALS = {signal.SIGINT: (INTERRUPTED_EXIT, "interrupted (Ctrl-C)"),
                signal.SIGTERM: (TERMINATED_EXIT, "terminated (SIGTERM)")}

log = logging.getLogger("research_agent.mcp")
_interrupts = 0  # stop signals received while serving (`handle_stops`)
_stopped_by: int | None = None  # the first of them
_cut_short: Callable[[], int] | None = None  # calls a stop ends unanswered (`handle_stops`)
_finish_before_exit: Callable[[], None] | None = None  # an early answer being written (`starting`)


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


def set_interrupt_handler(handler: Any, replacing: Any) -> bool:
    """Make `handler` SIGINT's handler if the current one is `replacing` (never over an inherited SIG_IGN, nohup's
    or a background job's, nor over a caller's own handler); False if not, or off the main thread."""
    try:
        if signal.getsignal(signal.SIGINT) is not replacing:
            return False
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: signals are not ours to handle
        return False
    return True


def exit_while_starting(signum: int, frame: Any) -> None:
    """SIGINT's handler while the server starts: nothing is open yet (the store opens in the server's lifespan), so
    the process exits INTERRUPTED_EXIT now, after any early answer being written, with nothing on stderr."""
    if _finish_before_exit is not None:
        _finish_before_exit()
    exit_now(INTERRUPTED_EXIT)


def starting(replacing: Any = signal.default_int_handler, finish: Callable[[], None] | None = None) -> None:
    """From now until `stop_starting`, Ctrl-C exits at once (`exit_while_starting`), if SIGINT's handler is
    `replacing` (Python's default; mcp_server.py passes its own first one) or already ours. `finish` (the stdio
    front's `finish_line`) runs before that exit."""
    global _finish_before_exit
    if finish is not None:
        _finish_before_exit = finish
    set_interrupt_handler(exit_while_starting, replacing)


def stop_starting() -> None:
    """The caller handles KeyboardInterrupt from here (the event loop, main()'s except): Python's default handler
    again, if `starting` had set ours."""
    global _finish_before_exit
    _finish_before_exit = None
    set_interrupt_handler(signal.default_int_handler, exit_while_starting)


def handle_stops(stop: Callable[[], None], cut_short: Callable[[], int] | None = None) -> None:
    """SIGINT and SIGTERM, but either one inherited as SIG_IGN (nohup, `&` in a non-interactive shell), stop the
    server from now on: the first calls `stop` (which lets the server wind down: the lifespan closes the store and
    removes the local query socket) and arms an exit INTERRUPT_GRACE_SECONDS later whatever a call waits for; a
    second one exits at once. Off the main thread, a no-op. `cut_short` (the calls a stop ends unanswered) goes
    into the line logged when the grace runs out."""
    global _cut_short
    _cut_short = cut_short
    for signum in STOP_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue
            signal.signal(signum, lambda signum, frame: _on_stop_signal(signum, stop))
        except ValueError:  # not the main thread: signals are not ours to handle
            return


def _on_stop_signal(signum: int, stop: Callable[[], None]) -> None:
    global _interrupts, _stopped_by
    _interrupts += 1
    code, why = STOP_SIGNALS[signal.Signals(signum)]
    if _interrupts > 1:
        exit_now(code)
    _stopped_by = signum
    exit_later(INTERRUPT_GRACE_SECONDS, code, why)
    stop()


def watch_interrupts() -> None:
    """Called in the running event loop (stdio): Ctrl-C or SIGTERM cancels the session (the main task; the lifespan
    closes the store), and the process ends within INTERRUPT_GRACE_SECONDS (`handle_stops`)."""
    import asyncio

    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    if task is None:
        return

    def cancel() -> None:  # what asyncio's own SIGINT handler does (asyncio.Runner._on_sigint)
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)

    handle_stops(cancel)


def interrupted() -> bool:
    """Whether a stop signal (Ctrl-C, SIGTERM) reached the server while it served."""
    return _interrupts > 0


def stop_exit_code() -> int:
    """The exit status for the signal that stopped the server: INTERRUPTED_EXIT or TERMINATED_EXIT."""
    return STOP_SIGNALS[signal.Signals(_stopped_by)][0] if _stopped_by is not None else INTERRUPTED_EXIT


def stop_reason() -> str:
    """What the log calls the signal that stopped the server ("interrupted (Ctrl-C)")."""
    return STOP_SIGNALS[signal.Signals(_stopped_by)][1] if _stopped_by is not None else STOP_SIGNALS[signal.SIGINT][1]


#: Characters escaped in what we log from a client: C0 and C1 controls (ESC, CR, NUL, VT, ...), DEL, Unicode line
#: and paragraph separators, and the bidirectional overrides.
_UNLOGGABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def loggable(text: str) -> str:
    """`text` with every control and line-breaking character as a \\xNN or \\uNNNN escape: one line, nothing a
    terminal acts on."""
    return _UNLOGGABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                           else f"\\u{ord(m.group()):04x}", text)


def exit_later(seconds: float, code: int, why: str) -> None:
    """End the process with `code` in `seconds` unless it has ended by itself (a daemon timer)."""
    def stop() -> None:
        cut = _cut_short() if _cut_short is not None else 0
        calls = f" ({cut} call{'' if cut == 1 else 's'} cut short)" if cut else ""
        log.warning("%s %g s ago and the server is still busy%s: exiting now", why, seconds, calls)
        exit_now(code)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()


#: Quick clean-ups that must run even when the grace runs out (os._exit runs no atexit): the local socket's unlink.
_exit_hooks: list[Callable[[], None]] = []


def on_exit_now(hook: Callable[[], None]) -> None:
    """Run `hook` (quick, never raising for long) before a forced exit too; `forget_on_exit_now` takes it back."""
    _exit_hooks.append(hook)


def forget_on_exit_now(hook: Callable[[], None]) -> None:
    if hook in _exit_hooks:
        _exit_hooks.remove(hook)


def exit_now(code: int) -> None:
    """End the process at once (os._exit: no thread is waited for), the quick clean-ups run and the log flushed
    first (a server whose clean-up outlasted the grace under load left its local socket behind)."""
    for hook in list(_exit_hooks):
        try:
            hook()
        except Exception:  # a clean-up that fails must not keep the process from ending
            pass
    logging.shutdown()
    os._exit(code)
