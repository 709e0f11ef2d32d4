"""The streamable HTTP transport under load (20 clients x 50 queries) and its bearer auth.

The server is the real `mcp_server` process on loopback; it runs with the deterministic fake embedder registered
(a small wrapper that then calls mcp_server.main()), so the load measures the server and store, not the model.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_concurrency import FAKE_CLI, cli_env, make_folder, run_cli

ROOT = Path(__file__).resolve().parent.parent
FAKE_SERVER = FAKE_CLI.replace('from research_agent.cli.main import app\napp(prog_name="research-agent")',
                               f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport mcp_server\nmcp_server.main()")
CLIENTS, QUERIES = 20, 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    script = tmp / "fake_server.py"
    script.write_text(FAKE_SERVER, encoding="utf-8")
    env = {**env, "RESEARCH_AGENT_TRANSPORT": "http", "RESEARCH_AGENT_PORT": str(port),
           "RESEARCH_AGENT_WARMUP": "false", "RESEARCH_AGENT_RERANK": "false"}
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError((tmp / "server.log").read_text(errors="replace")[-3000:])
            time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_20_clients_x_50_queries_over_http_without_errors(tmp_path):
    import anyio
    from fastmcp import Client

    store = tmp_path / "store"
    env = cli_env(store, fake=True)
    folder = make_folder(tmp_path / "kb", 60, sections=3, words=40, seed=42)
    assert run_cli(tmp_path, "collections", "create", "loadkb", fake=True, env=env).returncode == 0
    assert run_cli(tmp_path, "kb", "add-folder", folder, "--collection", "loadkb", fake=True, env=env).returncode == 0
    proc, port = start_server(tmp_path, env)
    latencies: list[float] = []
    errors: list[str] = []
    modes = ["hybrid", "semantic", "keyword"]

    async def client(n: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp", timeout=120) as c:
            for q in range(QUERIES):
                args = {"query": f"retry backoff uniqkbn{(n * QUERIES + q) % 60}s1 cache", "top_k": 5,
                        "mode": modes[q % 3], "rerank": False}
                started = time.perf_counter()
                try:
                    result = await c.call_tool("query_knowledge_base", args)
                    if not result.structured_content or "results" not in result.structured_content:
                        errors.append(f"client {n} query {q}: no results field")
                except Exception as exc:  # noqa: BLE001 - every failure is counted
                    errors.append(f"client {n} query {q}: {type(exc).__name__}: {exc}"[:300])
                latencies.append(time.perf_counter() - started)

    async def main() -> float:
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for n in range(CLIENTS):
                tg.start_soon(client, n)
        return time.perf_counter() - started

    try:
        wall = anyio.run(main)
    finally:
        stop(proc)
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p95 = ordered[int(len(ordered) * 0.95) - 1] * 1000
    print(f"HTTP load: {len(latencies)} queries from {CLIENTS} clients in {wall:.1f} s "
          f"({len(latencies) / wall:.0f}/s), p50 {p50:.0f} ms, p95 {p95:.0f} ms, errors {len(errors)}")
    assert len(latencies) == CLIENTS * QUERIES
    assert errors == [], errors[:5]


@pytest.mark.slow
def test_http_requests_without_or_with_wrong_credentials_get_401(tmp_path):
    import httpx

    env = cli_env(tmp_path / "store", fake=True, RESEARCH_AGENT_AUTH_TYPE="bearer",
                  RESEARCH_AGENT_API_KEYS="secret-xyz-0123456789")
    proc, port = start_server(tmp_path, env)
    url = f"http://127.0.0.1:{port}/mcp"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    try:
        none = httpx.post(url, json=init, headers=headers, timeout=30)
        wrong = httpx.post(url, json=init, headers={**headers, "Authorization": "Bearer wrong"}, timeout=30)
        right = httpx.post(
            url, json=init, headers={**headers, "Authorization": "Bearer secret-xyz-0123456789"}, timeout=30
        )
    finally:
        stop(proc)
    assert none.status_code == 401, none.status_code
    assert wrong.status_code == 401, wrong.status_code
    assert right.status_code == 200, (right.status_code, right.text[:500])
    for response in (none, wrong):
        assert "secret-xyz-0123456789" not in response.text
