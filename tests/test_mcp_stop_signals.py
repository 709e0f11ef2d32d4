"""Stop signals of a running MCP server, HTTP and stdio (the attack pass after bc89292), and what its log takes from a
client: real subprocesses of mcp_server.py over real HTTP and real stdio, a real embedded store.

- Ctrl-C as uvicorn's Server.serve is entered printed a CancelledError traceback (uvicorn.error), exit 130.
- A second Ctrl-C on a running HTTP server printed a KeyboardInterrupt traceback or died by the signal (-2).
- An inherited SIG_IGN for SIGINT (nohup) was replaced by uvicorn's handler: one SIGINT stopped it, exit 0.
- SIGTERM killed the server without its lifespan's clean-up (the local query socket left behind).
- A rejected stdio line was logged verbatim: ESC sequences, \\r, U+2028, NUL (a forged log line).
"""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_mcp_early_interrupt import _wait
from test_mcp_signals import EXIT_WITHIN, _ctrl_c_reaches_children
from test_mcp_stdio import SERVER, _mcp_env

_RUNTIME: dict[Path, Path] = {}  # a test's tmp_path -> its XDG_RUNTIME_DIR
TRIES = 3  # a timing-based case is retried this often while its signal landed before the server listened


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path: Path, command: list[str], ignore_sigint: bool = False,
           **env: str) -> tuple[subprocess.Popen, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    # XDG_RUNTIME_DIR, the local query socket's folder: short (a socket path has ~107 bytes), 0700, removed at exit
    _RUNTIME[tmp_path] = runtime = Path(tempfile.mkdtemp(prefix="ra-stop-", dir="/tmp"))
    atexit.register(shutil.rmtree, runtime, True)
    err = tmp_path / "stderr.log"
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    with _ctrl_c_reaches_children(), open(err, "wb") as stderr:
        proc = subprocess.Popen(command, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                env={**_mcp_env(tmp_path), "RESEARCH_AGENT_WARMUP": "false",
                                     "XDG_RUNTIME_DIR": str(runtime), **env}, preexec_fn=preexec)
    return proc, err


def _http(tmp_path: Path, ignore_sigint: bool = False, command: list[str] | None = None) -> tuple[subprocess.Popen,
                                                                                               Path, int]:
    port = _free_port()
    proc, err = _spawn(tmp_path, command or [sys.executable, str(SERVER)], ignore_sigint,
                       RESEARCH_AGENT_TRANSPORT="http", RESEARCH_AGENT_PORT=str(port))
    return proc, err, port


def _listening(proc: subprocess.Popen, port: int) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _noise(stderr: str) -> list[str]:
    """stderr's lines but the server's own start-up line."""
    return [line for line in stderr.splitlines() if "research-agent MCP server on http://" not in line]


# Ctrl-C sent by the process to itself the moment uvicorn's Server.serve is entered (before it would capture signals).
SIGINT_AS_SERVE_STARTS = (
    "import os, runpy, signal, sys\n"
    "import uvicorn.server\n"
    "serve = uvicorn.server.Server.serve\n"
    "async def hit(self, *a, **k):\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    return await serve(self, *a, **k)\n"
    "uvicorn.server.Server.serve = hit\n"
    f"sys.argv = [{str(SERVER)!r}]\n"
    f"runpy.run_path({str(SERVER)!r}, run_name='__main__')\n")


def test_ctrl_c_as_uvicorn_starts_serving_exits_130_quietly(tmp_path):
    proc, err, _ = _http(tmp_path, command=[sys.executable, "-c", SIGINT_AS_SERVE_STARTS])
    code = _wait(proc)
    stderr = err.read_text()
    assert code == 130, stderr
    assert not _noise(stderr), stderr


def test_a_second_ctrl_c_on_a_running_http_server_exits_130_at_once_and_quietly(tmp_path):
    for attempt in range(TRIES):
        proc, err, port = _http(tmp_path / str(attempt))
        if not _listening(proc, port):
            _wait(proc)
            continue
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = _wait(proc)
        stderr = err.read_text()
        assert code == 130, stderr
        assert time.monotonic() - started < 5, stderr
        assert not _noise(stderr), stderr
        return
    raise AssertionError("the server never listened")


def test_an_inherited_sig_ign_for_sigint_is_kept_over_http_and_sigterm_then_exits_143(tmp_path):
    proc, err, port = _http(tmp_path, ignore_sigint=True)
    assert _listening(proc, port), err.read_text()
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert proc.poll() is None, f"one SIGINT stopped a server that ignores it: {proc.returncode}\n{err.read_text()}"
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # still serving
    proc.send_signal(signal.SIGTERM)
    code = _wait(proc)
    assert code == 143, err.read_text()
    assert not _noise(err.read_text()), err.read_text()


def test_sigterm_stops_an_http_server_after_its_clean_up_with_143(tmp_path):
    proc, err, port = _http(tmp_path)
    assert _listening(proc, port), err.read_text()
    sockets = _local_sockets(tmp_path, proc)
    assert sockets, "the HTTP server listens for local queries"
    proc.send_signal(signal.SIGTERM)
    code = _wait(proc)
    assert code == 143, err.read_text()
    assert not any(path.exists() for path in sockets), "the lifespan's clean-up did not run"
    assert not _noise(err.read_text()), err.read_text()


def _local_sockets(tmp_path: Path, proc: subprocess.Popen) -> list[Path]:
    """The server's local query sockets (research_agent/mcp/local_socket.py) once it has made one."""
    folder = _RUNTIME[tmp_path] / "research-agent"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(folder.glob("*.sock")) if folder.is_dir() else []
        if found:
            return found
        time.sleep(0.05)
    return []


def _handshake(proc: subprocess.Popen) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}}
    proc.stdin.write((json.dumps(hello) + "\n").encode())
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    proc.stdin.write(b'{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n')
    proc.stdin.flush()
    for _ in range(2):
        assert json.loads(proc.stdout.readline())["jsonrpc"] == "2.0"


