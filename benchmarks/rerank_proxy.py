"""Does the reranker lose quality reading a query-centred window, or running in bfloat16? A proxy study on SciFact.

No pretrained cross-encoder loads offline, so the proxy reranker is the packaged bi-encoder all-MiniLM-L6-v2
(the MiniLM-L6 backbone of the default cross-encoder): score = cosine(query, passage). For every SciFact test
query the hybrid top 20 (query_knowledge, rerank=False, default settings) are reordered by the proxy score
computed on `rerank_passage(text, query, window)` for windows 0 (whole chunk), 64, 96, 128, 192, each in float32
and under bfloat16 autocast; document-level nDCG@10 as research_agent.search.evaluation computes it, with paired
bootstrap intervals, float32/bfloat16 rank agreement and how many candidates each window cuts.

Usage: .venv/bin/python benchmarks/rerank_proxy.py     (needs the store benchmarks/scifact.py builds; ~25 min)
It works on a copy of that store (queries record history) under benchmarks/.cache/rerank-proxy/.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from research_agent.container import build_container  # noqa: E402
from research_agent.ingest.chunking import estimate_tokens  # noqa: E402
from research_agent.search.evaluation import ndcg_at_k, read_qrels, read_queries  # noqa: E402
from research_agent.search.service import query_knowledge, rerank_passage  # noqa: E402

OUT = ROOT / "benchmarks" / ".cache" / "rerank-proxy"
STORE = OUT / "store"
DATA = ROOT.parent / "shared" / "data" / "scifact"
COLLECTION = "scifact"
TOP_N, K = 20, 10
WINDOWS = [0, 64, 96, 128, 192]  # 0 = whole chunk
PRECISIONS = ["float32", "bfloat16"]
CAND_FILE = OUT / "candidates.json"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load_candidates(c):
    if CAND_FILE.exists():
        return json.loads(CAND_FILE.read_text())
    queries = read_queries(DATA / "queries.jsonl")
    qrels = read_qrels(DATA / "qrels" / "test.tsv")
    todo = [q for q in qrels if any(g > 0 for g in qrels[q].values()) and q in queries]
    out = []
    for i, qid in enumerate(todo, 1):
        text = queries[qid][: c.settings.max_query_chars]
        res = query_knowledge(c, text, collections=[COLLECTION], top_k=TOP_N, mode="hybrid", rerank=False)
        assert not res.reranked
        out.append({"qid": qid, "query": text,
                    "cands": [{"id": h.metadata["chunk_id"], "doc": h.source_document, "text": h.content,
                               "fused": h.metadata["retrieval"].get("fused")} for h in res.results]})
        if i % 50 == 0:
            log(f"candidates {i}/{len(todo)}")
    CAND_FILE.write_text(json.dumps(out))
    return out


def embed(c, texts, precision, cache):
    """Unit vectors for texts (cached per precision); bfloat16 = torch.autocast('cpu', bfloat16)."""
    todo = list(dict.fromkeys(t for t in texts if (precision, t) not in cache))
    if todo:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            vecs = c.embedder.embed_documents(todo)
        for t, v in zip(todo, vecs):
            v = np.asarray(v, dtype=np.float64)
            cache[(precision, t)] = v / max(np.linalg.norm(v), 1e-12)
    return [cache[(precision, t)] for t in texts]


def doc_ndcg(cands, order, judged):
    ranked = list(dict.fromkeys(cands[i]["doc"] for i in order))
    return ndcg_at_k(ranked, judged, K)


def boot_ci(deltas, n=2000, seed=0):
    rng = random.Random(seed)
    m = len(deltas)
    means = sorted(statistics.fmean(rng.choices(deltas, k=m)) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def main():
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help; no options
    torch.manual_seed(0)
    if not STORE.is_dir():
        source = ROOT / "benchmarks" / ".cache" / "scifact" / "all-MiniLM-L6-v2"
        if not source.is_dir():
            raise SystemExit(f"no SciFact store at {source}: run benchmarks/scifact.py first")
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, STORE)
    c = build_container(store=str(STORE))
    assert Path(c.settings.store).resolve() == STORE.resolve(), c.settings.store
    log(
        f"store {c.settings.store}; embedding {c.settings.embedding_model}; cap {c.settings.per_document_cap}; "
        f"fusion {c.settings.fusion_method} w={c.settings.hybrid_dense_weight}; torch threads {torch.get_num_threads()}"
    )
    t0 = time.perf_counter()
    data = load_candidates(c)
    log(f"{len(data)} queries, candidates in {time.perf_counter() - t0:.0f} s")
    qrels = read_qrels(DATA / "qrels" / "test.tsv")
    tok = c.embedder.model.tokenizer
    max_seq = c.embedder.model.max_seq_length

    cache: dict = {}
    per_q: dict = {}  # (window, precision) -> list of (scores array) per query
    for w in WINDOWS:
        passages = [[rerank_passage(x["text"], d["query"], w) for x in d["cands"]] for d in data]
        for p in PRECISIONS:
            t = time.perf_counter()
            qv = embed(c, [d["query"] for d in data], p, cache)
            flat = [s for ps in passages for s in ps]
            pv = embed(c, flat, p, cache)
            scores, j = [], 0
            for qi, ps in enumerate(passages):
                P = np.stack(pv[j:j + len(ps)])
                j += len(ps)
                scores.append(P @ qv[qi])
            per_q[(w, p)] = scores
            log(f"window {w or 'whole'} {p}: {time.perf_counter() - t:.0f} s")

    # -- results
    base = [doc_ndcg(d["cands"], range(len(d["cands"])), qrels[d["qid"]]) for d in data]
    res = {"queries": len(data), "baseline_hybrid_top20": statistics.fmean(base), "configs": {}}
    ref = None
    for w in WINDOWS:
        for p in PRECISIONS:
            nd = []
            for d, s in zip(data, per_q[(w, p)]):
                order = sorted(range(len(s)), key=lambda i: (-s[i], i))  # stable: ties keep retrieval order
                nd.append(doc_ndcg(d["cands"], order, qrels[d["qid"]]))
            if ref is None:
                ref = nd
            res["configs"][f"{w or 'whole'}/{p}"] = {"ndcg": nd}
    lines = [f"SciFact test, {len(data)} queries; hybrid top-{TOP_N} (cap {c.settings.per_document_cap}) reordered "
             f"by proxy cosine; doc-level nDCG@{K}",
             f"baseline (hybrid order): {statistics.fmean(base):.4f}", "",
             "| window | nDCG fp32 | nDCG bf16 | Δ bf16−fp32 [95% CI] | Δ fp32 vs whole/fp32 [95% CI] | "
             "Spearman fp32~bf16 mean (min) | top-10 doc list identical fp32/bf16 | max |Δscore| | "
             "cands cut (per query, frac) |",
             "|---|---|---|---|---|---|---|---|---|"]
    n_cands = sum(len(d["cands"]) for d in data)
    for w in WINDOWS:
        f32, b16 = res["configs"][f"{w or 'whole'}/float32"]["ndcg"], res["configs"][f"{w or 'whole'}/bfloat16"]["ndcg"]
        dp = [b - a for a, b in zip(f32, b16)]
        dw = [a - r for a, r in zip(f32, ref)]
        rhos, same, maxdiff = [], 0, 0.0
        for d, sa, sb in zip(data, per_q[(w, "float32")], per_q[(w, "bfloat16")]):
            rho = spearmanr(sa, sb).statistic
            rhos.append(1.0 if np.isnan(rho) else float(rho))
            oa = list(dict.fromkeys(d["cands"][i]["doc"] for i in sorted(range(len(sa)), key=lambda i: (-sa[i], i))))[
                :K
            ]
            ob = list(dict.fromkeys(d["cands"][i]["doc"] for i in sorted(range(len(sb)), key=lambda i: (-sb[i], i))))[
                :K
            ]
            same += oa == ob
            maxdiff = max(maxdiff, float(np.max(np.abs(sa - sb))))
        cut = sum(estimate_tokens(x["text"]) > w for d in data for x in d["cands"]) if w else 0
        lo, hi = boot_ci(dp)
        lo2, hi2 = boot_ci(dw)
        cfg = res["configs"]
        cfg[f"{w or 'whole'}/float32"].update(mean=statistics.fmean(f32))
        cfg[f"{w or 'whole'}/bfloat16"].update(mean=statistics.fmean(b16))
        cfg[f"{w or 'whole'}/float32"].update(spearman_mean=statistics.fmean(rhos), spearman_min=min(rhos),
                                               top10_identical=same, max_abs_score_diff=maxdiff,
                                               cut=cut, cut_frac=cut / n_cands)
        lines.append(f"| {w or 'whole'} | {statistics.fmean(f32):.4f} | {statistics.fmean(b16):.4f} | "
                     f"{statistics.fmean(dp):+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                     f"{statistics.fmean(dw):+.4f} [{lo2:+.4f}, {hi2:+.4f}] | "
                     f"{statistics.fmean(rhos):.4f} ({min(rhos):.3f}) | {same}/{len(data)} | {maxdiff:.4f} | "
                     f"{cut / len(data):.2f}/{TOP_N} ({cut / n_cands:.1%}) |")
    # Length context: estimated tokens and model word pieces of the whole candidates.
    est = [estimate_tokens(x["text"]) for d in data for x in d["cands"]]
    wp = [len(tok(x["text"], add_special_tokens=True)["input_ids"]) for d in data for x in d["cands"]]
    docs_per_q = [len({x["doc"] for x in d["cands"]}) for d in data]
    lines += ["",
              f"candidate lengths (estimate_tokens): median {statistics.median(est):.0f}, p90 "
              f"{np.percentile(est, 90):.0f}, max {max(est)}; word pieces median {statistics.median(wp):.0f}, "
              f"{sum(x > max_seq for x in wp) / len(wp):.1%} exceed the bi-encoder's max_seq_length {max_seq} "
              f"(silently truncated in 'whole')",
              f"distinct documents among the 20 candidates per query: mean {statistics.fmean(docs_per_q):.1f}, "
              f"min {min(docs_per_q)}"]
    for w in WINDOWS[1:]:
        wps = [len(tok(rerank_passage(x["text"], d["query"], w))["input_ids"]) for d in data for x in d["cands"]
               if estimate_tokens(x["text"]) > w]
        if wps:
            lines.append(f"window {w}: cut passages have median {statistics.median(wps):.0f} word pieces "
                         f"(max {max(wps)})")
    text = "\n".join(lines)
    print(text)
    (OUT / "results.md").write_text(text + "\n")
    (OUT / "results.json").write_text(json.dumps(res, indent=1))
    log(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
