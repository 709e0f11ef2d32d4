"""MCP start-up benchmark: spawn the server N times per variant and time, from spawn, the `initialize` answer,
the `tools/list` answer and the answer to a tool call sent with them; and over streamable HTTP the first
`initialize` and the `tools/list` of that session (a real client's handshake, mcp-session-id included).

Usage: .venv/bin/python benchmarks/handshake.py [--runs 7] [--busy 0] [--no-http] [--json]

Variants, spawned in turn (one round of each, N rounds) so the machine's load falls on all of them alike:
  early lists    `python mcp_server.py` as shipped: initialize and the lists from the front (research_agent/mcp/
                 early.py), the tool call queued until the server is up
  no snapshot    the same with an empty snapshot: only `initialize` is early (the behaviour before issue 16)
  serve          `research-agent serve` as installed in the venv (.venv/bin/research-agent: its target in
                 pyproject.toml decides whether the front starts before the CLI loads)
  python -m research_agent serve
                 research_agent/__main__.py:main, which starts the front before typer and the CLI load
Every variant's client sends initialize, notifications/initialized, tools/list and a `get_status` call in one
write, as a client that does not wait would; `stale` counts runs whose early list the server found stale
(a list_changed notification), which means the snapshot needs `python -m research_agent.mcp.early`.

`--busy N` runs N busy-looping processes meanwhile (a loaded machine, reproducibly). Also printed: the cost of
a bare Python start and of `import mcp.types` / `import fastmcp` / `import mcp_server` in a fresh interpreter,
the floor under any FastMCP server's tools/list that the front does not use.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HELLO = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
NO_SNAPSHOT = ("import runpy, sys, research_agent.mcp.early_lists as e; e.ANSWERS.clear(); "
               f"sys.argv = [{str(ROOT / 'mcp_server.py')!r}]; "
               f"runpy.run_path({str(ROOT / 'mcp_server.py')!r}, run_name='__main__')")


def _variants() -> dict[str, list[str]]:
    variants = {"early lists": [sys.executable, "mcp_server.py"], "no snapshot": [sys.executable, "-c", NO_SNAPSHOT]}
    cli = shutil.which("research-agent", path=str(Path(sys.executable).parent))
    if cli:
        variants["serve"] = [cli, "serve"]
    variants["python -m research_agent serve"] = [sys.executable, "-m", "research_agent", "serve"]
    return variants


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(RESEARCH_AGENT_STORE=str(tmp / "store"), XDG_CONFIG_HOME=str(tmp / "config"),
               XDG_DATA_HOME=str(tmp / "data"), HF_HUB_OFFLINE="1", RESEARCH_AGENT_WARMUP="false",
               PYTHONPATH=str(ROOT))
    return env


def _message(request_id: int | None, method: str, params: dict | None = None) -> bytes:
    message = {"jsonrpc": "2.0", "method": method, **({"id": request_id} if request_id is not None else {}),
               **({"params": params} if params is not None else {})}
    return (json.dumps(message) + "\n").encode()


def _responses(proc: subprocess.Popen, wanted: set[int], started: float) -> tuple[dict[int, float], dict, int]:
    """Seconds from spawn to each wanted response, the tools/list result (id 2) and the notifications seen."""
    times, tools, notifications = {}, {}, 0
    while wanted - times.keys():
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
        message = json.loads(line)
        if "id" not in message:
            notifications += 1
            continue
        times[message["id"]] = time.perf_counter() - started
        if message["id"] == 2:
            tools = message["result"]
    return times, tools, notifications


def one_spawn(command: list[str], env: dict[str, str]) -> dict[str, float | int]:
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        proc.stdin.write(_message(1, "initialize", HELLO) + _message(None, "notifications/initialized")
                         + _message(2, "tools/list") + _message(3, "tools/call", {"name": "get_status",
                                                                                   "arguments": {}}))
        proc.stdin.flush()
        times, tools, notifications = _responses(proc, {1, 2, 3}, started)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"initialize": times[1], "tools_list": times[2], "tool_call": times[3], "stale": int(notifications > 0),
            "tools_list_context_bytes": _context_bytes(tools.get("tools", []))}


def _context_bytes(tools: list[dict]) -> int:
    """What a model carries of tools/list: each tool's name, description and input schema (a model API's tool
    definition has only these; output schemas and annotations stay with the client)."""
    kept = [{k: t[k] for k in ("name", "description", "inputSchema") if k in t} for t in tools]
    return len(json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http_result(response: Any) -> dict:
    """The JSON-RPC message of a streamable-HTTP answer: plain JSON or one SSE `data:` line."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


