"""`research-agent query` answered by a running MCP server over the local socket (issues 12 and 16): a real stdio
server process on a small real store (the packaged MiniLM, a real embedded Chroma), the real CLI in a subprocess,
each query run both ways (RESEARCH_AGENT_LOCAL_SERVER=off is the in-process run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_mcp_stdio import _initialize, _mcp_env, _McpStdioSession

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "docs"
CLI = str(Path(sys.executable).parent / "research-agent")
SERVED = "answered by the local server"


@pytest.fixture
def runtime_dir(monkeypatch):
    """A private XDG_RUNTIME_DIR (short, under /tmp) so the test's sockets are its own."""
    path = Path(tempfile.mkdtemp(prefix="ra-rt-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp_path: Path, runtime: Path, **extra: str) -> dict[str, str]:
    return {**_mcp_env(tmp_path), "XDG_RUNTIME_DIR": str(runtime), **extra}


def _cli(env: dict[str, str], cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _socket(runtime: Path) -> Path | None:
    found = sorted((runtime / "research-agent").glob("*.sock")) if (runtime / "research-agent").is_dir() else []
    return found[0] if found else None


def _wait_for_socket(runtime: Path, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = _socket(runtime)
        if path is not None:
            return path
        time.sleep(0.1)
    raise AssertionError("the server never listened on a local socket")


@pytest.fixture(scope="module")
def served_store(tmp_path_factory):
    """A store with the fixture docs in collection `docs`, built once with the real CLI."""
    root = tmp_path_factory.mktemp("local_server")
    work = root / "work"
    shutil.copytree(FIXTURES, work / "docs")
    env = {**_mcp_env(root)}
    done = _cli(env, work, "kb", "add-folder", "docs", "--collection", "docs", "--create")
    assert done.returncode == 0, done.stderr
    return root


def _start(root: Path, runtime: Path, **extra: str) -> _McpStdioSession:
    s = _McpStdioSession(root / "work", _env(root, runtime, **extra))
    _initialize(s)
    return s


def _stop(s: _McpStdioSession) -> None:
    if s.proc.poll() is None:
        s.close()


QUERIES = [
    ["query", "how do I install the package", "--collections", "docs"],
    ["query", "API authentication token", "--mode", "semantic", "--top-k", "3"],
    ["query", "install", "--mode", "keyword", "--explain", "--snippets"],
    ["query", "configure the server", "--document-context", "installing on linux with pip", "--diverse"],
    ["query", "api", "--filter", "content_type=prose", "--max-tokens", "200", "--no-rerank"],
]
ERRORS = [
    ["query", "anything", "--collections", "no-such-collection"],  # CollectionError, exit 4
    ["query", "   "],  # QueryError (empty), exit 6
    ["query", "anything", "--filter", "bogus_key=1"],  # the service refuses the filter
]


def _without_timings(out: str) -> dict:
    data = json.loads(out)
    assert set(data.pop("timings_ms")) >= {"total"}
    return data


def _route(stderr: str) -> list[str]:
    """What -v said about the way the query went (the local_server log lines)."""
    return [json.loads(line)["log"]["message"] for line in stderr.splitlines()
            if line.startswith('{"log"') and "local_server" in line]


def _error_line(stderr: str) -> dict:
    return next(json.loads(line)["error"] for line in stderr.splitlines() if line.startswith('{"error"'))


def test_cli_query_through_a_running_server_equals_the_in_process_run(served_store, runtime_dir, tiny_cross_encoder):
    """The same queries (every option, reranked by a real cross-encoder) and the same coded errors, in-process and
    through the server's socket: equal --json output (but the timings), equal exit codes, and -v says which way
    each went."""
    root, work = served_store, served_store / "work"
    reranker = {"RESEARCH_AGENT_RERANKER_MODEL": str(tiny_cross_encoder)}
    s = _start(root, runtime_dir, **reranker)
    try:
        path = _wait_for_socket(runtime_dir)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        env = _env(root, runtime_dir, **reranker)
        for args in QUERIES:
            local = _cli({**env, "RESEARCH_AGENT_LOCAL_SERVER": "off"}, work, "--json", "-v", *args)
            served = _served(env, work, args)
            assert local.returncode == served.returncode == 0, (args, local.stderr, served.stderr)
            assert SERVED not in local.stderr and "runs in this process" in local.stderr
            assert _without_timings(served.stdout) == _without_timings(local.stdout), args
            assert json.loads(local.stdout)["results"], args
            assert json.loads(local.stdout)["reranked"] is ("--no-rerank" not in args), args
        _same_errors_and_human_output(env, work, ERRORS, QUERIES[0])
    finally:
        _stop(s)
    for line in s.lines:  # the socket wrote nothing on the JSON-RPC wire
        assert json.loads(line)["jsonrpc"] == "2.0", line
    assert _socket(runtime_dir) is None  # removed on exit


DISCOVERIES = [
    ["discover", "install the package on linux"],
    ["discover", "configure the server", "--task-type", "implement", "--current-file", "docs/install.md",
     "--max-results", "3", "--collections", "docs"],
]
DISCOVERY_ERRORS = [
    ["discover", "anything", "--collections", "no-such-collection"],  # CollectionError, exit 4
    ["discover", "   "],  # QueryError (empty task), exit 6
]


def test_cli_discover_through_a_running_server_equals_the_in_process_run(served_store, runtime_dir):
    """`research-agent discover` is answered by the server as `query` is (it loads the same embedding model, ~4 s
    of a new process): equal --json output but the timings, the message in the CLI's words either way, equal
    coded errors and exit codes, equal human output."""
    from research_agent.mcp.local_socket import SERVICES
    from research_agent.search.local_server import OPS

    assert set(SERVICES) == OPS
    root, work = served_store, served_store / "work"
    s = _start(root, runtime_dir)
    try:
        _wait_for_socket(runtime_dir)
        env = _env(root, runtime_dir)
        for args in DISCOVERIES:
            local = _cli({**env, "RESEARCH_AGENT_LOCAL_SERVER": "off"}, work, "--json", "-v", *args)
            served = _served(env, work, args)
            assert local.returncode == served.returncode == 0, (args, local.stderr, served.stderr)
            assert _without_timings(served.stdout) == _without_timings(local.stdout), args
            out = json.loads(served.stdout)
            assert out["recommendations"], args
            assert "retrieve_knowledge" not in out["message"], out["message"]  # the CLI's words, not an agent's
        _same_errors_and_human_output(env, work, DISCOVERY_ERRORS, DISCOVERIES[0])
    finally:
        _stop(s)


def _same_errors_and_human_output(env: dict[str, str], work: Path, errors: list[list[str]], shown: list[str]) -> None:
    """Each of `errors` gets the same coded error line and exit code through the server as in-process, nothing on
    stdout; `shown` prints the same human output (the server's answer rendered by the CLI's own renderer)."""
    for args in errors:
        local = _cli({**env, "RESEARCH_AGENT_LOCAL_SERVER": "off"}, work, "--json", *args)
        served = _cli(env, work, "--json", "-v", *args)
        assert SERVED in served.stderr, (args, _route(served.stderr))
        assert local.returncode == served.returncode != 0, (args, local.stderr, served.stderr)
        assert _error_line(served.stderr) == _error_line(local.stderr), args
        assert served.stdout == local.stdout == ""
    local = _cli({**env, "RESEARCH_AGENT_LOCAL_SERVER": "off"}, work, *shown)
    served = _cli(env, work, "-v", *shown)
    assert SERVED in served.stderr and served.stdout == local.stdout and local.stdout.strip()


def _served(env: dict[str, str], work: Path, args: list[str], tries: int = 60) -> subprocess.CompletedProcess[str]:
    """The query through the server: until its warm-up is done the server declines (the CLI runs it itself)."""
    for _ in range(tries):
        done = _cli(env, work, "--json", "-v", *args)
        if SERVED in done.stderr:
            return done
        assert "loading its models" in done.stderr, done.stderr
        time.sleep(1)
    raise AssertionError(f"the server never answered: {done.stderr}")


def test_a_server_with_other_settings_is_not_asked_and_off_is_off(served_store, runtime_dir):
    """A server whose ranking settings differ listens on another socket: the CLI runs in-process; a server started
    with the setting off does not listen at all."""
    root, work = served_store, served_store / "work"
    s = _start(root, runtime_dir, RESEARCH_AGENT_RRF_K="7", RESEARCH_AGENT_WARMUP="false")
    try:
        _wait_for_socket(runtime_dir)
        done = _cli(_env(root, runtime_dir), work, "--json", "-v", *QUERIES[0])
        assert done.returncode == 0 and SERVED not in done.stderr and "runs in this process" in done.stderr
        # The CLI's way to the socket imports no chromadb, numpy, torch or sentence-transformers (python -X importtime).
        matching = subprocess.run([sys.executable, "-X", "importtime", "-m", "research_agent", "--json", "-v",
                                   *QUERIES[0]], cwd=work, env=_env(root, runtime_dir, RESEARCH_AGENT_RRF_K="7"),
                                  capture_output=True, text=True, timeout=180)
        assert matching.returncode == 0 and SERVED in matching.stderr, _route(matching.stderr)
        imported = {line.split("|")[-1].strip().split(".")[0] for line in matching.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "typer" in imported and not imported & {"chromadb", "numpy", "torch", "sentence_transformers"}
        assert json.loads(matching.stdout)["results"]
    finally:
        _stop(s)
    s = _start(root, runtime_dir, RESEARCH_AGENT_LOCAL_SERVER="off", RESEARCH_AGENT_WARMUP="false")
    try:
        time.sleep(2)
        assert _socket(runtime_dir) is None
    finally:
        _stop(s)


def test_a_killed_servers_socket_is_passed_over_and_replaced(served_store, runtime_dir):
    """kill -9 leaves the socket file: the CLI's connect is refused and it runs in-process at once; the next
    server replaces the stale socket and answers."""
    root, work = served_store, served_store / "work"
    s = _start(root, runtime_dir, RESEARCH_AGENT_WARMUP="false")
    path = _wait_for_socket(runtime_dir)
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    s.close()
    assert path.exists()
    env = _env(root, runtime_dir, RESEARCH_AGENT_WARMUP="false")
    done = _cli(env, work, "--json", "-v", *QUERIES[0])
    assert done.returncode == 0 and "does not accept" in done.stderr, done.stderr
    s = _start(root, runtime_dir, RESEARCH_AGENT_WARMUP="false")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = _cli(env, work, "--json", "-v", *QUERIES[0])
            if SERVED in done.stderr:
                break
            time.sleep(0.5)
        assert SERVED in done.stderr, done.stderr
    finally:
        _stop(s)


def test_ctrl_c_closes_the_socket(served_store, runtime_dir):
    """Ctrl-C (SIGINT) ends a stdio server as before (exit 130) and removes its socket. Spawned with SIGINT's
    default action: a CI runner started in the background ignores SIGINT, the child inherited that, and a server
    keeps an inherited SIG_IGN (nohup) by design, so it ran on for the test's 30 s."""
    from test_mcp_signals import _ctrl_c_reaches_children

    root = served_store
    with _ctrl_c_reaches_children():
        s = _start(root, runtime_dir, RESEARCH_AGENT_WARMUP="false")
    try:
        _wait_for_socket(runtime_dir)
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(timeout=30) == 130
    finally:
        _stop(s)
    assert _socket(runtime_dir) is None


def test_a_stopped_server_does_not_hang_the_cli(served_store, runtime_dir):
    """A server that accepts but never answers (SIGSTOP: the kernel still accepts connections) costs the CLI
    ACK_TIMEOUT, then the query runs in-process."""
    root, work = served_store, served_store / "work"
    s = _start(root, runtime_dir, RESEARCH_AGENT_WARMUP="false")
    try:
        _wait_for_socket(runtime_dir)
        time.sleep(1)
        s.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        done = _cli(_env(root, runtime_dir), work, "--json", "-v", *QUERIES[0], timeout=120)
        assert done.returncode == 0 and "did not answer in time" in done.stderr, done.stderr
        assert json.loads(done.stdout)["results"]
        assert time.monotonic() - started < 60
    finally:
        s.proc.send_signal(signal.SIGCONT)
        _stop(s)


def test_an_unsafe_socket_folder_is_never_used(tmp_path, runtime_dir):
    """A socket folder another user could enter, or a symbolic link, is refused on both sides (no listening, no
    asking); a peer of another uid is refused by the server (checked with SO_PEERCRED)."""
    from research_agent.config import load_settings
    from research_agent.search import local_server

    settings = load_settings()
    folder = runtime_dir / "research-agent"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert local_server.socket_path(settings, create=True) is None
    assert local_server.ask(settings, "query", {"query": "x"}) is None
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)
    assert local_server.socket_path(settings, create=True) is None
    folder.unlink()
    assert local_server.socket_path(settings, create=True) is not None
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        assert local_server.peer_uid(a) == os.getuid()
    finally:
        a.close()
        b.close()


def test_a_request_larger_than_the_bound_is_not_sent(tmp_path, runtime_dir):
    """A document context over the request bound never reaches the socket: the query runs in-process."""
    from research_agent.config import load_settings
    from research_agent.search import local_server

    settings = load_settings()
    path = local_server.socket_path(settings, create=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        big = "x" * (local_server.MAX_REQUEST + 10)
        started = time.monotonic()
        assert local_server.ask(settings, "query", {"query": "q", "document_context": big}) is None
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
        assert time.monotonic() - started < 2
    finally:
        listener.close()


def test_two_lines_in_one_read_are_both_read():
    """The server's acceptance and a quick answer (a coded error) often arrive in one recv: the second line is
    kept for the next read (it was dropped once: the CLI then ran the query in-process, flakily)."""
    from research_agent.search import local_server

    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        b.sendall(b'{"accepted": true}\n{"result": 1}\n')
        b.close()
        lines = local_server.LineReader(a)
        deadline = time.monotonic() + 2
        assert lines.line(100, deadline) == b'{"accepted": true}'
        assert lines.line(100, deadline) == b'{"result": 1}'
        assert lines.line(100, deadline) is None
    finally:
        a.close()


def test_an_http_server_answers_too_and_removes_its_socket(tmp_path, runtime_dir):
    """A long-lived HTTP server listens as a stdio one does; an unknown collection is the same coded error (exit
    4) both ways; once the server stopped (SIGTERM) nothing answers on its socket and the file is gone (uvicorn
    re-raises SIGTERM after its shutdown, before the server's lifespan ends: the listener's SIGTERM handler, chained
    before uvicorn's, removes it)."""
    from research_agent.mcp.local_socket import _answers
    from test_mcp_http import http_server

    env = {**_mcp_env(tmp_path), "XDG_RUNTIME_DIR": str(runtime_dir)}
    work = Path.cwd()
    assert _cli(env, work, "collections", "create", "notes").returncode == 0
    with http_server(tmp_path):
        path = _wait_for_socket(runtime_dir)
        served = _cli(env, work, "--json", "-v", "query", "anything", "--collections", "missing")
        local = _cli({**env, "RESEARCH_AGENT_LOCAL_SERVER": "off"}, work, "--json", "query", "anything",
                     "--collections", "missing")
        assert SERVED in served.stderr, _route(served.stderr)
        assert served.returncode == local.returncode == 4
        assert _error_line(served.stderr) == _error_line(local.stderr)
    assert not _answers(path)
    assert not os.path.lexists(path)


def test_on_a_bfloat16_cpu_socket_calls_rerank_as_a_cli_process_does(monkeypatch, runtime_dir):
    """A server picks torch bfloat16 for `auto` precision on a CPU that computes it, a CLI process the float32 numpy
    cross-encoder: socket calls get a one-shot view of the server's container (its store shared), elsewhere the
    server's own. An in-memory server (tests, the early front's self-check) never listens."""
    import anyio

    from research_agent import rerank
    from research_agent.container import build_container
    from research_agent.mcp import local_socket
    from research_agent.mcp.lifespan import ServerState

    async def check() -> None:
        st = ServerState(build_container())
        try:
            monkeypatch.setattr(rerank, "cpu_computes_bfloat16", lambda: True)
            cli = local_socket._cli_container(st)
            assert cli.one_shot and cli.reranker.one_shot and not st.container.one_shot
            assert cli.store is st.container.store and cli.warmup is st.warmup
            monkeypatch.setattr(rerank, "cpu_computes_bfloat16", lambda: False)
            assert local_socket._cli_container(st) is st.container
            assert local_socket.start(st) is None  # not long-lived: no stdio transport, not launched for HTTP
            listener = local_socket.start(st, force=True)
            assert listener is not None and listener.path.exists()
            listener.close()
            assert not listener.path.exists()
        finally:
            st.close()

    anyio.run(check)


def test_relative_paths_are_never_served_and_changed_files_change_the_fingerprint(tmp_path, monkeypatch):
    """Attack pass of 2026-11-25: a relative boosts file names another file in the server's working directory (one
    created after it started, or after the folder was renamed): the server answered with its file's boosts where
    the CLI's run failed or found none. Relative boosts files and model folders are never served (neither side
    uses the socket). A boosts file or model folder rewritten since the server started (same path; even with its
    mtime put back) changes the fingerprint, so the CLI runs it itself; a hub model name is no path."""
    import os

    from research_agent.config import Settings
    from research_agent.search.local_server import fingerprint, usable

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    (tmp_path / "boosts.yaml").write_text("default: 1.0\n")
    for relative in ({"discovery_boosts_file": Path("boosts.yaml")}, {"discovery_boosts_file": Path("later.yaml")},
                     {"embedding_model": "models/m"}, {"reranker_model": "models/m"}):
        assert "relative" in (usable(Settings(store=tmp_path / "store", **relative)) or ""), relative
    assert usable(Settings(store=tmp_path / "store", reranker_model="cross-encoder/ms-marco-MiniLM-L6-v2")) is None

    settings = Settings(store=tmp_path / "store", discovery_boosts_file=tmp_path / "boosts.yaml",
                        embedding_model=str(tmp_path / "models" / "m"))
    assert usable(settings) is None
    first = fingerprint(settings)
    assert fingerprint(settings) == first
    boosts = tmp_path / "boosts.yaml"
    kept = os.stat(boosts)
    boosts.write_text("default: 40.0\n")
    os.utime(boosts, ns=(kept.st_atime_ns, kept.st_mtime_ns))  # `cp -p`, `rsync -a`: the old mtime back
    second = fingerprint(settings)
    assert second != first
    (tmp_path / "models" / "m" / "config.json").write_text('{"changed": true}')
    assert fingerprint(settings) != second
