"""A docs-like check set: 40 questions a user asks about research-agent, judged against its own docs.

Usage: .venv/bin/python benchmarks/docsqa.py [--rerank] [--dump]

Why: every tuned figure in this repo comes from SciFact, NFCorpus and CoSQA (abstracts, health pages, code);
the quick start answers questions about a folder of Markdown docs, a corpus of about 200 chunks where BM25's
scale, the adaptive fusion weight and the calibration were never checked. The corpus is research-agent's own
`docs/` and `README.md` frozen at commit CORPUS_COMMIT (`git archive`, so the judgments stay true while the
docs change); the judgments (benchmarks/data/docsqa/judgments.jsonl, written by hand, in the words a user
would use rather than the headings') name sections as `path::last heading` (JSON and YAML files: `path::`),
graded 2 (answers it) or 1 (helps). A hit counts for its section once (the first chunk of a section).

Prints per mode nDCG@10, hit@1, hit@3, the expected calibration error of the shown relevance_score over the
top-10 hits (target: the hit's section is judged) and how judged hits score. Not used for fitting: a check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from research_agent.search.evaluation import ndcg_at_k  # noqa: E402

CORPUS_COMMIT = "a41d45a5bbdff5fe86933a1d086ff40c36aafbd4"
JUDGMENTS = ROOT / "benchmarks" / "data" / "docsqa" / "judgments.jsonl"
CACHE = ROOT / "benchmarks" / ".cache" / "docsqa"
MODES = ("semantic", "keyword", "hybrid")


def corpus() -> Path:
    """The frozen docs folder (extracted once into the cache)."""
    target = CACHE / "corpus"
    if not (target / "README.md").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", CORPUS_COMMIT, "docs", "README.md"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def container():
    from research_agent.container import build_container
    from research_agent.ingest import ingest_path

    store = CACHE / "store"
    c = build_container(store=str(store))
    from research_agent.catalog.collections import create_collection, list_collections

    if "docsqa" not in {x.name for x in list_collections(c).collections}:
        create_collection(c, "docsqa", type="fundamental")
    folder = corpus()
    for part in ("docs", "README.md"):  # unchanged files are skipped: re-runs cost nothing
        ingest_path(c, str(folder / part), "docsqa", recursive=True, allowed_roots=[folder])
    return c


def section(hit) -> str:
    meta = getattr(hit, "metadata", {})
    path = getattr(hit, "header_path", None) or meta.get("header_path") or ""
    doc = getattr(hit, "source_document", None) or meta.get("source_document", "")
    doc = doc.split("docsqa/corpus/")[-1]  # a single file's key is its path from the working directory
    return f"{doc}::{path.split(' > ')[-1] if path else ''}"


def dump(c, judged: list[dict]) -> None:
    """Candidate pools in benchmarks/fusion_study.py's format (a section is the pool's document), split by
    question number: odd questions `docsqa-dev`, even `docsqa-test`; section texts for the coverage feature."""
    from research_agent.search.retrieve import retrieve_candidates

    pools = ROOT / "benchmarks" / ".cache" / "pools"
    pools.mkdir(parents=True, exist_ok=True)
    texts: dict[str, str] = {}
    out = {"dev": [], "test": []}
    for j in judged:
        cands = retrieve_candidates(c, j["query"], ["docsqa"], mode="hybrid", n=50)
        for x in cands:
            texts.setdefault(section(x), "")
            if x.text not in texts[section(x)]:
                texts[section(x)] += "\n" + x.text
        split = "dev" if int(j["id"][1:]) % 2 else "test"
        out[split].append(json.dumps({"qid": j["id"], "query": j["query"], "qrels": j["rel"], "cands": [
            [section(x), round(x.dense or 0.0, 5), round(x.keyword or 0.0, 4)] for x in cands]}))
    for split, lines in out.items():
        (pools / f"docsqa-{split}.jsonl").write_text("\n".join(lines) + "\n")
    (pools / "docsqa-texts.json").write_text(json.dumps(texts))


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == b].mean() - y[idx == b].mean()) * (idx == b).sum()
                     for b in range(bins) if (idx == b).any()) / len(p))


def run(c, judged: list[dict], mode: str, rerank: bool) -> dict:
    from research_agent.search.service import query_knowledge

    ndcg, hit1, hit3, ps, ys = [], [], [], [], []
    for j in judged:
        res = query_knowledge(c, j["query"], collections=["docsqa"], top_k=10, mode=mode, rerank=rerank)
        keys = [section(h) for h in res.results]
        ranked = list(dict.fromkeys(keys))
        ndcg.append(ndcg_at_k(ranked[:10], j["rel"], 10))
        hit1.append(float(bool(ranked) and j["rel"].get(ranked[0], 0) > 0))
        hit3.append(float(any(j["rel"].get(k, 0) > 0 for k in ranked[:3])))
        ps += [h.relevance_score for h in res.results]
        ys += [1 if j["rel"].get(k, 0) > 0 else 0 for k in keys]
    p, y = np.array(ps), np.array(ys)
    return {"ndcg10": float(np.mean(ndcg)), "hit1": float(np.mean(hit1)), "hit3": float(np.mean(hit3)),
            "ece": ece(p, y), "judged_median": float(np.median(p[y == 1])) if (y == 1).any() else float("nan"),
            "judged_below_0.2": float((p[y == 1] < 0.2).mean()) if (y == 1).any() else float("nan"),
            "unjudged_median": float(np.median(p[y == 0])) if (y == 0).any() else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rerank", action="store_true", help="rerank too (needs the cross-encoder)")
    ap.add_argument("--dump", action="store_true", help="write candidate pools for benchmarks/calibrate.py")
    args = ap.parse_args()
    judged = [json.loads(line) for line in JUDGMENTS.read_text().splitlines() if line.strip()]
    c = container()
    if args.dump:
        dump(c, judged)
    print(f"docs-QA: {len(judged)} questions, corpus docs/ + README.md at {CORPUS_COMMIT[:7]}")
    print("| mode | nDCG@10 | hit@1 | hit@3 | ECE | judged hits: median score | judged < 0.2 | unjudged median |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        r = run(c, judged, mode, args.rerank)
        print(f"| {mode} | {r['ndcg10']:.3f} | {r['hit1']:.2f} | {r['hit3']:.2f} | {r['ece']:.3f} | "
              f"{r['judged_median']:.2f} | {r['judged_below_0.2']:.0%} | {r['unjudged_median']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
