"""Keyword search at scale (issue 16): what a write by another process costs the next query, and what a new
process pays for its first keyword query, on a real embedded store of N chunks.

Usage: .venv/bin/python benchmarks/scale.py [--chunks 100000] [--store DIR] [--queries 100] [--json]

The store (default benchmarks/.cache/scale/<N>) is built once like benchmarks/query_latency.py builds its own:
SciFact chunks cycled with a numbered title, one chunk per document, the SciFact store's vectors reused (no
re-embedding). Then, in order:
  1. first keyword query of a new process with no index (the first build: every chunk read from Chroma);
  2. first keyword query of a new process with the index saved (open + query);
  3. warm keyword query p50 / p95 over SciFact test queries in this long-lived process (query_knowledge,
     mode keyword, no rerank: the whole service path);
  4. another process adds one document (`kb add-research`'s path, real model), then this process's next keyword
     query: its catch-up mode, documents touched, index entries and bytes of state written, and time;
  5. a new process's first keyword query after that write (someone already caught up: open + query).
With --freshness ROUNDS, only: the next keyword and hybrid query 0, 1, 3 and 6 s after another process's write,
with and without the freshness watcher (search/freshness.py), alternated; and the watcher's idle CPU.
Figures: benchmarks/SCALE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
COLLECTION = "scale"

CHILD_QUERY = """
import json, resource, sys, time
t0 = time.perf_counter()
from research_agent.container import build_container
from research_agent.search import keyword_sync
from research_agent.search.service import query_knowledge
c = build_container(store=sys.argv[1])
t1 = time.perf_counter()
with c.store.session():
    res = query_knowledge(c, sys.argv[2], collections=[sys.argv[3]], mode="keyword", rerank=False)
t2 = time.perf_counter()
done = [{"mode": x.mode, "documents": len(x.documents), "chunks": x.chunks, "seconds": x.seconds}
        for x in keyword_sync.RECENT]
