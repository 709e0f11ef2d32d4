"""Fit the relevance calibration (research_agent/search/calibration.json) and report how well it is calibrated.

Usage: .venv/bin/python benchmarks/calibrate.py [--fit] [--chart benchmarks/reliability.png] [--order]

Needs the candidate pools of benchmarks/fusion_study.py (`dump scifact train`, `dump nfcorpus train`,
`dump nfcorpus dev`, `dump cosqa dev`, and the test pools `dump scifact test`, `dump nfcorpus test`,
`dump cosqa test`) and benchmarks/docsqa.py's (`--dump`: docsqa-dev is fitted in the hybrid model only,
STACK_ONLY_SETS; docsqa-test reported; why: benchmarks/README.md, "Docs-QA and the hybrid display"). With
--fit, a logistic regression per query mode is fitted on the train/dev pools
(FIT_POOLS; each collection weighted equally; target: the hit's document is judged relevant) and written to
research_agent/search/calibration.json; the test splits are never fitted on. Every run reports the expected
calibration error (10 equal-width bins) of the top-10 hits per query, with the per-document cap of 3 a query
applies by default, on each test pool, per mode, and how low judged-relevant hits score. --order compares
nDCG@10 of the returned (fused) order with sorting the hits by their calibrated probability.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fusion_study import load as load_pool, pool_arrays  # noqa: E402
from research_agent.search import calibration  # noqa: E402

MODES = ("semantic", "keyword", "hybrid")
#: Chosen on the dev pools among variants that pass the right-answer / off-topic tests of
#: tests/test_calibration.py (benchmarks/README.md has the table). The query's length separates topical queries
#: with many relevant documents (NFCorpus, 2-3 words) from specific ones (SciFact claims, 12); BM25's absolute
#: scale depends on corpus size, so a length feature on the keyword side marks a right answer in a small
#: corpus "Not Relevant" (0.02): not used there. Hybrid stacks the two (calibration.probability).
MODEL_FEATURES = {"semantic": ["cosine", "log_rank", "log_terms"],
                  "keyword": ["bm25", "log_rank", "top_bm25", "coverage"],
                  "hybrid": ["logit_semantic", "logit_keyword", "no_term"]}
STACKS = {"hybrid": ["semantic", "keyword"]}
#: Sets fitted only in the stacked (hybrid) model. docs-QA in the semantic fit halved the cosine's weight
#: (6.3 -> 3.5): an off-topic licence page then scored 0.31 for "how do we deploy?" in a four-file knowledge
#: base (tests/test_calibration.py): the single modes keep the BEIR-style fit.
STACK_ONLY_SETS = frozenset(__import__("os").environ.get("CALIBRATION_STACK_ONLY", "docsqa").split(","))
FIT_POOLS = tuple(__import__("os").environ.get(
    "CALIBRATION_FIT_POOLS", "scifact-train,nfcorpus-train,nfcorpus-dev,cosqa-dev,docsqa-dev").split(","))
TEST_POOLS = ("scifact-test", "nfcorpus-test", "cosqa-test", "docsqa-dev", "docsqa-test")
TOP_K, CAP = 10, 3
#: query_knowledge scores the first retrieval_candidates (50) fused hits, whatever top_k is.
WINDOW = 50
#: Relative weight of each collection's rows in the fit (each collection sums to its weight).
SET_WEIGHT = {"nfcorpus": float(__import__("os").environ.get("CALIBRATION_NF_WEIGHT", "2.5"))}
#: Judgment grade that counts as relevant (CALIBRATION_MIN_GRADE): 1, "judged relevant". Fitted on NFCorpus
#: alone (38 judged documents per query) this over-predicted on SciFact (one per query): ECE 0.21-0.25; a fit
#: on NFCorpus grade 2 only scored a right answer 0.007, "Not Relevant": rejected. Fitting on all three
#: collections, the query's length a semantic feature, brings SciFact and NFCorpus to 0.03-0.11 (README).
FIT_MIN_GRADE = int(__import__("os").environ.get("CALIBRATION_MIN_GRADE", "1"))


def load(name: str, split: str) -> list[dict]:
    """A candidate pool with each record's query text (the calibration reads the query's length)."""
    from beir_sets import split_files
    from research_agent.search.evaluation import read_queries

    if name == "docsqa":  # benchmarks/docsqa.py --dump keeps the question in each record
        return [dict(r, set=name) for r in load_pool(name, split)]
    queries = read_queries(split_files(name, split, ROOT.parent / "shared" / "data")[0])
    return [dict(r, query=queries.get(r["qid"], ""), set=name) for r in load_pool(name, split)]


@lru_cache(maxsize=None)
def corpus_texts(name: str) -> dict[str, str]:
    """Document id -> title and text, for the query-coverage feature (pools keep only ids and scores).

    Coverage is computed on the whole document, a chunk-level feature approximated at document level
    (BEIR documents are mostly one or two chunks)."""
    if name == "docsqa":  # sections, not documents: their text as benchmarks/docsqa.py --dump joined it
        return json.loads((ROOT / "benchmarks" / ".cache" / "pools" / "docsqa-texts.json").read_text())
    out = {}
    with (ROOT.parent / "shared" / "data" / name / "corpus.jsonl").open() as fh:
        for line in fh:
            d = json.loads(line)
            out[str(d["_id"])] = f"{d.get('title', '')}\n{d.get('text', '')}"
    return out


def fused_order(rec: dict, mode: str, top_k: int = None):
    """(docs, dense, keyword, fused) of the first `top_k` (default TOP_K) fused hits, cap per document."""
    from research_agent.search.retrieve import fusion_scores

    docs, d, k = pool_arrays(rec)
    f = d if mode == "semantic" else k if mode == "keyword" else np.asarray(fusion_scores(list(d), list(k)))
    order = np.argsort(-f, kind="stable")
    seen: dict[str, int] = {}
    keep = []
    for i in order:
        if seen.get(docs[i], 0) < CAP:
            seen[docs[i]] = seen.get(docs[i], 0) + 1
            keep.append(i)
        if len(keep) == (top_k or TOP_K):
            break
    dense = None if mode == "keyword" else d
    kw = None if mode == "semantic" else k
    return ([docs[i] for i in keep], [dense[i] if dense is not None else None for i in keep],
            [kw[i] if kw is not None else None for i in keep], [float(f[i]) for i in keep])


def rows(recs: list[dict], mode: str, min_grade: int = 1, models: dict | None = None):
    """Feature rows and targets of a mode's top hits; a stacked mode also gets its inputs' logits."""
    X, y = [], []
    for r in recs:
        docs, dense, kw, fused = fused_order(r, mode)
        texts = [corpus_texts(r["set"]).get(doc) for doc in docs]
        for doc, feats in zip(docs, calibration.hit_features(dense, kw, fused, r["query"], texts)):
            for m in STACKS.get(mode, ()):
                p = min(1 - 1e-9, max(1e-9, calibration.probability(m, feats, {"models": models})))
                feats[f"logit_{m}"] = float(np.log(p / (1 - p)))
            X.append(feats)
            y.append(1 if r["qrels"].get(doc, 0) >= min_grade else 0)
    return X, np.array(y)


def fit(pools: dict[str, list[dict]]) -> dict:
    """One logistic per mode over every fit pool, stacked modes last; collection weights SET_WEIGHT."""
    from sklearn.linear_model import LogisticRegression

    sets = {}
    for pool, recs in pools.items():
        sets.setdefault(pool.split("-")[0], []).extend(recs)
    models: dict = {}
    for mode in sorted(MODEL_FEATURES, key=lambda m: m in STACKS):
        feats = MODEL_FEATURES[mode]
        A, y, sw = [], [], []
        for name, recs in sets.items():
            if name in STACK_ONLY_SETS and mode not in STACKS:
                continue
            X, ys = rows(recs, mode, FIT_MIN_GRADE, models)
            A += [[x[f] for f in feats] for x in X]
            y.append(ys)
            sw.append(np.full(len(ys), SET_WEIGHT.get(name, 1.0) / len(ys)))
        A, y, sw = np.array(A), np.concatenate(y), np.concatenate(sw) * len(A) / len(sets)
        lr = LogisticRegression(C=10.0, max_iter=2000).fit(A, y, sample_weight=sw)
        models[mode] = {"features": feats, "coef": [round(float(v), 5) for v in lr.coef_[0]],
                        "intercept": round(float(lr.intercept_[0]), 5), "rows": int(len(y)),
                        "base_rate": round(float(y.mean()), 4), **({"stacks": STACKS[mode]} if mode in STACKS else {})}
    return models


def shown(rec: dict, mode: str, params: dict) -> tuple[list[str], list[float]]:
    """The top-10 documents and scores as query_knowledge shows them: scored over a WINDOW of fused hits that
    does not depend on top_k, sorted by probability in SORTED_MODES, pooled (descending) in hybrid."""
    docs, dense, kw, fused = fused_order(rec, mode, WINDOW)
    texts = [corpus_texts(rec["set"]).get(doc) for doc in docs]
    own = calibration.probabilities(mode, dense, kw, fused, params, query=rec["query"], texts=texts)
    if mode in calibration.SORTED_MODES:
        order = sorted(range(len(docs)), key=lambda i: -own[i])[:TOP_K]
        return [docs[i] for i in order], [own[i] for i in order]
    return docs[:TOP_K], calibration.descending(own)[:TOP_K]


def predictions(recs: list[dict], mode: str, params: dict, min_grade: int = 1) -> tuple[np.ndarray, np.ndarray]:
    ps, ys = [], []
    for r in recs:
        docs, scores = shown(r, mode, params)
        ps += scores
        ys += [1 if r["qrels"].get(doc, 0) >= min_grade else 0 for doc in docs]
    return np.array(ps), np.array(ys)


def order_study(params: dict) -> None:
    """nDCG@10 of the fused top 10 against what query_knowledge returns (sorted by probability over the
    scoring window in SORTED_MODES), per mode, on the dev and test pools."""
    from fusion_study import ndcg10

    print("| set | " + " | ".join(f"{m} fused / shown" for m in MODES) + " |")
    for name in ("nfcorpus-dev", "cosqa-dev", *TEST_POOLS):
        recs, cells = load(*name.split("-")), []
        for m in MODES:
            fused = by_p = 0.0
            for r in recs:
                fused += ndcg10(fused_order(r, m)[0], r["qrels"])
                by_p += ndcg10(shown(r, m, params)[0], r["qrels"])
            cells.append(f"{fused / len(recs):.4f} / {by_p / len(recs):.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == b].mean() - y[idx == b].mean()) * (idx == b).sum()
                     for b in range(bins) if (idx == b).any()) / len(p))


def reliability(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.8), squeeze=False)
    for ax, (name, per_mode) in zip(axes[0], curves.items()):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for mode, (p, y) in per_mode.items():
            idx = np.minimum((p * 10).astype(int), 9)
            xs = [p[idx == b].mean() for b in range(10) if (idx == b).sum() >= 5]
            ys = [y[idx == b].mean() for b in range(10) if (idx == b).sum() >= 5]
            ax.plot(xs, ys, marker="o", ms=3, label=f"{mode} (ECE {ece(p, y):.3f})")
        ax.set_title(name)
        ax.set_xlabel("relevance_score (predicted)")
        ax.set_ylabel("fraction judged relevant")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "Calibration of relevance_score on test splits, top-10 hits; fitted on SciFact train, NFCorpus train+dev, "
        "CoSQA dev, docs-QA dev (hybrid)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--chart", default=None)
    ap.add_argument("--order", action="store_true", help="nDCG@10 of the fused order vs sorting by probability")
    args = ap.parse_args()
    target = ROOT / "research_agent" / "search" / "calibration.json"
    if args.fit:
        train = {p: load(*p.split("-")) for p in FIT_POOLS}
        params = {
            "about": "Logistic calibration of relevance_score per query mode; fitted by benchmarks/calibrate.py "
            "on SciFact train (BEIR rules, CC BY-NC 2.0), NFCorpus train+dev (BEIR, CC BY-SA 4.0), "
            "CoSQA dev (CoCLR, C-UDA) and docs-QA dev (benchmarks/docsqa.py) judgments, collection weights "
            + json.dumps(SET_WEIGHT)
            + " (others 1); top-10 hits, "
            "per-document cap 3, target: the hit's document is judged with grade >= "
            f"{FIT_MIN_GRADE}. Never fitted on a test split.",
            "fitted_on": {p: len(recs) for p, recs in train.items()},
            "models": fit(train),
        }
        target.write_text(json.dumps(params, indent=1) + "\n")
        calibration.parameters.cache_clear()
    params = json.loads(target.read_text())
    curves = {}
    print("| set | " + " | ".join(f"{m} ECE" for m in MODES) + " |")
    for name in TEST_POOLS:
        try:
            recs = load(*name.split("-"))
        except FileNotFoundError:
            continue
        curves[name] = {m: predictions(recs, m, params) for m in MODES}
        print(f"| {name} | " + " | ".join(f"{ece(*curves[name][m]):.3f}" for m in MODES) + " |")
        for m in MODES:  # the rejected failure mode: right answers scored "Not Relevant"
            p, y = curves[name][m]
            print(f"|   {m}: judged-relevant hits: median score {np.median(p[y == 1]):.2f}, "
                  f"{(p[y == 1] < 0.2).mean():.0%} below 0.2 (\"Not Relevant\") |")
        if name.startswith("nfcorpus"):
            strict = {m: predictions(recs, m, params, 2) for m in MODES}
            print(f"| {name} (grade 2) | " + " | ".join(f"{ece(*strict[m]):.3f}" for m in MODES) + " |")
    if args.chart and curves:
        reliability(curves, Path(args.chart))
    if args.order:
        order_study(params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
