"""Query: dense, keyword or hybrid retrieval across collections, then cross-encoder reranking.

The service and its result models; the steps live beside it (filters.py, retrieve.py, refine.py,
calibration.py, research_agent.text for snippets). See docs/query.md for the behaviour (fusion,
document_context, filters, token budget, refinement rules) and the measurements behind the defaults.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.errors import CollectionError, QueryError
from research_agent.ingest.nodes import STORED_EXTRA_KEYS
from research_agent.search import calibration, diversity
from research_agent.search.filters import validate_filters
from research_agent.search.refine import QueryRefinement, refine
from research_agent.search.retrieve import Candidate, adaptive_dense_weight, cap_per_document, retrieve_candidates
from research_agent.text import checked_text, clean_text, keyword_words, snippet, stemmer

if TYPE_CHECKING:
    from research_agent.container import Container

QUERY_MODES = ("hybrid", "semantic", "keyword")

class QueryHit(BaseModel):
    content: str
    relevance_score: float
    relevance_label: str
    source_document: str
    header_path: str
    metadata: dict[str, Any]
    #: Where the hit is, for citations: the file of its document (None for research, notes, records and web
    #: pages: their key is `source_document`), its 1-based inclusive lines in that file, its PDF page.
    path: str | None = None
    line_start: int | None = None
    line_end: int | None = None
    page: int | None = None
    #: Why the hit ranks where it does, with `explain` only (null otherwise, so the shape stays the same):
    #: see `explain_hit`.
    explain: dict[str, Any] | None = None


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
    filters: dict[str, Any] = {}
    #: Estimated tokens of the returned contents, and whether max_tokens cut the list short.
    total_tokens: int = 0
    truncated_by_budget: bool = False


def relevance_label(score: float, settings: Any) -> str:
    """The band of a calibrated relevance probability (calibration.label)."""
    return calibration.label(score, settings)


def validate_query(query: Any, settings: Any) -> str:
    """The query, stripped, with lone surrogates replaced (clean_text: the tokenizers raised TypeError on them)."""
    return checked_text(query, settings.max_query_chars, name="query", empty="Ask a question or give search terms.",
                        too_long="Shorten the query, or pass long text as --document-context.")


def validate_context(document_context: Any) -> str | None:
    """document_context is tokenized and embedded like the query, so it gets the same cleaning."""
    return clean_text(document_context) if isinstance(document_context, str) else document_context


def resolve_collections(c: Container, collections: list[str] | None, project: str | None) -> list[str]:
    """Explicit collections, else the project's defaults, else every collection."""
    if collections:
        names = list(dict.fromkeys(n.strip() for n in collections if n and n.strip()))
        c.store.require_collections(names)
        return names
    if project:
        from research_agent.catalog.projects import require_project

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


def rerank_passage(text: str, query: str, max_tokens: int) -> str:
    """What the cross-encoder reads of a chunk: its query-centred window of `max_tokens` (0: all of it).

    A cross-encoder's cost grows with the pair's length, and the MS MARCO models were trained on passages of
    about 100 tokens; the window holds the most query terms, so the passage keeps the evidence it has.
    """
    return snippet(text, query, max_tokens, marks=False) if max_tokens > 0 else text


def _rerank_scores(c: Container, query: str, pool: list[Candidate], timings: dict[str, float],
                   warnings: list[str]) -> list[float] | None:
    """The cross-encoder's probabilities for the pool, or None (with a warning) when it cannot load."""
    s = c.settings
    t = time.perf_counter()
    # Windows only for a reranker that loads: offline, the default one never does.
    scores = (c.reranker.score(query, [rerank_passage(cand.text, query, s.rerank_passage_tokens) for cand in pool])
              if c.reranker.load() else None)
    timings["rerank"] = (time.perf_counter() - t) * 1000
    if scores is None:
        warnings.append(f"Not reranked: reranker {s.reranker_model!r} is unavailable "
                        f"({c.reranker.error}). Results are in retrieval order.")
    return scores


