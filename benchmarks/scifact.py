"""SciFact retrieval benchmark: nDCG@10, Recall@10, MRR@10 and query latency per mode.

Usage: .venv/bin/python benchmarks/scifact.py [DATA_DIR] [--store DIR] [--limit N] [--k 10]
       [--modes semantic,keyword,hybrid,hybrid+rerank] [--reranker NAME_OR_PATH] [--json]

DATA_DIR holds the BEIR SciFact files (corpus.jsonl, queries.jsonl, qrels/test.tsv); default
../shared/data/scifact relative to the repository root. The store is built once under
benchmarks/.cache/scifact/<embedding model>/ and reused (ingest resumes if interrupted).
It runs the same code as `research-agent eval` (research_agent.search.evaluation.evaluate).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
COLLECTION = "scifact"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    ap.add_argument("--store", default=None, help="store folder (default benchmarks/.cache/scifact/<model>)")
    ap.add_argument("--limit", type=int, default=None, help="evaluate only the first N judged queries")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--modes", default="semantic,keyword,hybrid,hybrid+rerank")
    ap.add_argument("--reranker", default=None, help="reranker model name or folder (default: the configured one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    data = Path(args.data)
    needed = [data / "corpus.jsonl", data / "queries.jsonl", data / "qrels" / "test.tsv"]
    if not all(p.is_file() for p in needed):
        print(f"SciFact not found at {data}.\nPut the BEIR SciFact files there (corpus.jsonl, queries.jsonl, "
              "qrels/test.tsv; https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip) "
              "or pass the folder as the first argument.")
        return 0

    from research_agent.catalog import collections
    from research_agent.container import build_container
    from research_agent.search.evaluation import evaluate, ingest_beir_corpus

    overrides = {"reranker_model": args.reranker} if args.reranker else {}
    probe = build_container(**overrides)
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", probe.settings.embedding_model)
    store = Path(args.store) if args.store else ROOT / "benchmarks" / ".cache" / "scifact" / model
    c = build_container(store=str(store), **overrides)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    if not c.store.has_collection(COLLECTION):
        collections.create_collection(c, COLLECTION, description="BEIR SciFact (benchmark)")
    started = time.perf_counter()
    written = ingest_beir_corpus(c, COLLECTION, needed[0],
                                 progress=lambda p: log(f"ingest {p.documents_done}/{p.documents_total}"))
    if written:
        log(f"ingested {written} chunks in {time.perf_counter() - started:.0f} s")
    # Warm the models and the keyword index so latencies are warm-query latencies.
    from research_agent.search.service import query_knowledge

    query_knowledge(c, "warm up", collections=[COLLECTION], rerank=False)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    report = evaluate(c, COLLECTION, needed[1], needed[2], k=args.k, modes=modes, limit=args.limit,
                      progress=lambda m, d, t: d % 100 == 0 and log(f"{m}: {d}/{t}"))
    if args.json:
        print(report.model_dump_json(indent=2))
        return 0
    s = c.settings
    print(
        f"SciFact test, {report.queries_evaluated} queries, k={report.k}; embedding {s.embedding_model}, "
        f"reranker {s.reranker_model}; {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"
    )
    print(f"| mode | nDCG@{report.k} | Recall@{report.k} | MRR@{report.k} | p50 ms | p95 ms |")
    print("|---|---|---|---|---|---|")
    for m in report.modes:
        if not m.available:
            print(f"| {m.mode} | unavailable: {m.reason} | | | | |")
        else:
            print(f"| {m.mode} | {m.ndcg:.3f} | {m.recall:.3f} | {m.mrr:.3f} | {m.latency_p50_ms:.0f} | "
                  f"{m.latency_p95_ms:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
