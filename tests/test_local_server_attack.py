"""The local query socket after the attack pass (task H4b): a server whose store was deleted or replaced makes the
CLI run the query itself (F1); a server running other code is not asked, and an answer that is not this code's
QueryResult is rerun here (F2); a server stopped mid-call costs the CLI about IDLE_TIMEOUT (F3); SIGTERM removes
the socket and a starting server sweeps dead ones (F4); an unsafe socket folder is named (F5); a request nested too
deep closes one connection with one log line (F6); --diverse in every mode, also with no hit (F7).

Real parts: a real stdio server process, the real CLI, a real embedded Chroma and the packaged MiniLM; the fake
socket servers below stand in for a foreign or stopped server (the protocol's logic only)."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_local_server import (
    SERVED,
    _cli,
    _env,
    _route,
    _served,
    _start,
    _stop,
    _wait_for_socket,
    runtime_dir,
    served_store,
)

__all__ = ["runtime_dir", "served_store"]  # fixtures, used by name

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _fake_server(path: Path, reply: bytes, hold: float = 0.0) -> tuple[socket.socket, threading.Thread]:
    """A socket at `path` that reads one request, sends `reply`, keeps the connection `hold` s, then closes."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(60)

    def run() -> None:
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    conn.recv(1 << 20)
                    conn.sendall(reply)
                    time.sleep(hold)
        except OSError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return srv, thread


def _socket_for(env: dict[str, str]) -> Path:
    """The socket path the CLI with `env` asks (computed by a process with the same environment)."""
    code = ("from research_agent.config import load_settings; from research_agent.search import local_server as w;"
            "print(w.socket_path(load_settings(), create=True))")
    done = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


# F7 -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["hybrid", "semantic", "keyword"])
def test_diverse_in_each_mode_also_with_no_hit(served_store, runtime_dir, mode):
    """--diverse in each mode answers (exit 0); a keyword query no chunk matches gave a TypeError (bitwise_or on
    an empty float array) in search/diversity.py."""
    root, work = served_store, served_store / "work"
    env = _env(root, runtime_dir, RESEARCH_AGENT_LOCAL_SERVER="off")
    for text in ("install the package", "zqxjv wqpfh"):
        done = _cli(env, work, "--json", "query", text, "--mode", mode, "--diverse", "--no-rerank")
        assert done.returncode == 0, done.stderr
        hits = json.loads(done.stdout)["results"]
        assert (len(hits) > 0) == (text == "install the package" or mode != "keyword"), (text, mode, hits)


# F1 -------------------------------------------------------------------------------------------------------------

def test_a_server_whose_store_was_replaced_lets_the_cli_run_it(tmp_path, runtime_dir):
    """The store folder deleted and made anew under a running server: the server's StoreUnavailableError is not
    the answer; the CLI runs the query itself and finds the new store's chunk (exit 0). A request error (an
    unknown collection) is still the server's answer."""
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "docs" / "a.md").write_text("# A\n\nalpha walrusbeam text\n")
    env = _env(tmp_path, runtime_dir)
    assert _cli(env, work, "kb", "add-folder", "docs", "--collection", "first", "--create").returncode == 0
    s = _start(tmp_path, runtime_dir)
    try:
        _wait_for_socket(runtime_dir)
        _served(env, work, ["query", "walrusbeam", "--mode", "keyword"])
        shutil.rmtree(tmp_path / "store")
        (work / "docs" / "a.md").write_text("# B\n\nbeta walrusbeam other text\n")
        assert _cli(env, work, "kb", "add-folder", "docs", "--collection", "second", "--create").returncode == 0
        done = _cli(env, work, "--json", "-v", "query", "walrusbeam", "--mode", "keyword")
        assert done.returncode == 0, done.stderr
        assert SERVED not in done.stderr and any("store" in m for m in _route(done.stderr)), done.stderr
        assert "beta walrusbeam" in json.loads(done.stdout)["results"][0]["content"]
        wrong = _cli(env, work, "--json", "-v", "query", "x", "--collections", "no-such")
        assert wrong.returncode == 4, wrong.stderr
    finally:
        _stop(s)


def test_only_request_errors_are_the_answer():
    """The rule both sides apply (pure logic): collection/document/query errors, not retryable, are the answer;
    config and store errors and anything retryable make the CLI run the query itself."""
    from research_agent.errors import (
        CollectionError,
        ConfigError,
        DocumentError,
        QueryError,
        ResearchAgentError,
        StoreUnavailableError,
    )
    from research_agent.search.local_server import request_error

    for error in (CollectionError("c"), DocumentError("d"), QueryError("q")):
        assert request_error(error) and request_error(error.to_dict())
    retry = QueryError("q")
    retry.retryable = True
    retry.data["retryable"] = True
    for error in (ConfigError("c"), StoreUnavailableError("s"), ResearchAgentError("x"), retry):
        assert not request_error(error) and not request_error(error.to_dict())
    assert not request_error({"code": -32002, "message": "m"})  # no `retryable`: not sure, so rerun
    assert not request_error("garbage")


