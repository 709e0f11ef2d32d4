"""Fusion and calibration study on candidate pools: dump once, then compare fusion rules offline.

Usage: .venv/bin/python benchmarks/fusion_study.py dump SET SPLIT   # e.g. dump nfcorpus train, scifact train, cosqa dev
       .venv/bin/python benchmarks/fusion_study.py compare           # every dumped pool, every rule
       .venv/bin/python benchmarks/fusion_study.py fit               # the adaptive weight, on train/dev pools only
       .venv/bin/python benchmarks/fusion_study.py chart             # beir_sets.png from the test pools
       .venv/bin/python benchmarks/fusion_study.py ceiling [POOL...]  # w = 0.5, best constant, oracle per query
       .venv/bin/python benchmarks/fusion_study.py sections SET SPLIT... [--cache DIR]  # BM25 per piece vs per section

`dump` runs the hybrid retrieval (research_agent.search.retrieve.retrieve_candidates, 50 candidates per retriever, as
`query_knowledge` asks for) for every judged query of a split and stores each candidate's raw cosine and BM25
score (and its section's node id) under benchmarks/.cache/pools/. Semantic and keyword orders are exact on the
pool: a chunk outside the dense top 50 has a lower cosine than all of it (likewise BM25). `compare` ranks each
pool by each fusion rule of research_agent.search.service (one slot per document, as `eval` ranks) and prints
nDCG@10 per set and rule.
`fit` fits the per-query dense weight of research_agent.search.retrieve.adaptive_dense_weight on the train/dev pools
(FIT_POOLS) and prints its constants with dev and test nDCG@10; test pools are only reported, never fitted.
`ceiling` prints what no convex min-max rule can beat on a pool: the best constant weight and the oracle
weight per query (both chosen on the pool's own judgments, so bounds to report, never settings to ship).
`sections` asks what splitting a section into pieces (every chunk fits the embedder's 256 tokens) cost: it
ranks the pools with bm25s (benchmarks/keyword_engines.py's analyzer and token layout) over each piece and over
each whole section (node), keyword alone and fused with the pool's cosines (best piece per section), at w = 0.5
and with the shipped adaptive weight.
Splits come from ../shared/data, or benchmarks/data for SciFact train and CoSQA dev (beir_sets.split_files).
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
    from beir_sets import open_set, split_files
    from research_agent.search.evaluation import read_qrels, read_queries
    from research_agent.search.retrieve import retrieve_candidates

    data_root = ROOT.parent / "shared" / "data"
    c, _ = open_set(name, data_root)
    qpath, rpath = split_files(name, split, data_root)
    queries, qrels = read_queries(qpath), read_qrels(rpath)
    todo = [q for q in qrels if q in queries and any(g > 0 for g in qrels[q].values())][:limit]
    POOLS.mkdir(parents=True, exist_ok=True)
    out = POOLS / f"{name}-{split}.jsonl"
    with out.open("w") as fh:
        for i, qid in enumerate(todo, start=1):
            cands = retrieve_candidates(c, queries[qid][: c.settings.max_query_chars], [name], mode="hybrid", n=50)
            fh.write(json.dumps({"qid": qid, "qrels": qrels[qid], "cands": [
                [x.metadata.get("source_document"), round(x.dense or 0.0, 5), round(x.keyword or 0.0, 4),
                 x.metadata.get("node_id"), x.id] for x in cands]}) + "\n")
            if i % 200 == 0:
                print(f"{name} {split}: {i}/{len(todo)}", file=sys.stderr, flush=True)
    return out


def load(name: str, split: str) -> list[dict]:
    return [json.loads(line) for line in (POOLS / f"{name}-{split}.jsonl").open()]




# -- offline ranking ------------------------------------------------------------------------------
def ndcg10(docs: list[str], judged: dict[str, int]) -> float:
    from research_agent.search.evaluation import ndcg_at_k

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

    from research_agent.search import retrieve as q

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


# -- fitting the adaptive weight (train/dev pools only) ---------------------------------------------
FIT_POOLS = (("scifact-train",), ("nfcorpus-train", "nfcorpus-dev"), ("cosqa-dev",))
TEST_POOLS = ("scifact-test", "nfcorpus-test", "cosqa-test")
WEIGHTS = [i / 100 for i in range(101)]
#: the fitted rule must beat the better single mode by this much on every dev set (nDCG@10 noise is ~0.003)
FIT_MARGIN = 0.003


def weight_features(d, k) -> list[float]:
    """The pool features of adaptive_dense_weight, in ADAPTIVE_WEIGHT_COEF's order."""
    from research_agent.search.calibration import bm25_squash

    return [float(d.max()), float(d.std()), bm25_squash(float(k.max()))]


