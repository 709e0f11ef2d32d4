"""Query: dense, keyword or hybrid retrieval across collections, then cross-encoder reranking."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from research_agent.collections import open_collection
from research_agent.errors import CollectionError, QueryError

QUERY_MODES = ("hybrid", "semantic", "keyword")
RRF_K = 60
# document_context nudges the query vector towards the file being edited, never past the query.
CONTEXT_WEIGHT = 0.3


class QueryHit(BaseModel):
    content: str
    relevance_score: float
    relevance_label: str
    source_document: str
    header_path: str
    metadata: dict[str, Any]


class QueryRefinement(BaseModel):
    status: str  # optimal | clarification_needed | too_broad
    suggestions: list[str]
    message: str


class QueryResult(BaseModel):
    status: str = "success"
    query: str
    mode: str
    collections: list[str]
    reranked: bool
    warnings: list[str]
    results: list[QueryHit]
    query_refinement: QueryRefinement
    timings_ms: dict[str, float]


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


def relevance_label(score: float, settings: Any) -> str:
    if score >= settings.threshold_highly_relevant:
        return "Highly Relevant"
    if score >= settings.threshold_relevant:
        return "Relevant"
    if score >= settings.threshold_somewhat_relevant:
        return "Somewhat Relevant"
    return "Not Relevant"


def validate_query(query: Any, settings: Any) -> str:
    if not isinstance(query, str) or not query.strip():
        raise QueryError("The query is empty", guidance="Ask a question or give search terms.")
    if len(query) > settings.max_query_chars:
        raise QueryError(f"The query has {len(query)} characters; the limit is {settings.max_query_chars}",
                         guidance="Shorten the query, or pass long text as --document-context.")
    return query.strip()


def resolve_collections(c, collections: list[str] | None, project: str | None) -> list[str]:
    """Explicit collections, else the project's defaults, else every collection."""
    if collections:
        names = list(dict.fromkeys(n.strip() for n in collections if n and n.strip()))
        missing = [n for n in names if not c.store.has_collection(n)]
        if missing:
            raise CollectionError(f"Unknown collections: {', '.join(missing)}", missing=missing,
                                  guidance="Run `research-agent collections list` for the names.")
        return names
    if project:
        from research_agent.projects import require_project

        rec = require_project(c, project)
        if not rec["default_collections"]:
            raise CollectionError(f"Project {project!r} has no default collections",
                                  guidance=f"Run `research-agent projects set-defaults {project} --collections a,b`.",
                                  project=project)
        return rec["default_collections"]
    names = [col.name for col in c.store.list_collections()]
    if not names:
        raise CollectionError("There are no collections to search",
                              guidance="Create one with `research-agent collections create` and ingest documents.")
    return names


def _active(c, collection: str, metas: list[dict[str, Any]]) -> list[bool]:
    from research_agent.ingest import document_key

    keys = list({document_key(collection, m.get("source_document", "")) for m in metas})
    current = {m["document"]: m["content_hash"] for m in c.store.registry_get(keys).values()}
    return [current.get(m.get("source_document")) == m.get("content_hash") for m in metas]


def _dense(c, collection: str, col: Any, qvec: list[float], n: int) -> list[Candidate]:
    count = col.count()
    if not count:
        return []
    res = col.query(query_embeddings=[qvec], n_results=min(n, count), include=["documents", "metadatas", "distances"])
    ids, docs, metas, dists = res["ids"][0], res["documents"][0], res["metadatas"][0], res["distances"][0]
    keep = _active(c, collection, metas)
    return [Candidate(i, d, m, dense=1.0 - dist) for i, d, m, dist, ok in zip(ids, docs, metas, dists, keep) if ok]


def _keyword(c, collection: str, col: Any, query: str, n: int) -> list[Candidate]:
    from research_agent.keyword import keyword_index

    return [Candidate(ch.id, ch.text, ch.metadata, keyword=s) for ch, s in keyword_index(c, collection, col).search(query, n)]


def _fuse(lists: dict[str, list[Candidate]], weights: dict[str, float]) -> list[Candidate]:
    """Reciprocal rank fusion: score = sum over retrievers of weight / (k + rank)."""
    merged: dict[str, Candidate] = {}
    for name, cands in lists.items():
        for rank, cand in enumerate(cands, start=1):
            cur = merged.setdefault(cand.id, cand)
            if cur is not cand:
                cur.dense = cur.dense if cur.dense is not None else cand.dense
                cur.keyword = cur.keyword if cur.keyword is not None else cand.keyword
            cur.ranks[name] = rank
            cur.fused += weights.get(name, 1.0) / (RRF_K + rank)
    return sorted(merged.values(), key=lambda x: x.fused, reverse=True)


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


def _keyword_relevance(score: float) -> float:
    # BM25 scores are unbounded; squash so a few strong term matches approach 1.
    return 1.0 - math.exp(-score / 8.0)


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{2,}")
_STOP = set("the and for with that this from are was were has have not but you your can use using how what when "
            "where which who why into over under about will would should could does did its it's our their".split())


