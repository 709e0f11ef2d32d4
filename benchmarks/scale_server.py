"""Keyword search at scale through a `chroma run` server (issue 16): two writers, two servers of ours.

Usage: .venv/bin/python benchmarks/scale_server.py [--chunks 10000] [--data DIR] [--queries 100] [--json]

benchmarks/scale.py measures an embedded store; this is its server-mode counterpart, reusing its corpus, store
build and child processes (`scale.build_store`, `scale.CHILD_QUERY`, `scale.warm_queries`). In order:
  0. a real `chroma run` server is started on loopback (data in DIR/chroma, default benchmarks/.cache/scale-server/
     <N>) and loaded with N one-chunk documents (SciFact vectors reused), unless it holds them already;
  1. two long-lived processes of ours ("server A" and "server B": what two editors' MCP servers on two machines
     are), each with its own keyword index cache (XDG_CACHE_HOME=DIR/cache-a, cache-b: server mode keeps the
     index in the user's cache), answer their first keyword query (a build from the server), then warm p50/p95;
  2. two writer processes add one note each at the same time (`kb add-research`'s path, real model);
  3. each server's next keyword query: its catch-up mode, documents touched, manifests read, change records
     skipped as already applied (the load's, still inside the 5-minute skew window), seconds, and whether it
     finds both writers' notes (correctness, not only speed);
  4. a new process on A's machine (cache A, already caught up) and one on a third machine (empty cache): their
     first keyword query.
Every child has a timeout and the chroma server is stopped at the end (also on error). Figures:
benchmarks/SCALE.md, "Through a Chroma server".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402  (benchmarks/ on the path first)

#: Longest wait for `chroma run` to accept connections, and for one child step (a first build at 100k ~70 s).
SERVER_START_SECONDS = 60
STEP_SECONDS = 1800

# One long-lived "server" of ours: reads one JSON command a line, answers one JSON line.
CHILD_SERVER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import scale
from research_agent.container import build_container
from research_agent.search import keyword_sync
from research_agent.search.service import query_knowledge
c = build_container(store=sys.argv[1])
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "warm":
        c, stats = scale.warm_queries(Path(sys.argv[1]), cmd["queries"])
        print(json.dumps(stats), flush=True)
        continue
    keyword_sync.RECENT.clear()
    t = time.perf_counter()
    with c.store.session():
        res = query_knowledge(c, cmd["text"], collections=[scale.COLLECTION], mode="keyword", rerank=False,
                              top_k=10)
    took = time.perf_counter() - t
    print(json.dumps({"query_s": took, "documents": [h.source_document for h in res.results],
                      "catch_up": [{"mode": x.mode, "documents": len(x.documents), "chunks": x.chunks,
                                    "manifests": x.manifests, "records_skipped": x.skipped,
                                    "seconds": round(x.seconds, 4)} for x in keyword_sync.RECENT]}), flush=True)
"""

# One writer: a note whose source names the writer, so each server's answer shows whose writes it sees.
CHILD_WRITER = """
import json, sys, time
from research_agent.catalog import notes
from research_agent.container import build_container
c = build_container(store=sys.argv[1])
t = time.perf_counter()
stamp = time.time_ns()
r = notes.add_research(c, sys.argv[2], f"Probe {sys.argv[3]} {stamp}: tardigrades survive the vacuum of space.",
                       f"probe-{sys.argv[3]}-{stamp}", title=f"Probe {sys.argv[3]} {stamp}")
print(json.dumps({"write_s": time.perf_counter() - t, "document": r.document}))
"""


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_chroma(data: Path, port: int) -> subprocess.Popen:
    """`chroma run` on loopback (what tests/conftest.py starts), answering within SERVER_START_SECONDS."""
    exe = shutil.which("chroma") or str(Path(sys.executable).parent / "chroma")
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([exe, "run", "--path", str(data), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=open(data.parent / "chroma.log", "ab"))
    deadline = time.time() + SERVER_START_SECONDS
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"chroma run did not start within {SERVER_START_SECONDS} s")


class Ours:
    """A long-lived process of ours with its own keyword index cache (one editor's MCP server)."""

    def __init__(self, store: Path, cache: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD_SERVER, str(store), str(ROOT / "benchmarks")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cache)))

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = _readline(self.proc, STEP_SECONDS)
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise RuntimeError(f"no answer within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"our server process exited ({proc.poll()})")
    return line


def two_writers(store: Path) -> list[dict]:
    """Two processes adding one note each, started together."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD_WRITER, str(store), scale.COLLECTION, name],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for name in ("writer-a", "writer-b")]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=STEP_SECONDS)
        if p.returncode:
            raise RuntimeError(stderr[-3000:])
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def after_writes(servers: dict[str, Ours], written: list[dict]) -> dict:
    """Each server's next query: its catch-up, and whether both writers' notes are among its hits."""
    wanted = {w["document"] for w in written}
    out = {}
    for name, ours in servers.items():
        got = ours.ask(op="query", text="tardigrades survive vacuum")
        got["sees_both_writes"] = wanted <= set(got.pop("documents"))
        out[name] = got
    return out


def new_process(store: Path, cache: Path, text: str) -> dict:
    os.environ["XDG_CACHE_HOME"] = str(cache)  # scale.child passes os.environ on
    return json.loads(scale.child(scale.CHILD_QUERY, str(store), text, scale.COLLECTION))


def measure(data: Path, n: int, queries: list[str]) -> dict:
    store = data / "local"  # the settings' store folder (server mode keeps only small local files there)
    t = time.perf_counter()
    scale.build_store(store, n)
    out: dict = {"chunks": n, "load_s": round(time.perf_counter() - t, 1)}
    for cache in ("cache-a", "cache-b", "cache-c"):
        shutil.rmtree(data / cache, ignore_errors=True)
    servers = {name: Ours(store, data / f"cache-{name[-1]}") for name in ("server_a", "server_b")}
    try:
        out["first_query"] = {name: s.ask(op="query", text=queries[0]) for name, s in servers.items()}
        for got in out["first_query"].values():
            got.pop("documents")
        log(json.dumps(out))
        out["warm"] = {name: s.ask(op="warm", queries=queries) for name, s in servers.items()}
        out["writers"] = two_writers(store)
        out["next_query_after_writes"] = after_writes(servers, out["writers"])
        out["second_query_after_writes"] = after_writes(servers, out["writers"])
    finally:
        for s in servers.values():
            s.close()
    out["new_process_machine_a"] = new_process(store, data / "cache-a", queries[1])
    out["new_process_empty_cache"] = new_process(store, data / "cache-c", queries[2])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--data", default=None)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from keyword_engines import judged_queries

    data = Path(args.data or ROOT / "benchmarks" / ".cache" / "scale-server" / str(args.chunks))
    port = free_port()
    chroma = start_chroma(data / "chroma", port)
    os.environ.update(RESEARCH_AGENT_CHROMA_HOST="127.0.0.1", RESEARCH_AGENT_CHROMA_PORT=str(port),
                      HF_HUB_OFFLINE="1")
    try:
        queries = list(judged_queries("scifact", args.queries)[0].values())
        out = measure(data, args.chunks, queries)
    finally:
        chroma.terminate()
        try:
            chroma.wait(timeout=30)
        except subprocess.TimeoutExpired:
            chroma.kill()
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
