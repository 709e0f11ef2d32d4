"""Fusion and calibration study on candidate pools: dump once, then compare fusion rules offline.

Usage: .venv/bin/python benchmarks/fusion_study.py dump SET SPLIT   # e.g. dump nfcorpus train
       .venv/bin/python benchmarks/fusion_study.py compare           # every dumped pool, every rule

`dump` runs the hybrid retrieval (research_agent.query.retrieve_candidates, 50 candidates per retriever, as
`query_knowledge` asks for) for every judged query of a split and stores each candidate's raw cosine and BM25
score under benchmarks/.cache/pools/. Semantic and keyword orders are exact on the pool: a chunk outside
the dense top 50 has a lower cosine than all of it (likewise BM25). `compare` ranks each pool by each fusion
rule of research_agent.query (one slot per document, as `eval` ranks) and prints nDCG@10 per set and rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
POOLS = ROOT / "benchmarks" / ".cache" / "pools"


def dump(name: str, split: str, limit: int | None = None) -> Path:
    from beir_sets import open_set
    from research_agent.evaluation import read_qrels, read_queries
    from research_agent.query import retrieve_candidates

    c, data = open_set(name, Path(ROOT.parent / "shared" / "data"))
    queries, qrels = read_queries(data / "queries.jsonl"), read_qrels(data / "qrels" / f"{split}.tsv")
    todo = [q for q in qrels if q in queries and any(g > 0 for g in qrels[q].values())][:limit]
    POOLS.mkdir(parents=True, exist_ok=True)
    out = POOLS / f"{name}-{split}.jsonl"
    with out.open("w") as fh:
        for i, qid in enumerate(todo, start=1):
            cands = retrieve_candidates(c, queries[qid][: c.settings.max_query_chars], [name], mode="hybrid", n=50)
            fh.write(json.dumps({"qid": qid, "qrels": qrels[qid], "cands": [
                [x.metadata.get("source_document"), round(x.dense or 0.0, 5), round(x.keyword or 0.0, 4)]
                for x in cands]}) + "\n")
            if i % 200 == 0:
                print(f"{name} {split}: {i}/{len(todo)}", file=sys.stderr, flush=True)
    return out


def load(name: str, split: str) -> list[dict]:
    return [json.loads(line) for line in (POOLS / f"{name}-{split}.jsonl").open()]




# -- offline ranking ------------------------------------------------------------------------------
def ndcg10(docs: list[str], judged: dict[str, int]) -> float:
    from research_agent.evaluation import ndcg_at_k

    return ndcg_at_k(list(dict.fromkeys(docs))[:10], judged, 10)


def pool_arrays(rec: dict):
    import numpy as np

    docs = [c[0] for c in rec["cands"]]
    return docs, np.array([c[1] for c in rec["cands"]]), np.array([c[2] for c in rec["cands"]])


def rank_by(rec: dict, score) -> list[str]:
    import numpy as np

    docs, d, k = pool_arrays(rec)
    order = np.argsort(-np.asarray(score(d, k)), kind="stable")
    return [docs[i] for i in order]


def mean_ndcg(recs: list[dict], score) -> float:
    return sum(ndcg10(rank_by(r, score), r["qrels"]) for r in recs) / len(recs)


def _mm(x):
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo) if hi > lo else x * 0 + (1.0 if hi > 0 else 0.0)


def _z(x):
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else x * 0


def _topk_gap(x, k=10):
    """How far the best score stands out of the next k-1, in pool standard deviations."""
    import numpy as np

    s = np.sort(x)[::-1]
    sd = x.std()
    return float((s[0] - s[1:k].mean()) / sd) if sd > 0 and len(s) > 1 else 0.0


def _overlap(d, k, n=10):
    import numpy as np

    return len(set(np.argsort(-d)[:n]) & set(np.argsort(-k)[:n])) / n


def rules() -> dict:
    import numpy as np

    from research_agent import query as q

    out = {"semantic": lambda d, k: d, "keyword": lambda d, k: k}
    for w in (0.5, 0.6, 0.7):
        out[f"mm{w}"] = (lambda w: lambda d, k: w * _mm(d) + (1 - w) * _mm(k))(w)
        out[f"z{w}"] = (lambda w: lambda d, k: w * _z(d) + (1 - w) * _z(k))(w)

    def gap(d, k):
        gd, gk = _topk_gap(d), _topk_gap(k)
        w = gd / (gd + gk) if gd + gk > 0 else 0.5
        return w * _mm(d) + (1 - w) * _mm(k)

    def overlap(d, k):
        wk = 0.5 * min(1.0, _overlap(d, k) / 0.3)
        return (1 - wk) * _mm(d) + wk * _mm(k)

    out["gap"], out["overlap"] = gap, overlap
    for tau in (0.2, 0.4, 0.5):
        out[f"overlap{tau}"] = (lambda tau: lambda d, k: (lambda wk: (1 - wk) * _mm(d) + wk * _mm(k))(
            0.5 * min(1.0, _overlap(d, k) / tau)))(tau)

    def agree(n):
        def fn(d, k):
            kd = _mm(k)[np.argsort(-d)[:n]].mean()   # how well BM25 rates the dense top n
            dk = _mm(d)[np.argsort(-k)[:n]].mean()   # how well dense rates the BM25 top n
            wk = 0.5 * min(1.0, dk / max(kd, 1e-9))
            return (1 - wk) * _mm(d) + wk * _mm(k)
        return fn
    for n in (5, 10):
        out[f"agree{n}"] = agree(n)
    for tau in (0.3, 0.5):
        out[f"zoverlap{tau}"] = (lambda tau: lambda d, k: (lambda wk: (1 - wk) * _z(d) + wk * _z(k))(
            0.5 * min(1.0, _overlap(d, k) / tau)))(tau)
    out["shipped"] = lambda d, k: np.asarray(q.fusion_scores(list(d), list(k)))
    return out


def compare(pools: list[str]) -> None:
    sets = {p: load(*p.split("-")) for p in pools}
    rs = rules()
    print("| rule | " + " | ".join(sets) + " |")
    for name, fn in rs.items():
        print(f"| {name} | " + " | ".join(f"{mean_ndcg(recs, fn):.4f}" for recs in sets.values()) + " |", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif sys.argv[1] == "chart":  # the three modes per set from the test pools (same ranking as `eval`)
        from beir_sets import chart

        fns = rules()
        res = [{"set": n, "queries": len(recs), "modes": {m: {"ndcg": mean_ndcg(recs, fns[r])} for m, r in
                (("semantic", "semantic"), ("keyword", "keyword"), ("hybrid", "mm0.5"))}}
               for n, recs in ((n, load(n, "test")) for n in ("scifact", "nfcorpus", "cosqa"))]
        for r in res:
            print(r["set"], r["queries"], {m: round(v["ndcg"], 4) for m, v in r["modes"].items()})
        chart(res, ROOT / "benchmarks" / "beir_sets.png")
    elif sys.argv[1] == "compare":
        compare(sys.argv[2:] or sorted(p.stem for p in POOLS.glob("*.jsonl")))
