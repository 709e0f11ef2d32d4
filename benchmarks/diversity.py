"""The diversity pass (research_agent/search/diversity.py): what MMR costs in ranking quality and in time, and
how many same-section duplicates it removes from the top 5, for a grid of MMR_LAMBDA values.

Usage: .venv/bin/python benchmarks/diversity.py [--sets docsqa,scifact,nfcorpus] [--store-root DIR] [--limit N]
       [--lambdas 1,0.85,0.7,0.5,0.3] [--plain]

Each query runs through the real `query_knowledge` twice, without and with `diverse=True` (no reranker, as
offline). The diversity pass is observed: its pool (3 x top_k candidates, capped per document sections first),
their calibrated scores and stored vectors are kept, then MMR is re-run offline for each lambda (1: no MMR,
only the near-copies-last cap; --plain: every pair treated as one section, so redundancies' thresholded
cosine (diversity.NEAR_COPY_COSINE) applies across sections too). Stores: <store-root>/<set> (copies of the caches of
benchmarks/docsqa.py and benchmarks/beir_sets.py, so nothing here writes to a store another run reads).

Sets: docsqa (40 questions on research-agent's own docs, section judgments, a section counted once, as
benchmarks/docsqa.py scores it; the default per-document cap and none) and SciFact / NFCorpus test (a document
counted once; cap 1, as `research-agent eval` ranks, and the default cap). "off": `diverse=False`. "dup@5":
hits in the top 5 whose section (collection, document, header_path) repeats an earlier hit's. "+-": 1.96
standard errors of the per-query difference from "off".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOP_K = 10


def judged_queries(name: str, limit: int | None) -> list[tuple[str, str, dict[str, int]]]:
    """(id, text, judgments) of a set's test queries."""
    if name == "docsqa":
        from docsqa import JUDGMENTS

        rows = [json.loads(line) for line in JUDGMENTS.read_text().splitlines() if line.strip()]
        out = [(j["id"], j["query"], j["rel"]) for j in rows]
    else:
        from beir_sets import split_files
        from research_agent.search.evaluation import read_qrels, read_queries

        qpath, rpath = split_files(name, "test", ROOT.parent / "shared" / "data")
        queries, qrels = read_queries(qpath), read_qrels(rpath)
        out = [(q, queries[q], qrels[q]) for q in qrels if q in queries and any(g > 0 for g in qrels[q].values())]
    return out[:limit]


def key(name: str, cand) -> str:
    """What a judgment names: a docsqa section (docsqa.section), a BEIR document id."""
    if name == "docsqa":
        from docsqa import section

        return section(cand)
    return cand.metadata.get("source_document", "")


def observe(c, name: str, queries: list, cap: int | None) -> list[dict]:
    """Per query: the diversity pass's pool (keys, sections), scores, vectors, and the timings."""
    from research_agent.search import diversity
    from research_agent.search.service import query_knowledge

    seen: dict = {}
    real = diversity.diversify

    def spy(c_, pool, scores, k, lam=diversity.MMR_LAMBDA):
        t = time.perf_counter()
        vectors = diversity.chunk_vectors(c_, pool)
        seen.update(vectors=vectors, scores=list(scores), read_ms=(time.perf_counter() - t) * 1000,
                    keys=[key(name, x) for x in pool],
                    sections=[diversity.section_of(x) for x in pool])
        return real(c_, pool, scores, k, lam)

    diversity.diversify = spy
    out = []
    try:
        for i, (qid, text, rel) in enumerate(queries):
            seen.clear()
            res = query_knowledge(c, text[: c.settings.max_query_chars], collections=[name], top_k=TOP_K,
                                  rerank=False, diverse=True, per_document_cap=cap)
            row = dict(seen, qid=qid, rel=rel, total_ms=res.timings_ms["total"],
                       pass_ms=res.timings_ms.get("diversity", 0.0))
            plain = query_knowledge(c, text[: c.settings.max_query_chars], collections=[name], top_k=TOP_K,
                                    rerank=False, per_document_cap=cap)
            row["plain"] = [key(name, h) for h in plain.results]
            row["plain_sections"] = [(h.metadata.get("collection"), h.source_document, h.header_path)
                                     for h in plain.results]
            row["plain_ms"] = plain.timings_ms["total"]
            out.append(row)
    finally:
        diversity.diversify = real
    return out