def test_a_store_error_from_an_older_server_is_rerun_by_the_cli(tmp_path, runtime_dir, caplog):
    """Defence in depth: a server that still sends a StoreUnavailableError as the answer is passed over."""
    from research_agent.config import load_settings
    from research_agent.errors import StoreUnavailableError
    from research_agent.search import local_server

    settings = load_settings()
    error = StoreUnavailableError("The store at X is not the one this process opened (it was replaced)")
    reply = (b'{"accepted":true,"timeout":5}\n'
             + json.dumps({"error": error.to_dict(), "exit_code": 3}).encode() + b"\n")
    srv, _ = _fake_server(local_server.socket_path(settings, create=True), reply)
    try:
        with caplog.at_level(logging.INFO, "research_agent.local_server"):
            assert local_server.ask(settings, "query", {"query": "x"}) is None
        assert "store or settings failed" in caplog.text
    finally:
        srv.close()


# F2 -------------------------------------------------------------------------------------------------------------

def test_other_code_changes_the_fingerprint(tmp_path):
    """A copy of the package with one file changed (same __version__) has another fingerprint: its server's socket
    is another file, never asked."""
    code = ("from research_agent.config import load_settings; from research_agent.search import local_server as w;"
            "import research_agent; print(research_agent.__file__, w.fingerprint(load_settings()))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(RESEARCH_AGENT_STORE=str(tmp_path / "store"), HF_HUB_OFFLINE="1")
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "research_agent", copy / "research_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    prints = []
    for pythonpath in (str(ROOT), str(copy)):
        done = subprocess.run([PY, "-c", code], env={**env, "PYTHONPATH": pythonpath}, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        file, fp = done.stdout.split()
        assert file.startswith(pythonpath)
        prints.append(fp)
    assert prints[0] == prints[1]  # the same code in another place: the same server may answer
    service = copy / "research_agent" / "search" / "service.py"
    service.write_text(service.read_text() + "\n# another result shape\n")
    done = subprocess.run([PY, "-c", code], env={**env, "PYTHONPATH": str(copy)}, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] != prints[0]


@pytest.mark.parametrize("json_out", [False, True])
def test_an_answer_of_another_shape_is_rerun_in_process(served_store, runtime_dir, json_out):
    """A server whose answer is not this code's QueryResult (a foreign or older server at the right socket): the
    CLI runs the query itself (exit 0, the real results), in human and --json output."""
    root, work = served_store, served_store / "work"
    env = _env(root, runtime_dir)
    foreign = {"result": {"status": "success", "query": "FORGED", "mode": "hybrid", "collections": ["docs"],
                          "reranked": False, "warnings": [], "results": [{"content": "FORGED ANSWER"}]}}
    reply = b'{"accepted":true,"timeout":5}\n' + json.dumps(foreign).encode() + b"\n"
    srv, _ = _fake_server(_socket_for(env), reply)
    try:
        args = ["--json"] if json_out else []
        done = _cli(env, work, *args, "-v", "query", "install", "--mode", "keyword", "--no-rerank")
        assert done.returncode == 0, done.stderr
        assert "FORGED" not in done.stdout and "not this version's result" in done.stderr, done.stderr
        if json_out:
            assert json.loads(done.stdout)["results"]
    finally:
        srv.close()


# F3 -------------------------------------------------------------------------------------------------------------

def test_a_server_silent_after_accepting_costs_about_the_idle_timeout(runtime_dir):
    """A server that accepted with a 600 s call timeout and then sends nothing (stopped mid-call: its keep-alives
    stop) is given up after IDLE_TIMEOUT, not 605 s; one that keeps sending keep-alives is waited for."""
    from research_agent.config import load_settings
    from research_agent.search import local_server

    settings = load_settings()
    path = local_server.socket_path(settings, create=True)
    srv, _ = _fake_server(path, b'{"accepted":true,"timeout":600}\n', hold=10)
    try:
        started = time.monotonic()
        assert local_server.ask(settings, "query", {"query": "x"}) is None
        assert local_server.IDLE_TIMEOUT - 0.1 < time.monotonic() - started < local_server.IDLE_TIMEOUT + 1.5
    finally:
        srv.close()
    path.unlink()
    alive = b'{"accepted":true,"timeout":600}\n' + b"\n" * 1
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def slow_but_alive() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 << 20)
            conn.sendall(alive)
            for _ in range(6):  # 3 s of keep-alives, twice IDLE_TIMEOUT
                time.sleep(local_server.KEEPALIVE)
                conn.sendall(b"\n")
            answer = {"result": {"query": "late"}, "code": local_server.code_hash()}  # this very code's answer
            conn.sendall(json.dumps(answer).encode() + b"\n")

    thread = threading.Thread(target=slow_but_alive, daemon=True)
    thread.start()
    try:
        assert local_server.ask(settings, "query", {"query": "x"}) == {"query": "late"}
    finally:
        srv.close()


def test_a_server_stopped_mid_call_costs_the_cli_about_two_seconds(served_store, runtime_dir):
    """SIGSTOP while the server computes a long answer (a large document context): the CLI gives up within
    about IDLE_TIMEOUT of the stop and runs it itself (before: the call timeout plus 5 s)."""
    root, work = served_store, served_store / "work"
    env = _env(root, runtime_dir, RESEARCH_AGENT_CALL_TIMEOUT="600")
    s = _start(root, runtime_dir, RESEARCH_AGENT_CALL_TIMEOUT="600")
    context = work / "ctx.txt"
    context.write_text(base64.b64encode(os.urandom(742_000)).decode()[:990_000])  # slow to tokenize
    try:
        _wait_for_socket(runtime_dir)
        _served(env, work, ["query", "install"])
        cli = subprocess.Popen([str(Path(PY).parent / "research-agent"), "--json", "-v", "query", "server settings",
                                "--top-k", "50", "--diverse", "--context-file", str(context)], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the CLI's connection is up: the request is sent, the server computes
            ss = subprocess.run(["ss", "-xp"], capture_output=True, text=True).stdout
            if f"pid={cli.pid}," in ss:
                break
            time.sleep(0.005)
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        out, err = cli.communicate(timeout=300)
        route = _route(err)
        if any(SERVED in m for m in route):
            pytest.skip("the server answered before the stop (machine too fast for this timing)")
        assert cli.returncode == 0, err
        assert any("did not answer in time" in m for m in route), route
        gave_up = [m for m in route if "did not answer" in m]
        assert gave_up and "no byte from the server" in gave_up[0], route
        assert json.loads(out)["results"]
        assert stopped  # the in-process run's own time is not the server's; the give-up is checked by its reason
    finally:
        s.proc.send_signal(signal.SIGCONT)
        _stop(s)


# F4, F5, F6 -----------------------------------------------------------------------------------------------------

def test_sigterm_removes_the_socket_a_start_sweeps_dead_ones_and_a_deep_request_closes_one_connection(
        served_store, runtime_dir):
    """A starting server removes the folder's dead sockets (connect refused) and nothing else (a live socket, a
    file, a symbolic link); a request nested 100,000 deep is declined with no traceback in the log and the server
    still answers; SIGTERM removes the server's socket."""
    root, work = served_store, served_store / "work"
    folder = runtime_dir / "research-agent"
    folder.mkdir(mode=0o700)
    dead = folder / "dead.sock"
    s1 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s1.bind(str(dead))
    s1.close()  # bound, never listened: connect is refused, like a killed server's
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(folder / "live.sock"))
    live.listen(1)
    (folder / "note.sock").write_text("not a socket")
    (folder / "link.sock").symlink_to(dead)
    env = _env(root, runtime_dir)
    s = _start(root, runtime_dir, RESEARCH_AGENT_LOG_LEVEL="INFO")
    try:
        deadline = time.monotonic() + 60
        while dead.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not dead.exists()
        assert (folder / "live.sock").exists() and (folder / "note.sock").exists()
        assert (folder / "link.sock").is_symlink()
        mine = _socket_for(env)
        _served(env, work, ["query", "install"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(10)
            c.connect(str(mine))
            c.sendall(b"[" * 100_000 + b"]" * 100_000 + b"\n")
            reply = json.loads(c.makefile("rb").readline())
            assert "declined" in reply
        assert SERVED in _cli(env, work, "--json", "-v", "query", "install").stderr
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=30)
        assert not mine.exists()
        log = s.stderr_path.read_text(errors="replace")
        assert "Traceback" not in log and "RecursionError" not in log, log
    finally:
        live.close()
        _stop(s)


def test_an_unsafe_socket_folder_is_named_at_info(runtime_dir, caplog):
    """-v names why no server is asked: the folder is open to others, another's, or a symbolic link."""
    from research_agent.config import load_settings
    from research_agent.search import local_server

    settings = load_settings()
    folder = runtime_dir / "research-agent"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    with caplog.at_level(logging.INFO, "research_agent.local_server"):
        assert local_server.ask(settings, "query", {"query": "x"}) is None
    assert "open to other users (mode 755, not 700)" in caplog.text, caplog.text
    folder.rmdir()
    elsewhere = runtime_dir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)
    caplog.clear()
    with caplog.at_level(logging.INFO, "research_agent.local_server"):
        assert local_server.ask(settings, "query", {"query": "x"}) is None
    assert "is a symbolic link" in caplog.text, caplog.text
