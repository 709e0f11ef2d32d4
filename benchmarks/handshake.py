"""MCP start-up benchmark: spawn the server N times per variant and time, from spawn, the `initialize` answer,
the `tools/list` answer and the answer to a tool call sent with them; and the first HTTP `initialize`.

Usage: .venv/bin/python benchmarks/handshake.py [--runs 7] [--busy 0] [--no-http] [--json]

Variants, spawned in turn (one round of each, N rounds) so the machine's load falls on all of them alike:
  early lists    `python mcp_server.py` as shipped: initialize and the lists from the front (research_agent/mcp/
                 early.py), the tool call queued until the server is up
  no snapshot    the same with an empty snapshot: only `initialize` is early (the behaviour before issue 16)
  serve          `research-agent serve` (the installed entry: the CLI imports first)
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


def http_first_answer(env: dict[str, str]) -> float:
    """Seconds from spawning `python mcp_server.py` on streamable HTTP to its first `initialize` answer (polled
    every 20 ms; loopback, no auth)."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**env, "RESEARCH_AGENT_TRANSPORT": "http", "RESEARCH_AGENT_PORT": str(port)}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "mcp_server.py"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < 60:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(f"http://127.0.0.1:{port}/mcp", headers=headers, json=body, timeout=5).status_code == 200:
                    return time.perf_counter() - started
            time.sleep(0.02)
        raise RuntimeError("the HTTP server did not answer within 60 s")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


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
            result["http_initialize_median_s"] = round(statistics.median(http_first_answer(env)
                                                                         for _ in range(max(3, args.runs // 2))), 3)
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