def weight_table(recs: list[dict]):
    """(features, nDCG@10 at each of WEIGHTS) per query: a rule's score is a lookup, so a grid search is cheap."""
    import numpy as np

    X, Y = [], []
    for r in recs:
        docs, d, k = pool_arrays(r)
        nd, nk = _mm(d), _mm(k)
        X.append(weight_features(d, k))
        Y.append([ndcg10([docs[i] for i in np.argsort(-(w * nd + (1 - w) * nk), kind="stable")], r["qrels"])
                  for w in WEIGHTS])
    return np.array(X), np.array(Y)


def fit_weight() -> None:
    """Logistic 'dense beats BM25 on this query' on the features, then scale and offset by grid search."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    dev = {"+".join(g): weight_table([r for p in g for r in load(*p.split("-"))]) for g in FIT_POOLS}
    test = {p: weight_table(load(*p.split("-"))) for p in TEST_POOLS if (POOLS / f"{p}.jsonl").is_file()}
    X, y, sw = [], [], []
    for Xs, Ys in dev.values():
        diff = Ys[:, -1] - Ys[:, 0]
        keep = diff != 0
        X.append(Xs[keep]), y.append(diff[keep] > 0), sw.append(np.abs(diff[keep]) / np.abs(diff[keep]).sum())
    X = np.vstack(X)
    mu, sd = X.mean(0), X.std(0)
    clf = LogisticRegression(C=1.0, max_iter=5000).fit(
        (X - mu) / sd, np.concatenate(y), sample_weight=np.concatenate(sw)
    )
    beta, beta0 = clf.coef_[0] / sd, clf.intercept_[0] - float(np.sum(clf.coef_[0] * mu / sd))

    def score(tab, a, b):
        Xs, Ys = tab
        w = 1 / (1 + np.exp(-(a + b * (Xs @ beta + beta0))))
        return Ys[np.arange(len(Ys)), np.rint(w * 100).astype(int)].mean(), max(Ys[:, -1].mean(), Ys[:, 0].mean())

    def objective(a, b):
        res = [score(t, a, b) for t in dev.values()]
        return np.mean([h for h, _ in res]) + 3 * np.mean([min(0.0, h - best - FIT_MARGIN) for h, best in res])

    _, a, b = max((objective(a, b), a, b) for a in np.arange(-1.0, 2.01, 0.1) for b in np.arange(0.0, 8.01, 0.25))
    print(f"ADAPTIVE_WEIGHT_INTERCEPT = {a + b * beta0:.3f}; coef (top_cosine, cosine_sd, top_bm25) = "
          f"{[round(float(v), 3) for v in b * beta]}")
    for name, tab in {**dev, **test}.items():
        print(f"{name}: hybrid {score(tab, a, b)[0]:.4f}, best single mode {score(tab, a, b)[1]:.4f}, "
              f"w=0.5 {tab[1][:, 50].mean():.4f}")


def ceiling(pools: list[str]) -> dict[str, dict[str, float]]:
    """nDCG@10 of convex min-max fusion at w = 0.5, at the best constant weight and at the best weight per
    query (an oracle), each weight from WEIGHTS; the last two are fitted on the pool's own judgments."""
    out = {}
    for p in pools:
        _, Y = weight_table(load(*p.split("-")))
        mean = Y.mean(0)
        best = int(mean.argmax())
        out[p] = {"w0.5": float(mean[WEIGHTS.index(0.5)]), "best_w": WEIGHTS[best], "best_constant": float(mean[best]),
                  "oracle_per_query": float(Y.max(1).mean())}
        print(f"{p}: w=0.5 {out[p]['w0.5']:.4f}, best constant w={WEIGHTS[best]:.2f} {mean[best]:.4f}, "
              f"oracle per-query w {out[p]['oracle_per_query']:.4f}")
    return out