def calibrated_order(c: Container, query: str, window: list[Candidate], size: int, mode: str, use_rerank: bool,
                     timings: dict[str, float], warnings: list[str]) -> tuple[list[Candidate], list[float]]:
    """The returned pool (at most `size` hits, in order) and each hit's calibrated relevance probability.

    The scores are computed over `window`, the first fused hits up to a length that does not depend on
    top_k, so a hit's score and label are the same whatever top_k is (an outside tester saw a right answer
    at 0.185 "Not Relevant" with top_k 1 and 0.478 with top_k 5 when they were computed over the returned
    hits only). Without a reranker the score is the calibrated probability of the hit's evidence
    (search/calibration.py, features in the retrieval order); semantic and keyword windows are sorted by it
    (the shown score is the model's own), hybrid keeps the fused order, which ranks better
    (calibration.SORTED_MODES), and shows the nearest non-increasing scores (calibration.descending). With a
    reranker, each of the first `size` candidates gets the position-aware blend of the cross-encoder's
    probability and that retrieval probability, and the pool is sorted by it, so the score descends by
    construction and means the same with and without a reranker.
    """
    own = calibration.probabilities(mode, [x.dense for x in window], [x.keyword for x in window],
                                    [x.fused for x in window], query=query, texts=[x.text for x in window])
    retrieval = calibration.descending(own)
    pool = window[:size]
    rerank_scores = _rerank_scores(c, query, pool, timings, warnings) if use_rerank and pool else None
    if rerank_scores is None:
        if mode in calibration.SORTED_MODES:
            ranked = _sorted_by_probability(list(window), own)
            return ranked[0][:size], ranked[1][:size]
        return pool, retrieval[:size]
    blended = {}
    for rank, (cand, p, r) in enumerate(zip(pool, retrieval, rerank_scores), start=1):
        cand.rerank = r
        blended[cand.id] = calibration.blend_rerank(p, r, rank)
    pool = sorted(pool, key=lambda x: blended[x.id], reverse=True)
    return pool, [blended[x.id] for x in pool]


def _sorted_by_probability(pool: list[Candidate], probs: list[float]) -> tuple[list[Candidate], list[float]]:
    """`pool` sorted by probability, ties kept in fused order (a stable sort), and the sorted scores."""
    order = sorted(range(len(pool)), key=lambda i: -probs[i])
    return [pool[i] for i in order], [probs[i] for i in order]


def _hits(c: Container, query: str, pool: list[Candidate], scores: list[float], *, snippets: bool,
          max_tokens: int | None) -> tuple[list[QueryHit], int, bool]:
    """QueryHits for the pool in order, within the token budget: (hits, tokens used, cut by the budget)."""
    from research_agent.ingest.chunking import estimate_tokens

    s = c.settings
    hits: list[QueryHit] = []
    used_tokens = 0
    for cand, score in zip(pool, scores):
        text = snippet(cand.text, query, s.snippet_tokens) if snippets else cand.text
        tokens = estimate_tokens(text)
        if max_tokens is not None and hits and used_tokens + tokens > max_tokens:
            return hits, used_tokens, True
        used_tokens += tokens
        meta = dict(cand.metadata)
        meta.update(chunk_id=cand.id, retrieval={k: round(v, 4) for k, v in (
            ("dense", cand.dense), ("keyword", cand.keyword), ("fused", cand.fused), ("rerank", cand.rerank))
            if v is not None}, ranks=dict(cand.ranks), returned_tokens=tokens,
            snippet=bool(snippets and text != cand.text))
        # The label from the score as shown: 0.49996 was shown as 0.5 yet labelled below the 0.5 band.
        hits.append(QueryHit(content=text, relevance_score=round(score, 4),
                             relevance_label=relevance_label(round(score, 4), s),
                             source_document=meta.get("source_document", ""),
                             header_path=meta.get("header_path", ""), metadata=meta,
                             **{k: meta[k] for k in ("line_start", "line_end", "page")
                                if isinstance(meta.get(k), int)}))
    _set_paths(c, hits)
    return hits, used_tokens, False


#: Metadata keys of a hit's title line: the document's title, a front-matter node's title, its header path.
TITLE_KEYS = ("document_title", "title", STORED_EXTRA_KEYS["title"], "header_path")