def _http_session(client: Any, url: str) -> dict[str, float]:
    """One client session as a real client runs it: initialize (its mcp-session-id), notifications/initialized,
    tools/list; raises httpx.HTTPError while nothing listens yet. Seconds (perf_counter) at each answer."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    hello = client.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                                     "params": HELLO})
    hello.raise_for_status()
    at = {"initialize": time.perf_counter()}
    headers = {**headers, "mcp-session-id": hello.headers.get("mcp-session-id", ""),
               "mcp-protocol-version": HELLO["protocolVersion"]}
    client.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    tools = client.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    tools.raise_for_status()
    assert _http_result(tools)["result"]["tools"], tools.text[:300]
    at["tools_list"] = time.perf_counter()
    return at


def http_first_answer(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds from spawning `command` on streamable HTTP (loopback, no auth) to its first `initialize` answer
    and to the `tools/list` answer of the same session; connection attempts every 20 ms."""
    import httpx

    port = _free_port()
    env = {**env, "RESEARCH_AGENT_TRANSPORT": "http", "RESEARCH_AGENT_PORT": str(port)}
    url = f"http://127.0.0.1:{port}/mcp"
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(timeout=30) as client:
            while time.perf_counter() - started < 60:
                with contextlib.suppress(httpx.HTTPError):
                    at = _http_session(client, url)
                    return {k: v - started for k, v in at.items()}
                time.sleep(0.02)
        raise RuntimeError("the HTTP server did not answer within 60 s")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _http_variants(variants: dict[str, list[str]]) -> dict[str, list[str]]:
    """HTTP through `python mcp_server.py` and `research-agent serve` (the transport from the environment)."""
    names = {"early lists": "python mcp_server.py"}
    return {f"http {names.get(name, name)}": command for name, command in variants.items() if name != "no snapshot"}


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """N busy-looping processes (the other engineers' builds, reproducibly); stopped by their own ids."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def bare(code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _summary(runs: list[dict[str, float | int]]) -> dict[str, float | int]:
    median = {key: round(statistics.median(r[key] for r in runs), 3) for key in ("initialize", "tools_list",
                                                                                 "tool_call")}
    return {**{f"{k}_median_s": v for k, v in median.items()},
            "tools_list_max_s": round(max(r["tools_list"] for r in runs), 3),
            "stale_runs": sum(int(r["stale"]) for r in runs), "tools_list_context_bytes": runs[-1][
                "tools_list_context_bytes"]}


def _http_summary(variants: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, object]:
    times: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(runs):  # one round of each variant per run, as for stdio
        for name, command in variants.items():
            times[name].append(http_first_answer(command, env))
    return {name: {f"{key}_median_s": round(statistics.median(t[key] for t in runs_), 3)
                   for key in ("initialize", "tools_list")} for name, runs_ in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes to run meanwhile")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP first-answer timing")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    variants = _variants()
    result: dict[str, object] = {"runs": args.runs, "cpus": os.cpu_count(), "busy": args.busy,
                                 "load_average_1m_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp, busy(args.busy):
        env = _env(Path(tmp))
        for command in variants.values():
            one_spawn(command, env)  # warm the OS file cache and __pycache__
        runs: dict[str, list] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, command in variants.items():
                runs[name].append(one_spawn(command, env))
        result.update({name: _summary(r) for name, r in runs.items()})
        if not args.no_http:
            result.update(_http_summary(_http_variants(variants), env, max(3, args.runs // 2)))
        result["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        result.update({"python_startup_median_s": round(bare("pass", 5), 3),
                       "import_mcp_types_median_s": round(bare("import mcp.types", 5), 3),
                       "import_fastmcp_median_s": round(bare("import fastmcp", 5), 3),
                       "import_mcp_server_median_s": round(bare("import mcp_server", 5), 3)})
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for inner, figure in value.items():
                print(f"  {inner:30} {figure}")
        else:
            print(f"{key:32} {value}")


if __name__ == "__main__":
    main()