def refine(query: str, hits: list[QueryHit], settings: Any) -> QueryRefinement:
    """Advice from the score distribution; suggestions are terms taken from the top results."""
    qterms = {w.lower() for w in _WORD.findall(query)}
    counts: Counter[str] = Counter()
    for h in hits[:5]:
        for w in _WORD.findall(f"{h.metadata.get('document_title', '')} {h.header_path}"):
            if w.lower() not in qterms and w.lower() not in _STOP:
                counts[w.lower()] += 1
    suggestions = [f"{query} {w}" for w, _ in counts.most_common(3)]
    scores = [h.relevance_score for h in hits]
    if not hits or scores[0] < settings.threshold_somewhat_relevant:
        return QueryRefinement(status="clarification_needed", suggestions=suggestions,
                               message="Nothing relevant was found; rephrase with the terms the documents use, "
                               "or search other collections.")
    weak_and_flat = len(scores) >= 3 and scores[0] < settings.threshold_relevant and scores[0] - scores[2] < 0.05
    if len(qterms) <= 1 and len(query.split()) <= 1 or weak_and_flat:
        return QueryRefinement(status="too_broad", suggestions=suggestions,
                               message="Many results match about equally; add detail to narrow the query.")
    return QueryRefinement(status="optimal", suggestions=[], message="The top results match the query well.")


def retrieve_candidates(c, query: str, names: list[str], *, mode: str = "hybrid", n: int = 60,
                        document_context: str | None = None, timings: dict[str, float] | None = None) -> list[Candidate]:
    """Candidates from the collections `names`, best first, before capping and reranking."""
    s = c.settings
    timings = timings if timings is not None else {}
    cols = {name: open_collection(c, name) for name in names}
    lists: dict[str, list[Candidate]] = {}
    if mode in ("semantic", "hybrid"):
        t = time.perf_counter()
        qvec = c.embedder.embed_query(query)
        if document_context and document_context.strip():
            ctx = c.embedder.embed_query(document_context[: s.max_query_chars * 4])
            mixed = [q + CONTEXT_WEIGHT * x for q, x in zip(qvec, ctx)]
            norm = math.sqrt(sum(v * v for v in mixed)) or 1.0
            qvec = [v / norm for v in mixed]
        dense = [cand for name in names for cand in _dense(c, name, cols[name], qvec, n)]
        lists["dense"] = sorted(dense, key=lambda x: x.dense or 0.0, reverse=True)
        timings["dense"] = (time.perf_counter() - t) * 1000
    if mode in ("keyword", "hybrid"):
        t = time.perf_counter()
        kw = [cand for name in names for cand in _keyword(c, name, cols[name], query, n)]
        lists["keyword"] = sorted(kw, key=lambda x: x.keyword or 0.0, reverse=True)
        timings["keyword"] = (time.perf_counter() - t) * 1000
    return _fuse(lists, {})


def query_knowledge(c, query: str, *, collections: list[str] | None = None, project: str | None = None,
                    top_k: int = 10, document_context: str | None = None, mode: str = "hybrid",
                    rerank: bool = True) -> QueryResult:
    """Search collections and return the top_k chunks, reranked by the cross-encoder when it is available."""
    s = c.settings
    t0 = time.perf_counter()
    query = validate_query(query, s)
    mode = mode or "hybrid"
    if mode not in QUERY_MODES:
        raise QueryError(f"Unknown mode {mode!r}", guidance=f"Use one of: {', '.join(QUERY_MODES)}.")
    if not isinstance(top_k, int) or not 1 <= top_k <= s.max_top_k:
        raise QueryError(f"top_k must be between 1 and {s.max_top_k}", guidance="Pass a smaller --top-k.")
    c.store.refresh()
    names = resolve_collections(c, collections, project)
    timings: dict[str, float] = {}
    fused = retrieve_candidates(c, query, names, mode=mode, n=max(s.rerank_candidates, top_k) * 2,
                                document_context=document_context, timings=timings)
    fused = cap_per_document(fused, s.per_document_cap)
    warnings: list[str] = []
    reranked = False
    pool = fused[: max(s.rerank_candidates, top_k)] if rerank and s.rerank else fused[:top_k]
    if rerank and s.rerank and pool:
        t = time.perf_counter()
        scores = c.reranker.score(query, [cand.text for cand in pool])
        timings["rerank"] = (time.perf_counter() - t) * 1000
        if scores is None:
            warnings.append(f"Not reranked: reranker {s.reranker_model!r} is unavailable "
                            f"({c.reranker.error}). Results are in retrieval order.")
        else:
            for cand, sc in zip(pool, scores):
                cand.rerank = sc
            pool.sort(key=lambda x: x.rerank or 0.0, reverse=True)
            reranked = True
    hits = []
    for cand in pool[:top_k]:
        if cand.rerank is not None:
            score = cand.rerank
        elif cand.dense is not None:
            score = max(0.0, min(1.0, cand.dense))
        else:
            score = _keyword_relevance(cand.keyword or 0.0)
        meta = dict(cand.metadata)
        meta.update(chunk_id=cand.id, retrieval={k: v for k, v in (("dense", cand.dense), ("keyword", cand.keyword),
                                                                   ("rerank", cand.rerank)) if v is not None})
        hits.append(QueryHit(content=cand.text, relevance_score=round(score, 4),
                             relevance_label=relevance_label(score, s),
                             source_document=meta.get("source_document", ""),
                             header_path=meta.get("header_path", ""), metadata=meta))
    timings["total"] = (time.perf_counter() - t0) * 1000
    return QueryResult(query=query, mode=mode, collections=names, reranked=reranked, warnings=warnings, results=hits,
                       query_refinement=refine(query, hits, s), timings_ms={k: round(v, 1) for k, v in timings.items()})