def matched_words(query: str, text: str) -> list[str]:
    """The query's keyword words (research_agent.text.keyword_words, in query order, once each) whose Snowball
    stem is among the stems of `text`: the analyzer BM25 uses, so "retries" in the query matches "retry"."""
    words = list(dict.fromkeys(keyword_words(query)))
    found = set(stemmer().stemWords(keyword_words(text))) if words and text else set()
    return [w for w, st in zip(words, stemmer().stemWords(words)) if st in found] if found else []


def explain_hit(query: str, cand: Candidate, mode: str, fusion: str | None,
                dense_weight: float | None = None) -> dict[str, Any]:
    """One hit's ranks and scores as `metadata.retrieval`/`ranks` hold them (rounded to 4 places; a side that
    did not see the hit is null), the dense weight fusion gave the query (`dense_weight`, from
    fusion_dense_weight; null outside hybrid) and the query words found in its content, title line and
    front-matter keywords (issue 17, as tobi/qmd's --explain). Computed for the returned hits only (at most
    top_k)."""
    meta = cand.metadata
    title = " ".join(str(meta[k]) for k in TITLE_KEYS if isinstance(meta.get(k), str))
    kw = meta.get("keywords")
    keywords = " ".join(map(str, kw)) if isinstance(kw, list) else kw if isinstance(kw, str) else ""
    score = {k: None if v is None else round(v, 4) for k, v in (
        ("dense", cand.dense), ("keyword", cand.keyword), ("fused", cand.fused), ("rerank", cand.rerank))}
    return {"dense_rank": cand.ranks.get("dense"), "keyword_rank": cand.ranks.get("keyword"), **score,
            "mode": mode, "fusion": fusion, "dense_weight": None if dense_weight is None else round(dense_weight, 4),
            "matched": {"content": matched_words(query, cand.text), "title": matched_words(query, title),
                        "keywords": matched_words(query, keywords)}}


def fusion_dense_weight(mode: str, fusion: str, fused: list[Candidate], base: float) -> float | None:
    """The dense weight hybrid fusion gave this query: convex fusion's adaptive weight of the whole fused pool
    (the inputs fuse_convex gives adaptive_dense_weight: every candidate's cosine and BM25, before the
    per-document cap; the pool's order does not matter), RRF's fixed `base`; None outside hybrid."""
    if mode != "hybrid":
        return None
    if fusion != "convex":
        return base
    return adaptive_dense_weight([x.dense or 0.0 for x in fused], [x.keyword or 0.0 for x in fused], base)


def _set_paths(c: Container, hits: list[QueryHit]) -> None:
    """Each hit's file path from its document's manifest (one registry read for the page of hits): chunk
    metadata holds the document key, which for a folder ingest is relative to the folder, not to anything the
    reader can open (issue 17: `path:line` citations)."""
    from research_agent.storage.registry import document_key

    keys = {document_key(h.metadata.get("collection", ""), h.source_document) for h in hits}
    manifests = c.store.registry_get(list(keys)) if keys else {}
    for hit in hits:
        manifest = manifests.get(document_key(hit.metadata.get("collection", ""), hit.source_document)) or {}
        path = manifest.get("path")
        hit.path = path if isinstance(path, str) else None


