"""Three public BEIR-format sets side by side: nDCG@10 of semantic, keyword and hybrid, and a chart.

Usage: .venv/bin/python benchmarks/beir_sets.py [--sets scifact,nfcorpus,cosqa] [--data DIR] [--ingest-only]
       [--limit N] [--modes semantic,keyword,hybrid] [--chart benchmarks/beir_sets.png]

Sets (in ../shared/data by default; see its README): SciFact (BM25 strong), NFCorpus (both weak), CoSQA
(code search, dense far ahead; each function ingested as a .py file, as a user's code would be). Each store
is built once under benchmarks/.cache/<set>/<embedding model>/ and reused. Scores come from the same code
as `research-agent eval` (research_agent.search.evaluation.evaluate), every mode in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
CACHE = ROOT / "benchmarks" / ".cache"
#: judgments rebuilt from the public releases (benchmarks/dev_sets.py): SciFact train, CoSQA dev
EXTRA = ROOT / "benchmarks" / "data"
#: name -> (ingest suffix, description)
SETS = {"scifact": (None, "BEIR SciFact test"), "nfcorpus": (None, "BEIR NFCorpus test"),
        "cosqa": (".py", "CoSQA test (code search)")}


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def open_set(name: str, data_root: Path):
    """(container, data folder) with the set's corpus ingested into its cached store."""
    from research_agent.catalog import collections
    from research_agent.container import build_container
    from research_agent.search.evaluation import ingest_beir_corpus

    model = re.sub(r"[^A-Za-z0-9._-]+", "_", build_container().settings.embedding_model)
    c = build_container(store=str(CACHE / name / model))
    if not c.store.has_collection(name):
        collections.create_collection(c, name, description=f"{SETS[name][1]} (benchmark)")
    data = data_root / name
    started = time.perf_counter()
    written = ingest_beir_corpus(c, name, data / "corpus.jsonl", suffix=SETS[name][0],
                                 progress=lambda p: log(f"{name}: ingest {p.documents_done}/{p.documents_total}"))
    if written:
        log(f"{name}: ingested {written} chunks in {time.perf_counter() - started:.0f} s")
    return c, data


def split_files(name: str, split: str, data_root: Path) -> tuple[Path, Path]:
    """(queries.jsonl, qrels.tsv) of a split: benchmarks/data first, then the shared set.

    Why: ../shared/data ships SciFact and CoSQA only as test; their train/dev judgments live in
    benchmarks/data (dev_sets.py). A split's own queries file (queries-dev.jsonl) wins over the shared one.
    """
    extra, shared = EXTRA / name, data_root / name
    qrels = next((p for p in (extra / "qrels" / f"{split}.tsv", shared / "qrels" / f"{split}.tsv") if p.is_file()),
                 shared / "qrels" / f"{split}.tsv")
    queries = extra / f"queries-{split}.jsonl"
    return (queries if queries.is_file() else shared / "queries.jsonl"), qrels


def evaluate_set(name: str, data_root: Path, modes: list[str], limit: int | None) -> dict:
    from research_agent.search.evaluation import evaluate
    from research_agent.search.service import query_knowledge

    c, data = open_set(name, data_root)
    query_knowledge(c, "warm up", collections=[name], rerank=False)
    queries, qrels = split_files(name, "test", data_root)
    report = evaluate(c, name, queries, qrels, modes=modes, limit=limit,
                      progress=lambda m, d, t: d % 100 == 0 and log(f"{name} {m}: {d}/{t}"))
    chunks = c.store.get_collection(name).count() if hasattr(c.store, "get_collection") else None
    return {"set": name, "queries": report.queries_evaluated, "chunks": chunks,
            "modes": {m.mode: m.model_dump() for m in report.modes}}


def chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["semantic", "keyword", "hybrid"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.26
    for i, mode in enumerate(modes):
        vals = [r["modes"].get(mode, {}).get("ndcg") or 0 for r in results]
        bars = ax.bar([x + (i - 1) * width for x in range(len(results))], vals, width, label=mode)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks(range(len(results)), [f"{r['set']} ({r['queries']} q)" for r in results])
    ax.set_ylabel("nDCG@10")
    ax.set_title("Retrieval quality per mode (all-MiniLM-L6-v2, BM25 on tantivy)")
    top = max((r["modes"].get(m, {}).get("ndcg") or 0 for r in results for m in modes), default=1.0)
    ax.set_ylim(0, top * 1.2)  # room for the legend above the bars (it hid CoSQA's hybrid label)
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="scifact,nfcorpus,cosqa")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--modes", default="semantic,keyword,hybrid")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--ingest-only", action="store_true")
    ap.add_argument("--cache", default=None,
                    help="read the stores from this folder instead of benchmarks/.cache (e.g. a copy: a query run "
                         "opens locks and may save the keyword index beside the store)")
    ap.add_argument("--chart", default=None, help="write a bar chart (PNG; needs matplotlib)")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    if args.cache:
        global CACHE
        CACHE = Path(args.cache)
    data_root = Path(args.data)
    missing = [n for n in names if not (data_root / n / "corpus.jsonl").is_file()]
    if missing:
        print(f"Data not found for {', '.join(missing)} under {data_root}; see ../shared/data/README.md.")
        return 0
    if args.ingest_only:
        for n in names:
            open_set(n, data_root)
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results = [evaluate_set(n, data_root, modes, args.limit) for n in names]
    print("| set | queries | " + " | ".join(f"{m} nDCG@10" for m in modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    for r in results:
        cells = [f"{r['modes'][m]['ndcg']:.3f}" if r["modes"][m]["ndcg"] is not None else "n/a" for m in modes]
        print(f"| {r['set']} | {r['queries']} | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    if args.chart:
        chart(results, Path(args.chart))
    return 0


if __name__ == "__main__":
    sys.exit(main())
