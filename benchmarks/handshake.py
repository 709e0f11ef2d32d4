"""MCP handshake benchmark: spawn the stdio server N times, time `initialize` and `tools/list` from spawn.

Usage: .venv/bin/python benchmarks/handshake.py [--runs 10] [--command "python mcp_server.py"] [--json]

Also prints, for comparison, the bare cost of starting Python and of `import fastmcp` / `import mcp.types`
in a fresh interpreter (the floor under any FastMCP server's handshake).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
    env.update(RESEARCH_AGENT_STORE=str(tmp / "store"), XDG_CONFIG_HOME=str(tmp / "config"),
               XDG_DATA_HOME=str(tmp / "data"), HF_HUB_OFFLINE="1", RESEARCH_AGENT_WARMUP="false",
               PYTHONPATH=str(ROOT))
    return env


def _read_response(proc: subprocess.Popen, request_id: int) -> tuple[dict, int]:
    """The response to `request_id` and its size on the wire in bytes."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
        message = json.loads(line)
        if message.get("id") == request_id:
            return message, len(line.rstrip(b"\n"))


def _context_bytes(tools: list[dict]) -> int:
    """What a model carries of tools/list: each tool's name, description and input schema (a model API's tool
    definition has only these; output schemas and annotations stay with the client)."""
    kept = [{k: t[k] for k in ("name", "description", "inputSchema") if k in t} for t in tools]
    return len(json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode())


def one_spawn(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int, int]:
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}) + "\n").encode())
        proc.stdin.flush()
        _read_response(proc, 1)
        initialized = time.perf_counter() - started
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
                         b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}\n')
        proc.stdin.flush()
        tools, size = _read_response(proc, 2)
        listed = time.perf_counter() - started
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return initialized, listed, size, _context_bytes(tools["result"]["tools"])


def bare(code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--command", default=f"{shlex.quote(sys.executable)} mcp_server.py",
                        help="how to start the server (run from the repository root)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    command = shlex.split(args.command)
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(Path(tmp))
        one_spawn(command, env, ROOT)  # warm the OS file cache and __pycache__
        runs = [one_spawn(command, env, ROOT) for _ in range(args.runs)]
    result = {
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "initialize_median_s": round(statistics.median(r[0] for r in runs), 3),
        "initialize_min_s": round(min(r[0] for r in runs), 3),
        "tools_list_median_s": round(statistics.median(r[1] for r in runs), 3),
        "tools_list_bytes": runs[-1][2],
        "tools_list_context_bytes": runs[-1][3],
        "python_startup_median_s": round(bare("pass", 5), 3),
        "import_mcp_types_median_s": round(bare("import mcp.types", 5), 3),
        "import_fastmcp_median_s": round(bare("import fastmcp", 5), 3),
        "import_mcp_server_median_s": round(bare("import mcp_server", 5), 3),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