def _bm25_indexes(name: str, cache: Path | None):
    """bm25s over every piece and over every section (a node's pieces joined, title and keywords once)."""
    import bm25s

    import keyword_engines as ke

    if cache:
        ke.CACHE = cache
    an = ke.Analyzer()
    rows = ke.make_rows(ke.load_chunks(name, None), an)
    sections: dict[str, list[dict]] = {}
    for r in rows:
        sections.setdefault(r["meta"].get("node_id"), []).append(r)
    tokens = {n: sum((r["stems"]["content"] for r in sorted(rs, key=lambda r: r["meta"].get("chunk_sequence_id", 0))),
                     []) + rs[0]["stems"]["title"] * 2 + rs[0]["stems"]["keywords"] * 3 for n, rs in sections.items()}
    pieces, whole = bm25s.BM25(), bm25s.BM25()
    pieces.index([ke.rep_tokens(r) for r in rows], show_progress=False)
    whole.index(list(tokens.values()), show_progress=False)
    return an, (pieces, {r["id"]: i for i, r in enumerate(rows)}), (whole, {n: i for i, n in enumerate(tokens)})


def _bm25_of(index, terms: list[str], keys: list[str]):
    import numpy as np

    ix, pos = index
    known = [t for t in terms if t in ix.vocab_dict]
    scores = ix.get_scores(known) if known else np.zeros(len(pos))
    return np.array([scores[pos[k]] for k in keys])


def _best_per(groups: list[str], x):
    import numpy as np

    best: dict[str, float] = {}
    for g, v in zip(groups, x):
        best[g] = max(best.get(g, -1e9), v)
    return np.array([best[g] for g in groups])


def sections(name: str, splits: list[str], cache: Path | None) -> dict[str, dict[str, float]]:
    """nDCG@10 per pool: keyword and w = 0.5 hybrid with BM25 per piece and per whole section."""
    import numpy as np

    from keyword_engines import judged_queries
    from research_agent.search.retrieve import fusion_scores

    an, pieces, whole = _bm25_indexes(name, cache)
    out = {}
    for split in splits:
        queries, _ = judged_queries(name, split=split)
        sums: dict[str, float] = {}
        recs = load(name, split)
        for r in recs:
            docs, d, _ = pool_arrays(r)
            terms = an.stems(queries[r["qid"]])
            kp = _bm25_of(pieces, terms, [c[4] for c in r["cands"]])
            ks = _bm25_of(whole, terms, [c[3] for c in r["cands"]]) + 1e-6 * kp
            ds = _best_per([c[3] for c in r["cands"]], d) + 1e-6 * d
            for rule, score in (("keyword_pieces", kp), ("keyword_sections", ks),
                                ("hybrid0.5_pieces", 0.5 * _mm(d) + 0.5 * _mm(kp)),
                                ("hybrid0.5_sections", 0.5 * _mm(ds) + 0.5 * _mm(ks)),
                                ("adaptive_pieces", np.asarray(fusion_scores(list(d), list(kp)))),
                                ("adaptive_sections", np.asarray(fusion_scores(list(ds), list(ks))))):
                sums[rule] = sums.get(rule, 0.0) + ndcg10(rank_by(r, lambda *_: score), r["qrels"])
        out[f"{name}-{split}"] = {k: v / len(recs) for k, v in sums.items()}
        print(f"{name}-{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in out[f"{name}-{split}"].items()), flush=True)
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
                (("semantic", "semantic"), ("keyword", "keyword"), ("hybrid", "shipped"))}}
               for n, recs in ((n, load(n, "test")) for n in ("scifact", "nfcorpus", "cosqa"))]
        for r in res:
            print(r["set"], r["queries"], {m: round(v["ndcg"], 4) for m, v in r["modes"].items()})
        chart(res, ROOT / "benchmarks" / "beir_sets.png")
    elif sys.argv[1] == "fit":
        fit_weight()
    elif sys.argv[1] == "ceiling":
        ceiling(sys.argv[2:] or [*(p for g in FIT_POOLS for p in g), *TEST_POOLS])
    elif sys.argv[1] == "sections":
        args = sys.argv[2:]
        cache = Path(args[args.index("--cache") + 1]) if "--cache" in args else None
        args = [a for i, a in enumerate(args) if a != "--cache" and (i == 0 or args[i - 1] != "--cache")]
        sections(args[0], args[1:], cache)
    elif sys.argv[1] == "compare":
        compare(sys.argv[2:] or sorted(p.stem for p in POOLS.glob("*.jsonl")))