def test_sigterm_stops_a_stdio_server_after_its_clean_up_with_143(tmp_path):
    proc, err = _spawn(tmp_path, [sys.executable, str(SERVER)])
    _handshake(proc)
    sockets = _local_sockets(tmp_path, proc)
    assert sockets, "the stdio server listens for local queries"
    proc.send_signal(signal.SIGTERM)
    code = _wait(proc)
    assert code == 143, err.read_text()
    assert not any(path.exists() for path in sockets), "the lifespan's clean-up did not run (socket left behind)"
    assert "Traceback" not in err.read_text(), err.read_text()


FORGED = (b'\x1b[2J\x1b[31mboom\x1b[0m\rFAKE\x0b2026-11-24 23:59:59,000 CRITICAL research_agent.mcp: store wiped'
          b'\xe2\x80\xa8second\x00nul\x85next\n')


def test_a_rejected_stdio_line_is_logged_escaped_in_one_line(tmp_path):
    log_file = tmp_path / "server.log"
    proc, err = _spawn(tmp_path, [sys.executable, str(SERVER)], RESEARCH_AGENT_LOG_FILE=str(log_file))
    _handshake(proc)
    proc.stdin.write(FORGED)
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["error"]["code"] == -32700
    proc.stdin.close()
    proc.wait(timeout=EXIT_WITHIN)
    proc.stdout.close()
    for text in (err.read_text(encoding="utf-8"), log_file.read_text(encoding="utf-8")):
        rejected = [line for line in text.splitlines() if "rejected a malformed JSON-RPC line" in line]
        assert len(rejected) == 1, text
        assert text.count("\n") == len(text.splitlines())  # no line break but \n (str.splitlines splits on U+2028)
        for raw in ("\x1b", "\r", "\x0b", "\u2028", "\x00", "\x85"):
            assert raw not in text, repr(text)
        assert "\\x1b[2J" in rejected[0] and "\\u2028second" in rejected[0] and "\\x00nul" in rejected[0]


def test_loggable_escapes_controls_and_line_breaks_only():
    from research_agent.mcp.launch import loggable

    assert loggable("plain é ü 字 text") == "plain é ü 字 text"
    assert loggable("a\rb\nc\x1b[0m\u2028\u202e\x7f") == "a\\x0db\\x0ac\\x1b[0m\\u2028\\u202e\\x7f"



def test_a_forced_exit_runs_the_quick_clean_ups(monkeypatch):
    """When the stop's grace runs out, exit_now ends the process with os._exit, which runs no atexit: under load a
    server's clean-up outlasted the grace and left its local socket behind. Its quick clean-ups run first now."""
    from research_agent.mcp import launch

    ran, exited = [], []
    monkeypatch.setattr(launch.os, "_exit", exited.append)
    monkeypatch.setattr(launch.logging, "shutdown", lambda: None)  # not this test process's log handlers
    monkeypatch.setattr(launch, "_exit_hooks", [])
    launch.on_exit_now(lambda: ran.append("socket removed"))
    launch.on_exit_now(lambda: 1 / 0)  # a failing clean-up keeps none of the others from running, nor the exit
    launch.on_exit_now(lambda: ran.append("second"))
    launch.exit_now(130)
    assert ran == ["socket removed", "second"] and exited == [130]
