"""Retrieval: the candidates of a query from the dense and keyword sides, and their fusion.

Each side returns up to `n` chunks per collection, only chunks of a document's current version. Hybrid
fuses them: convex (min-max per query, a per-query dense weight fitted in issue 12) or weighted RRF.
Convex fusion first completes every candidate's scores (BM25 of dense-only chunks, cosine of keyword-only
ones), so no candidate is scored by one side alone.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from research_agent.catalog.collections import open_collection
from research_agent.errors import QueryError
from research_agent.search import calibration
from research_agent.search.filters import chroma_where, metadata_predicate, validate_filters
from research_agent.search.keyword_index import KeywordIndex
from research_agent.search.keyword_sync import keyword_index

if TYPE_CHECKING:
    from research_agent.container import Container

FUSION_METHODS = ("convex", "rrf")


@dataclass
class Candidate:
    id: str
    text: str
    metadata: dict[str, Any]
    dense: float | None = None     # cosine similarity
    keyword: float | None = None   # BM25 score
    fused: float = 0.0
    rerank: float | None = None
    ranks: dict[str, int] = field(default_factory=dict)


def _active(c: Container, collection: str, metas: list[dict[str, Any]]) -> list[bool]:
    from research_agent.storage.chunks import is_visible
    from research_agent.storage.registry import document_key

    keys = list({document_key(collection, m.get("source_document", "")) for m in metas})
    current = {m["document"]: m["content_hash"] for m in c.store.registry_get(keys).values()}
    return [is_visible(m, current) for m in metas]


def _dense(c: Container, collection: str, col: Any, qvec: list[float], n: int,
           where: dict[str, Any] | None) -> list[Candidate]:
    count = col.count()
    if not count:
        return []
    res = col.query(query_embeddings=[qvec], n_results=min(n, count), where=where,
                    include=["documents", "metadatas", "distances"])
    ids, docs, metas, dists = res["ids"][0], res["documents"][0], res["metadatas"][0], res["distances"][0]
    keep = _active(c, collection, metas)
    return [Candidate(i, d, m, dense=1.0 - dist) for i, d, m, dist, ok in zip(ids, docs, metas, dists, keep) if ok]


def _dense_scores(col: Any, qvec: list[float], ids: list[str]) -> dict[str, float]:
    """Cosine similarity of the query to chunks the dense search did not return (stored vectors are unit length)."""
    if not ids:
        return {}
    import numpy as np

    got = col.get(ids=ids, include=["embeddings"])
    if not len(got["ids"]):
        return {}
    vecs = np.asarray(got["embeddings"], dtype="float32")
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True).clip(min=1e-12)
    sims = vecs @ np.asarray(qvec, dtype="float32")
    return {cid: float(s) for cid, s in zip(got["ids"], sims)}


def fuse_rrf(dense: list[Candidate], keyword: list[Candidate], dense_weight: float, k: int) -> list[Candidate]:
    """Weighted reciprocal rank fusion: score = w / (k + dense rank) + (1 - w) / (k + keyword rank)."""
    merged: dict[str, Candidate] = {}
    for name, cands, weight in (("dense", dense, dense_weight), ("keyword", keyword, 1.0 - dense_weight)):
        for rank, cand in enumerate(cands, start=1):
            cur = merged.setdefault(cand.id, cand)
            if cur is not cand:
                cur.dense = cur.dense if cur.dense is not None else cand.dense
                cur.keyword = cur.keyword if cur.keyword is not None else cand.keyword
            cur.ranks[name] = rank
            cur.fused += weight / (k + rank)
    return sorted(merged.values(), key=lambda x: x.fused, reverse=True)


def _min_max(values: list[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if hi > lo:
        return [(v - lo) / (hi - lo) for v in values]
    return [1.0 if hi > 0 else 0.0 for _ in values]


#: Per-query dense weight of convex fusion: sigmoid(logit(hybrid_dense_weight) + intercept + sum(coef * feature))
#: over three pool features (the best cosine, the cosines' standard deviation, the squashed best BM25 score).
#: Why: one constant weight cannot serve both kinds of corpus (issue 12): w = 0.5 suits SciFact (BM25 strong)
#: but puts CoSQA code search at 0.506 nDCG@10 against dense 0.589 (dev). Dense deserves more weight when its
#: best match is close and stands out of a spread list, keyword more when its top score is strong. Fitted by
#: benchmarks/fusion_study.py `fit` on train/dev pools only (SciFact train 809 q, NFCorpus train+dev 1,024 q,
#: CoSQA dev 500 q): a logistic "dense beats BM25 on this query" on the three features, then its scale and
#: offset by grid search for the best mean nDCG@10 that clears the better single mode by 0.003 on every set.
#: Dev nDCG@10 (hybrid / best single mode / w = 0.5): SciFact train 0.733 / 0.698 / 0.734, NFCorpus train+dev
#: 0.357 / 0.329 / 0.357, CoSQA dev 0.590 / 0.589 / 0.506. Median weights: SciFact 0.57, NFCorpus 0.76, CoSQA 0.98.
ADAPTIVE_WEIGHT_INTERCEPT = -3.568
ADAPTIVE_WEIGHT_COEF = {"top_cosine": 10.094, "cosine_sd": 41.555, "top_bm25": -8.883}


def adaptive_dense_weight(dense: list[float], keyword: list[float], base: float = 0.5) -> float:
    """The dense weight for one query's pool (see ADAPTIVE_WEIGHT_COEF); `base` 0 or 1 stays pure keyword/dense.

    `base` (the hybrid_dense_weight setting) is the prior on the logit scale: 0.5 adds nothing. A pool with
    no BM25 evidence at all (no query term in any chunk) leans on dense (and ranks like it: BM25 is flat).
    """
    if base <= 0.0 or base >= 1.0 or not dense:
        return min(1.0, max(0.0, base))
    mean = sum(dense) / len(dense)
    feats = {"top_cosine": max(dense), "cosine_sd": math.sqrt(sum((d - mean) ** 2 for d in dense) / len(dense)),
             "top_bm25": calibration.bm25_squash(max(keyword, default=0.0))}
    z = math.log(base / (1.0 - base)) + ADAPTIVE_WEIGHT_INTERCEPT + sum(
        c * feats[name] for name, c in ADAPTIVE_WEIGHT_COEF.items())
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def fusion_scores(dense: list[float], keyword: list[float], dense_weight: float | None = None,
                  adaptive: bool = True) -> list[float]:
    """Fused scores of a candidate pool from its cosines and BM25 scores (same order, every candidate both).

    Min-max normalised per query over the pool (cosine and BM25 live on different scales, and BM25's scale
    changes with the query's length and term rarity), then a convex combination with the dense weight:
    `adaptive_dense_weight` of the pool around `dense_weight` (default 0.5), or `dense_weight` itself when
    `adaptive` is False.
    """
    if not dense:
        return []
    w = 0.5 if dense_weight is None else dense_weight
    if adaptive:
        w = adaptive_dense_weight(dense, keyword, w)
    return [w * d + (1.0 - w) * k for d, k in zip(_min_max(dense), _min_max(keyword))]


def fuse_convex(cands: list[Candidate], dense_weight: float | None, adaptive: bool = True) -> list[Candidate]:
    """Candidates sorted by `fusion_scores` (every candidate has both scores)."""
    fused = fusion_scores([x.dense or 0.0 for x in cands], [x.keyword or 0.0 for x in cands], dense_weight,
                          adaptive)
    for x, f in zip(cands, fused):
        x.fused = f
    return sorted(cands, key=lambda x: x.fused, reverse=True)


def _query_vector(c: Container, query: str, document_context: str | None, weight: float) -> list[float]:
    qvec = c.embedder.embed_query(query)
    if document_context and document_context.strip() and weight > 0:
        ctx = c.embedder.embed_query(document_context[: c.settings.max_query_chars * 4])
        mixed = [q + weight * x for q, x in zip(qvec, ctx)]
        norm = math.sqrt(sum(v * v for v in mixed)) or 1.0
        qvec = [v / norm for v in mixed]
    return qvec


def retrieve_candidates(c: Container, query: str, names: list[str], *, mode: str = "hybrid", n: int = 60,
                        document_context: str | None = None, timings: dict[str, float] | None = None,
                        filters: dict[str, Any] | None = None, fusion: str | None = None,
                        dense_weight: float | None = None, context_weight: float | None = None) -> list[Candidate]:
    """Candidates from the collections `names`, best first, before capping and reranking.

    Each retriever returns up to `n` chunks per collection; `filters` (see FILTER_FIELDS) restrict both.
    """
    s = c.settings
    timings = timings if timings is not None else {}
    flt = validate_filters(filters)
    if "collection" in flt:
        names = [nm for nm in names if nm in set(map(str, flt["collection"]))]
    where, accept = chroma_where(flt), metadata_predicate(flt)
    fusion = fusion or s.fusion_method
    if fusion not in FUSION_METHODS:
        raise QueryError(f"Unknown fusion method {fusion!r}", guidance=f"Use one of: {', '.join(FUSION_METHODS)}.")
    w = s.hybrid_dense_weight if dense_weight is None else dense_weight
    cols = {name: open_collection(c, name) for name in names}
    dense: list[Candidate] = []
    keyword: list[Candidate] = []
    qvec: list[float] | None = None
    rankings: dict[str, tuple[KeywordIndex, Any]] = {}
    if mode in ("semantic", "hybrid"):
        weight = s.context_weight if context_weight is None else context_weight
        qvec, dense = _dense_side(c, query, names, cols, n, where, document_context, weight, timings)
    if mode in ("keyword", "hybrid"):
        keyword, rankings = _keyword_side(c, query, names, cols, n, accept, timings)
    if mode == "semantic":
        return _ranked_alone(dense, "dense")
    if mode == "keyword":
        return _ranked_alone(keyword, "keyword")
    t = time.perf_counter()
    if fusion == "rrf":
        out = fuse_rrf(dense, keyword, w, s.rrf_k)
    else:
        out = _fuse_pool(dense, keyword, rankings, names, cols, qvec, w)
    timings["fuse"] = (time.perf_counter() - t) * 1000
    return out


def _dense_side(c: Container, query: str, names: list[str], cols: dict[str, Any], n: int, where: dict[str, Any] | None,
                document_context: str | None, context_weight: float,
                timings: dict[str, float]) -> tuple[list[float], list[Candidate]]:
    """The query vector and the dense candidates of every collection, best cosine first."""
    t = time.perf_counter()
    qvec = _query_vector(c, query, document_context, context_weight)
    timings["embed"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    dense = sorted((cand for name in names for cand in _dense(c, name, cols[name], qvec, n, where)),
                   key=lambda x: x.dense or 0.0, reverse=True)
    timings["dense"] = (time.perf_counter() - t) * 1000
    return qvec, dense


def _keyword_side(c: Container, query: str, names: list[str], cols: dict[str, Any], n: int,
                  accept: Callable[[dict[str, Any]], bool] | None,
                  timings: dict[str, float]) -> tuple[list[Candidate], dict[str, tuple[KeywordIndex, Any]]]:
    """The BM25 candidates of every collection, best first, and each collection's (index, ranking)."""
    t = time.perf_counter()
    keyword: list[Candidate] = []
    rankings: dict[str, tuple[KeywordIndex, Any]] = {}
    for name in names:
        index = keyword_index(c, name, cols[name])
        ranking = index.rank(query, accept)
        rankings[name] = (index, ranking)
        keyword += [Candidate(ch.id, ch.text, ch.metadata, keyword=sc) for ch, sc in index.top(ranking, n)]
    keyword.sort(key=lambda x: x.keyword or 0.0, reverse=True)
    timings["keyword"] = (time.perf_counter() - t) * 1000
    return keyword, rankings


def _ranked_alone(cands: list[Candidate], side: str) -> list[Candidate]:
    """One side's list as the result: its rank recorded, its own score as the fused score."""
    for rank, cand in enumerate(cands, start=1):
        cand.ranks[side], cand.fused = rank, getattr(cand, side) or 0.0
    return cands


def _fuse_pool(dense: list[Candidate], keyword: list[Candidate], rankings: dict[str, tuple[KeywordIndex, Any]],
               names: list[str], cols: dict[str, Any], qvec: list[float] | None, w: float) -> list[Candidate]:
    """Convex fusion of both lists: one pool by chunk id, every score completed, then `fuse_convex`."""
    pool: dict[str, Candidate] = {}
    for rank, cand in enumerate(dense, start=1):
        cand.ranks["dense"] = rank
        pool[cand.id] = cand
    for rank, cand in enumerate(keyword, start=1):
        cur = pool.setdefault(cand.id, cand)
        cur.keyword = cand.keyword
        cur.ranks["keyword"] = rank
    _complete_scores(pool, rankings, names, cols, qvec)
    return fuse_convex(list(pool.values()), w)


def _complete_scores(pool: dict[str, Candidate], rankings: dict[str, tuple[KeywordIndex, Any]], names: list[str],
                     cols: dict[str, Any], qvec: list[float] | None) -> None:
    """BM25 of dense-only chunks from the keyword ranking, cosine of keyword-only chunks from their stored
    vectors, so no candidate is scored by one side alone."""
    for name, (index, ranking) in rankings.items():
        missing = [x for x in pool.values() if x.keyword is None and x.metadata.get("collection", name) == name]
        scores = index.scores_of(ranking, [x.id for x in missing])
        for x in missing:
            x.keyword = scores[x.id]
    for name in names:
        need = [x.id for x in pool.values() if x.dense is None and x.metadata.get("collection", name) == name]
        for cid, sim in _dense_scores(cols[name], qvec or [], need).items():
            pool[cid].dense = sim


def cap_per_document(cands: list[Candidate], cap: int) -> list[Candidate]:
    """Keep at most `cap` chunks of one document, so one long file cannot fill every slot."""
    if cap <= 0:
        return cands
    seen: Counter[str] = Counter()
    out = []
    for cand in cands:
        doc = f"{cand.metadata.get('collection')}:{cand.metadata.get('source_document')}"
        if seen[doc] < cap:
            seen[doc] += 1
            out.append(cand)
    return out