print(json.dumps({"process_s": t2 - t0, "query_s": t2 - t1, "hits": len(res.results), "catch_ups": done,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

CHILD_WRITE = """
import sys, time
from research_agent.catalog import notes
from research_agent.container import build_container
c = build_container(store=sys.argv[1])
t = time.perf_counter()
stamp = time.time_ns()  # a new text each run: an unchanged note is not written again
notes.add_research(c, sys.argv[2], f"Scale probe {stamp}: tardigrades survive the vacuum of space.",
                   f"scale-probe-{stamp}", title=f"Scale probe {stamp}")
print(time.perf_counter() - t)
"""


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def child(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=3600,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


def build_store(store: Path, n: int) -> None:
    """N one-chunk documents (query_latency.py's corpus and vector reuse), written 500 per commit."""
    from query_latency import CachedEmbeddingContainer, corpus
    from research_agent.catalog import collections
    from research_agent.catalog.collections import open_collection
    from research_agent.container import build_container
    from research_agent.ingest import PreparedDocument, content_hash, write_documents
    from research_agent.ingest.chunking import chunk_document
    from research_agent.ingest.parsing import ParsedDocument

    c = build_container(store=str(store))
    if not c.store.has_collection(COLLECTION):
        collections.create_collection(c, COLLECTION)
    have = open_collection(c, COLLECTION).count()
    if have >= n:
        return
    items, vectors = corpus(c, n)
    if vectors:
        c = CachedEmbeddingContainer(c.settings, vectors)
    started = time.perf_counter()
    for start in range(have, n, 500):
        docs = []
        for j, (title, body) in enumerate(items[start:start + 500], start=start):
            chunks = chunk_document(ParsedDocument(text=body, format="text", title=title), source=f"doc{j}",
                                    max_tokens=c.settings.chunk_max_tokens)[:1]
            docs.append(PreparedDocument(document=f"doc{j}", title=title, kind="document", source=f"doc{j}",
                                         content_hash=content_hash(f"{title}\n{body}"), chunks=chunks))
        write_documents(c, COLLECTION, docs)
        if (start // 500) % 20 == 0:
            log(f"ingest {start + len(docs)}/{n} ({time.perf_counter() - started:.0f} s)")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def warm_queries(store: Path, queries: list[str]) -> tuple[object, dict]:
    from research_agent.container import build_container
    from research_agent.search.service import query_knowledge

    c = build_container(store=str(store))
    lat = []
    with c.store.session():
        for q in queries[:5]:
            query_knowledge(c, q, collections=[COLLECTION], mode="keyword", rerank=False)
        for q in queries:
            t = time.perf_counter()
            query_knowledge(c, q, collections=[COLLECTION], mode="keyword", rerank=False)
            lat.append((time.perf_counter() - t) * 1000)
    return c, {"warm_p50_ms": pct(lat, 50), "warm_p95_ms": pct(lat, 95), "queries": len(lat)}


def after_write(c, store: Path) -> dict:
    from research_agent.search import keyword_sync
    from research_agent.search.service import query_knowledge

    write_s = float(child(CHILD_WRITE, str(store), COLLECTION))
    before = len(keyword_sync.RECENT)
    t = time.perf_counter()
    with c.store.session():
        res = query_knowledge(c, "tardigrades vacuum", collections=[COLLECTION], mode="keyword", rerank=False)
    took = time.perf_counter() - t
    done = list(keyword_sync.RECENT)[before:]
    return {"other_process_write_s": write_s, "next_query_s": took,
            "found": bool(res.results) and "tardigrades" in res.results[0].content,
            "catch_up": [{"mode": x.mode, "documents": len(x.documents), "chunks": x.chunks,
                          "entries": x.entries, "state_bytes": x.state_bytes,
                          "seconds": round(x.seconds, 4)} for x in done]}


#: Seconds between another process's commit and the next query (--freshness).
FRESHNESS_DELAYS = (0.0, 1.0, 3.0, 6.0)
#: How long the watcher's idle cost is sampled (seconds of wall time, nothing written).
IDLE_SECONDS = 30.0


def next_query_after_write(c, store: Path, mode: str, delay: float, watch: bool) -> dict:
    """Another process writes one document; `delay` s after it returns, this process's next `mode` query."""
    from research_agent.search.freshness import FreshnessWatcher
    from research_agent.search.service import query_knowledge

    watcher = FreshnessWatcher(c)
    if watch:
        watcher.start()
    try:
        write_s = float(child(CHILD_WRITE, str(store), COLLECTION))
        time.sleep(delay)
        reopens, t = c.store.reopens, time.perf_counter()
        with c.store.session():
            res = query_knowledge(c, "tardigrades vacuum", collections=[COLLECTION], mode=mode, rerank=False)
        took = time.perf_counter() - t
    finally:
        watcher.stop()
    return {"mode": mode, "delay_s": delay, "watcher": watch, "next_query_s": round(took, 3), "rss_mb": rss_mb(),
            "write_s": round(write_s, 2), "reopened_by_query": c.store.reopens > reopens,
            "found": bool(res.results) and "tardigrades" in res.results[0].content}


def rss_mb() -> int:
    """This process's resident memory now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1_000_000


def watcher_idle_cpu(c) -> dict:
    """CPU time this process spends over IDLE_SECONDS with and without the watcher, nothing written."""
    from research_agent.search.freshness import FreshnessWatcher

    out = {}
    for watch in (False, True):
        watcher = FreshnessWatcher(c)
        if watch:
            watcher.start()
        cpu = time.process_time()
        time.sleep(IDLE_SECONDS)
        out["cpu_pct_watcher" if watch else "cpu_pct_none"] = round(
            100 * (time.process_time() - cpu) / IDLE_SECONDS, 3)
        watcher.stop()
    return out


#: The run stops when this process holds more (MB): each reopen of a 1M store's client costs memory (a run
#: without this limit was killed by the OOM killer at 19 GB on a shared 24 GB machine).
RSS_LIMIT_MB = 9000


def freshness(store: Path, rounds: int, delays: tuple[float, ...] = FRESHNESS_DELAYS) -> dict:
    """The next query after another process's write, keyword and hybrid, with and without the freshness
    watcher, at each of FRESHNESS_DELAYS, alternated in one run (search/freshness.py)."""
    from research_agent.container import build_container
    from research_agent.search.service import query_knowledge

    c = build_container(store=str(store))
    with c.store.session():
        for mode in ("keyword", "hybrid"):
            query_knowledge(c, "warm up", collections=[COLLECTION], mode=mode, rerank=False)
    rows = []
    for _ in range(rounds):
        for delay in delays:
            for mode in ("keyword", "hybrid"):
                for watch in (True, False):
                    if rss_mb() > RSS_LIMIT_MB:
                        log(f"stopped: {rss_mb()} MB resident")
                        return {"rows": rows, "stopped_at_mb": rss_mb(), "load_average": os.getloadavg()}
                    rows.append(next_query_after_write(c, store, mode, delay, watch))
                    log(json.dumps(rows[-1]))
    return {"chunks_store": str(store), "rows": rows, "idle": watcher_idle_cpu(c),
            "load_average": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--store", default=None)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--freshness", type=int, default=0, metavar="ROUNDS",
                    help="only the next query after another process's write, with and without the watcher")
    ap.add_argument("--delays", default=",".join(f"{d:g}" for d in FRESHNESS_DELAYS),
                    help="seconds between the write and the next query (--freshness), comma-separated")
    args = ap.parse_args()
    if args.freshness:
        store = Path(args.store or ROOT / "benchmarks" / ".cache" / "scale" / str(args.chunks))
        delays = tuple(float(d) for d in args.delays.split(","))
        print(json.dumps(freshness(store, args.freshness, delays), indent=None if args.json else 2))
        return 0
    from keyword_engines import judged_queries
    from research_agent.container import build_container
    from research_agent.search import keyword_sync
    from research_agent.search.keyword_index import field_weights, persist_folder

    store = Path(args.store or ROOT / "benchmarks" / ".cache" / "scale" / str(args.chunks))
    t = time.perf_counter()
    build_store(store, args.chunks)
    out: dict = {"chunks": args.chunks, "store_build_s": time.perf_counter() - t}
    c = build_container(store=str(store))
    from research_agent.catalog.collections import open_collection

    folder = keyword_sync.index_path(persist_folder(c, open_collection(c, COLLECTION)), field_weights(c.settings))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    queries = list(judged_queries("scifact", args.queries)[0].values())
    out["new_process_first_build"] = json.loads(child(CHILD_QUERY, str(store), queries[0], COLLECTION))
    log(json.dumps(out))
    out["new_process_index_saved"] = json.loads(child(CHILD_QUERY, str(store), queries[1], COLLECTION))
    c, out["warm"] = warm_queries(store, queries)
    out["after_other_process_write"] = after_write(c, store)
    out["new_process_after_write"] = json.loads(child(CHILD_QUERY, str(store), queries[2], COLLECTION))
    out["index_disk_mb"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6
    out["store_disk_mb"] = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 1e6
    import resource

    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