# -- the service -----------------------------------------------------------------------------------
def query_knowledge(c: Container, query: str, *, collections: list[str] | None = None, project: str | None = None,
                    top_k: int = 10, document_context: str | None = None, mode: str = "hybrid",
                    rerank: bool = True, filters: dict[str, Any] | None = None, max_tokens: int | None = None,
                    snippets: bool = False, per_document_cap: int | None = None,
                    explain: bool = False, diverse: bool = False) -> QueryResult:
    """Search collections and return the top_k chunks, reranked by the cross-encoder when it is available.

    filters: {field: value or [values]} on content_type, kind, node_type, status, tags/keywords,
    code_language, document, collection. max_tokens: stop adding hits once their contents would exceed
    this many (estimated) tokens; the first hit is always returned. snippets: return the ~60-token window
    of each chunk that best matches the query instead of the whole chunk. per_document_cap: override
    settings.per_document_cap (0 = no cap). explain: give each hit an `explain` object (`explain_hit`).
    diverse: pick the top_k by maximal marginal relevance (search/diversity.py), so near-copies of a chunk of
    the same section (cosine >= 0.9) go down the list; every other hit keeps its relevance order; off, the
    ranking is untouched.
    """
    s = c.settings
    t0 = time.perf_counter()
    query = validate_query(query, s)
    document_context = validate_context(document_context)
    mode = mode or "hybrid"
    _validate_arguments(mode, top_k, max_tokens, s)
    flt = validate_filters(filters)
    c.store.refresh()
    names = _scope(c, collections, project, flt)
    timings: dict[str, float] = {}
    cap = s.per_document_cap if per_document_cap is None else per_document_cap
    n_rerank = max(int(s.rerank_candidates), top_k)
    n = max(s.retrieval_candidates, n_rerank, top_k * max(cap, 1))
    fused = retrieve_candidates(c, query, names, mode=mode, n=n, document_context=document_context,
                                timings=timings, filters=flt)
    t_cap = time.perf_counter()
    capped = diversity.cap_for_diversity(c, fused, cap) if diverse else cap_per_document(fused, cap)
    cap_ms = (time.perf_counter() - t_cap) * 1000
    warnings: list[str] = []
    use_rerank = bool(rerank and s.rerank)
    size = n_rerank if use_rerank else top_k * (diversity.DIVERSITY_POOL_FACTOR if diverse else 1)
    # Scores are computed over a window that does not depend on top_k (hybrid's pooled scores and the sorted
    # modes' order read the hits below), so a hit keeps its score whatever --top-k asks for.
    window = capped[:max(s.retrieval_candidates, size)]
    pool, scores = calibrated_order(c, query, window, size, mode, use_rerank, timings, warnings)
    reranked = any(cand.rerank is not None for cand in pool)
    if diverse:
        t = time.perf_counter()
        pool, scores = diversity.diversify(c, pool, scores, top_k)
        timings["diversity"] = cap_ms + (time.perf_counter() - t) * 1000  # the near-copy-aware cap and MMR
    hits, used_tokens, truncated = _hits(c, query, pool[:top_k], scores, snippets=snippets, max_tokens=max_tokens)
    if explain:
        _explain(c, query, hits, pool, mode, fused)
    timings["total"] = (time.perf_counter() - t0) * 1000
    return QueryResult(query=query, mode=mode, collections=names, reranked=reranked, warnings=warnings, results=hits,
                       query_refinement=refine(query, hits, s), timings_ms={k: round(v, 1) for k, v in timings.items()},
                       filters=flt, total_tokens=used_tokens, truncated_by_budget=truncated)


def _explain(c: Container, query: str, hits: list[QueryHit], pool: list[Candidate], mode: str,
             fused: list[Candidate]) -> None:
    """Each hit's `explain` object; `fused` is the whole fused pool (before the per-document cap)."""
    s = c.settings
    fusion = s.fusion_method if mode == "hybrid" else None
    weight = fusion_dense_weight(mode, s.fusion_method, fused, s.hybrid_dense_weight)
    for hit, cand in zip(hits, pool):
        hit.explain = explain_hit(query, cand, mode, fusion, weight)


def _validate_arguments(mode: str, top_k: Any, max_tokens: Any, settings: Any) -> None:
    """Coded errors for a bad mode, top_k or max_tokens (the query text is checked by validate_query)."""
    if mode not in QUERY_MODES:
        raise QueryError(f"Unknown mode {mode!r}", guidance=f"Use one of: {', '.join(QUERY_MODES)}.")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= settings.max_top_k:
        raise QueryError(f"top_k must be between 1 and {settings.max_top_k}",
                         guidance=f"Pass a top_k from 1 to {settings.max_top_k}.")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise QueryError("max_tokens must be a positive whole number", guidance="Pass e.g. --max-tokens 2000.")


def _scope(c: Container, collections: list[str] | None, project: str | None, flt: dict[str, list[str]]) -> list[str]:
    """The collections to search: resolve_collections, narrowed by a `collection` filter inside that scope."""
    names = resolve_collections(c, collections, project)
    if "collection" in flt:
        outside = [str(v) for v in flt["collection"] if v not in names]
        if outside:
            raise QueryError(f"The collection filter names collections outside the search scope: {', '.join(outside)}",
                             guidance=f"Search one of: {', '.join(names)} (or pass them with --collections).")
        names = [n for n in names if n in flt["collection"]]
    return names