def baseline(rows: list[dict]) -> tuple[list[float], list[int]]:
    """Per query nDCG@10 and dup@5 of the plain query (`diverse=False`)."""
    from research_agent.search.evaluation import ndcg_at_k

    ndcg = [ndcg_at_k(list(dict.fromkeys(r["plain"]))[:TOP_K], r["rel"], TOP_K) for r in rows]
    return ndcg, [len(r["plain_sections"][:5]) - len(set(r["plain_sections"][:5])) for r in rows]


def score(rows: list[dict], lam: float, plain: bool = False) -> tuple[list[float], list[int]]:
    """Per query nDCG@10 (each key counted once) and dup@5 under MMR with `lam` on the diverse pool (which
    cap_sections_first built: lambda 1 is that cap alone, without MMR)."""
    from research_agent.search.diversity import mmr_order, redundancies
    from research_agent.search.evaluation import ndcg_at_k

    ndcg, dups = [], []
    for r in rows:
        if not r.get("scores"):
            ndcg.append(0.0)
            dups.append(0)
            continue
        sections = [0] * len(r["sections"]) if plain else r["sections"]
        order = mmr_order(r["scores"], redundancies(r["vectors"], sections), TOP_K, lam)
        keys = [r["keys"][i] for i in order]
        ndcg.append(ndcg_at_k(list(dict.fromkeys(keys))[:TOP_K], r["rel"], TOP_K))
        top5 = [r["sections"][i] for i in order[:5]]
        dups.append(len(top5) - len(set(top5)))
    return ndcg, dups


def report(name: str, rows: list[dict], lambdas: list[float], plain: bool) -> None:
    base, base_dups = baseline(rows)
    read = statistics.median(r["read_ms"] for r in rows)
    print(f"\n{name}: {len(rows)} queries; per query: vectors read {read:.1f} ms median, "
          f"diversity pass {statistics.median(r['pass_ms'] for r in rows):.1f} ms median, "
          f"query {statistics.median(r['total_ms'] for r in rows):.0f} ms median")
    print("| lambda | nDCG@10 | diff +- | dup@5 (mean) | queries with a dup@5 |")
    print("|---|---|---|---|---|")
    print(f"| off | {statistics.fmean(base):.4f} | | {statistics.fmean(base_dups):.2f} | "
          f"{sum(d > 0 for d in base_dups)} |")
    for lam in lambdas:
        ndcg, dups = score(rows, lam, plain)
        diff = [a - b for a, b in zip(ndcg, base)]
        half = 1.96 * statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
        print(f"| {lam:g} | {statistics.fmean(ndcg):.4f} | {statistics.fmean(diff):+.4f} +- {half:.4f} | "
              f"{statistics.fmean(dups):.2f} | {sum(d > 0 for d in dups)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="docsqa,scifact,nfcorpus")
    ap.add_argument("--store-root", default="/tmp/diversity-stores")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--lambdas", default="1,0.85,0.7,0.5,0.3")
    ap.add_argument("--plain", action="store_true", help="near-copies across sections too, for comparison")
    args = ap.parse_args()
    from research_agent.container import build_container

    lambdas = [float(x) for x in args.lambdas.split(",")]
    for name in args.sets.split(","):
        c = build_container(store=str(Path(args.store_root) / name))
        queries = judged_queries(name, args.limit)
        caps = (None, 0) if name == "docsqa" else (1, None)
        for cap in caps:
            rows = observe(c, name, queries, cap)
            report(f"{name} (per-document cap {'default' if cap is None else cap})", rows, lambdas, args.plain)
        c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
