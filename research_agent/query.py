"""Query: dense, keyword or hybrid retrieval across collections, then cross-encoder reranking.

See docs/query.md for the behaviour (fusion, document_context, filters, token budget, refinement rules)
and the measurements behind the defaults.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel

from research_agent import calibration
from research_agent.catalog.collections import open_collection
from research_agent.errors import CollectionError, QueryError

QUERY_MODES = ("hybrid", "semantic", "keyword")
FUSION_METHODS = ("convex", "rrf")

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
    filters: dict[str, Any] = {}
    #: Estimated tokens of the returned contents, and whether max_tokens cut the list short.
    total_tokens: int = 0
    truncated_by_budget: bool = False


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
    """The band of a calibrated relevance probability (research_agent.calibration.label)."""
    return calibration.label(score, settings)


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


# -- metadata filters ---------------------------------------------------------------------------
#: Filter name -> chunk metadata field. `tags` and `keywords` both match front-matter keywords/tags.
FILTER_FIELDS = {"content_type": "content_type", "kind": "kind", "node_type": "node_type", "status": "status",
                 "tags": "keywords", "keywords": "keywords", "code_language": "code_language",
                 "document": "source_document", "collection": "collection"}
_LIST_FIELDS = {"keywords"}
#: Bounds on a filter: values per field and characters per value. Chroma's SQLite store fails on about
#: 32,000 values ("too many SQL variables", a -32000) and the keyword side tests each chunk against each
#: value, so a list far past any real need is a mistake to report, not to run.
MAX_FILTER_VALUES = 100
MAX_FILTER_VALUE_CHARS = 500


def _filter_error(key: str, problem: str) -> QueryError:
    return QueryError(f"Filter {key!r} {problem}", filter=str(key)[:100],
                      guidance=f"Give text values, one or a list of up to {MAX_FILTER_VALUES}: for example "
                               f"{{\"{key}\": \"value\"}} or {{\"{key}\": [\"a\", \"b\"]}}. Operators such as "
                               "$in or $ne are not supported.")


def _filter_value(key: str, value: Any) -> str:
    """One filter value as the text it matches: every filter field holds text, so a whole number matches its
    digits ({"tags": 3} finds the keyword "3") in every mode alike; other types are errors rather than
    values that Chroma rejects on the dense side (mixed types, NaN) and the keyword side silently misses."""
    if isinstance(value, str):
        if len(value) > MAX_FILTER_VALUE_CHARS:
            raise _filter_error(key, f"has a value of {len(value)} characters; the limit is {MAX_FILTER_VALUE_CHARS}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    shown = f" ({value})" if isinstance(value, float) else ""  # never str() a nested list: it may be huge
    raise _filter_error(key, f"has a value of type {type(value).__name__}{shown}; values are text or whole numbers")


def validate_filters(filters: Any) -> dict[str, list[str]]:
    """{name: [accepted values as text]} from a filters dict; a value may be one value or a list (any of)."""
    if filters is None:
        return {}
    if not isinstance(filters, dict):
        raise QueryError("filters must be a mapping of field to value",
                         guidance=f"For example {{\"content_type\": \"code_block\"}}; fields: {', '.join(FILTER_FIELDS)}.")
    out: dict[str, list[str]] = {}
    for key, value in filters.items():
        if key not in FILTER_FIELDS:
            raise QueryError(f"Unknown filter {key!r}", filter=str(key)[:100],
                             guidance=f"Filter on one of: {', '.join(FILTER_FIELDS)}.")
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        if len(values) > MAX_FILTER_VALUES:
            raise _filter_error(key, f"has {len(values)} values; the limit is {MAX_FILTER_VALUES}")
        values = [_filter_value(key, v) for v in values if v is not None]
        if not values:
            raise _filter_error(key, "needs a value")
        out[key] = list(dict.fromkeys(values))
    return out


def chroma_where(filters: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The Chroma `where` clause for validated filters (collection is applied by choosing collections)."""
    clauses: list[dict[str, Any]] = []
    for key, values in filters.items():
        fld = FILTER_FIELDS[key]
        if key == "collection":
            continue
        if fld in _LIST_FIELDS:
            ors = [{fld: {"$contains": v}} for v in values]
            clauses.append(ors[0] if len(ors) == 1 else {"$or": ors})
        else:
            clauses.append({fld: values[0]} if len(values) == 1 else {fld: {"$in": values}})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def metadata_predicate(filters: dict[str, list[Any]]) -> Callable[[dict[str, Any]], bool] | None:
    """The same filters as a test on a chunk's metadata (for the keyword index)."""
    checks = [(FILTER_FIELDS[k], set(v)) for k, v in filters.items() if k != "collection"]
    if not checks:
        return None

    def accept(meta: dict[str, Any]) -> bool:
        for fld, wanted in checks:
            have = meta.get(fld)
            if fld in _LIST_FIELDS:
                if not isinstance(have, list) or not wanted.intersection(have):
                    return False
            elif have not in wanted:
                return False
        return True

    return accept


# -- retrieval ------------------------------------------------------------------------------------
def _active(c, collection: str, metas: list[dict[str, Any]]) -> list[bool]:
    from research_agent.ingest import document_key

    keys = list({document_key(collection, m.get("source_document", "")) for m in metas})
    current = {m["document"]: m["content_hash"] for m in c.store.registry_get(keys).values()}
    return [current.get(m.get("source_document")) == m.get("content_hash") for m in metas]


def _dense(c, collection: str, col: Any, qvec: list[float], n: int, where: dict[str, Any] | None) -> list[Candidate]:
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


def _query_vector(c, query: str, document_context: str | None, weight: float) -> list[float]:
    qvec = c.embedder.embed_query(query)
    if document_context and document_context.strip() and weight > 0:
        ctx = c.embedder.embed_query(document_context[: c.settings.max_query_chars * 4])
        mixed = [q + weight * x for q, x in zip(qvec, ctx)]
        norm = math.sqrt(sum(v * v for v in mixed)) or 1.0
        qvec = [v / norm for v in mixed]
    return qvec


def retrieve_candidates(c, query: str, names: list[str], *, mode: str = "hybrid", n: int = 60,
                        document_context: str | None = None, timings: dict[str, float] | None = None,
                        filters: dict[str, Any] | None = None, fusion: str | None = None,
                        dense_weight: float | None = None, context_weight: float | None = None) -> list[Candidate]:
    """Candidates from the collections `names`, best first, before capping and reranking.

    Each retriever returns up to `n` chunks per collection; `filters` (see FILTER_FIELDS) restrict both.
    """
    from research_agent.keyword import keyword_index

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
    rankings: dict[str, tuple[Any, Any]] = {}
    if mode in ("semantic", "hybrid"):
        t = time.perf_counter()
        qvec = _query_vector(c, query, document_context,
                             s.context_weight if context_weight is None else context_weight)
        timings["embed"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        dense = sorted((cand for name in names for cand in _dense(c, name, cols[name], qvec, n, where)),
                       key=lambda x: x.dense or 0.0, reverse=True)
        timings["dense"] = (time.perf_counter() - t) * 1000
    if mode in ("keyword", "hybrid"):
        t = time.perf_counter()
        for name in names:
            index = keyword_index(c, name, cols[name])
            scores = index.rank(query, accept)
            rankings[name] = (index, scores)
            keyword += [Candidate(ch.id, ch.text, ch.metadata, keyword=sc) for ch, sc in index.top(scores, n)]
        keyword.sort(key=lambda x: x.keyword or 0.0, reverse=True)
        timings["keyword"] = (time.perf_counter() - t) * 1000
    if mode == "semantic":
        for rank, cand in enumerate(dense, start=1):
            cand.ranks["dense"], cand.fused = rank, cand.dense or 0.0
        return dense
    if mode == "keyword":
        for rank, cand in enumerate(keyword, start=1):
            cand.ranks["keyword"], cand.fused = rank, cand.keyword or 0.0
        return keyword
    t = time.perf_counter()
    if fusion == "rrf":
        out = fuse_rrf(dense, keyword, w, s.rrf_k)
    else:
        pool: dict[str, Candidate] = {}
        for rank, cand in enumerate(dense, start=1):
            cand.ranks["dense"] = rank
            pool[cand.id] = cand
        for rank, cand in enumerate(keyword, start=1):
            cur = pool.setdefault(cand.id, cand)
            cur.keyword = cand.keyword
            cur.ranks["keyword"] = rank
        # Complete the scores: BM25 of dense-only chunks from the full score vector, cosine of
        # keyword-only chunks from their stored vectors, so no candidate is scored by one side alone.
        for name, (index, scores) in rankings.items():
            missing = [x for x in pool.values() if x.keyword is None and x.metadata.get("collection", name) == name]
            for x in missing:
                pos = index.position.get(x.id)
                x.keyword = float(scores[pos]) if scores is not None and pos is not None else 0.0
        for name in names:
            need = [x.id for x in pool.values() if x.dense is None and x.metadata.get("collection", name) == name]
            for cid, sim in _dense_scores(cols[name], qvec or [], need).items():
                pool[cid].dense = sim
        out = fuse_convex(list(pool.values()), w)
    timings["fuse"] = (time.perf_counter() - t) * 1000
    return out


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


# -- snippets and the token budget ----------------------------------------------------------------
_PIECE = re.compile(r"\S+")
_EDGE = re.compile(r"^\W+|\W+$")


def snippet(text: str, query: str, max_tokens: int = 60, marks: bool = True) -> str:
    """The window of about `max_tokens` tokens of `text` that holds the most distinct query terms.

    Ties go to the earlier window; a cut is marked with an ellipsis unless `marks` is False. Text within the
    budget is returned whole.
    """
    from research_agent.ingest.chunking import estimate_tokens
    from research_agent.keyword import _stemmer, words

    if estimate_tokens(text) <= max_tokens:
        return text
    stemmer = _stemmer()
    wanted = set(stemmer.stemWords(words(query)))
    pieces = [(m.start(), m.end(), estimate_tokens(m.group())) for m in _PIECE.finditer(text)]
    stems = stemmer.stemWords([_EDGE.sub("", text[a:b]).lower() for a, b, _ in pieces])
    best, best_score = (0, 0), (-1, -1)
    j, used = 0, 0
    counts: Counter[str] = Counter()
    for i in range(len(pieces)):
        while j < len(pieces) and (used + pieces[j][2] <= max_tokens or j == i):
            used += pieces[j][2]
            if stems[j] in wanted:
                counts[stems[j]] += 1
            j += 1
        score = (len(counts), sum(counts.values()))
        if score > best_score:
            best, best_score = (i, j), score
        used -= pieces[i][2]
        if stems[i] in wanted:
            counts[stems[i]] -= 1
            if not counts[stems[i]]:
                del counts[stems[i]]
    i, j = best
    out = text[pieces[i][0]:pieces[j - 1][1]]
    if not marks:
        return out
    return ("… " if i > 0 else "") + out + (" …" if j < len(pieces) else "")


def rerank_passage(text: str, query: str, max_tokens: int) -> str:
    """What the cross-encoder reads of a chunk: its query-centred window of `max_tokens` (0: all of it).

    A cross-encoder's cost grows with the pair's length, and the MS MARCO models were trained on passages of
    about 100 tokens; the window holds the most query terms, so the passage keeps the evidence it has.
    """
    return snippet(text, query, max_tokens, marks=False) if max_tokens > 0 else text


# -- refinement --------------------------------------------------------------------------------------
_WORD = re.compile(r"[A-Za-z][A-Za-z-]{2,}")
# Function words never suggested as refinements (broader than the BM25 stop list).
_SUGGEST_STOP = frozenset(
    "the and for with that this from are was were has have had not but you your can use used using how what when "
    "where which who whom why into over under about will would should could does did its it's our their there these "
    "those then than them they also such may might must been being each other more most some any all both only very "
    "just one two three here onto upon via per between after before while during without within across among out "
    "off own same so too yet nor him her his hers she its itself we us is be an as at by if in it no of on or to "
    "shall etc i.e e.g new see".split())
#: A weak list is "flat" when the 1st and the 5th hit's scores differ by less than this.
FLAT_SPREAD = 0.05
FLAT_MIN_HITS = 5


def _suggestions(query: str, hits: list[QueryHit], limit: int = 3) -> list[str]:
    """Refined queries: the query plus a word that several top results share and the query lacks.

    Words are counted once per hit (title and header path count double, as they name what a chunk is
    about); a word must occur in at least two hits, or in the only hit. Nothing is invented: every
    suggested word appears in the returned results.
    """
    from research_agent.keyword import _stemmer

    stemmer = _stemmer()
    qstems = set(stemmer.stemWords([w.lower() for w in _WORD.findall(query)]))
    weight: Counter[str] = Counter()
    surface: dict[str, Counter[str]] = {}
    top = hits[:5]
    for h in top:
        seen: dict[str, int] = {}
        for part, boost in ((f"{h.metadata.get('document_title', '')} {h.header_path}", 2), (h.content, 1)):
            for w in _WORD.findall(part):
                lw = w.lower().strip("-")
                if len(lw) < 4 or lw in _SUGGEST_STOP:
                    continue
                st = stemmer.stemWord(lw)
                if st in qstems:
                    continue
                seen[st] = max(seen.get(st, 0), boost)
                surface.setdefault(st, Counter())[lw] += 1
        for st, boost in seen.items():
            weight[st] += boost
    need = 2 if len(top) > 1 else 1
    stems_of = [set(stemmer.stemWords([w.lower() for w in _WORD.findall(
        f"{h.metadata.get('document_title', '')} {h.header_path} {h.content}")])) for h in top]
    hits_with = Counter({st: sum(1 for stems in stems_of if st in stems) for st in weight})
    ranked = sorted((st for st in weight if hits_with[st] >= need), key=lambda st: (-weight[st], st))
    return [f"{query} {surface[st].most_common(1)[0][0]}" for st in ranked[:limit]]


def refine(query: str, hits: list[QueryHit], settings: Any) -> QueryRefinement:
    """Advice from the score distribution of the final hits (rules in docs/query.md).

    1. clarification_needed: no hit, or the best score is below threshold_somewhat_relevant.
    2. too_broad: the query has at most one content word, or the hits are weak and flat (best score
       below threshold_relevant and the 1st and 5th scores within FLAT_SPREAD).
    3. optimal otherwise. Suggestions (cases 1 and 2) are the query plus a word shared by top results.
    """
    from research_agent.keyword import words

    scores = [h.relevance_score for h in hits]
    if not hits or scores[0] < settings.threshold_somewhat_relevant:
        return QueryRefinement(status="clarification_needed", suggestions=_suggestions(query, hits),
                               message="Nothing relevant was found; rephrase with the terms the documents use, "
                               "search other collections, or check the spelling.")
    content_words = [w for w in words(query) if w not in _SUGGEST_STOP]
    if len(content_words) <= 1:
        return QueryRefinement(status="too_broad", suggestions=_suggestions(query, hits),
                               message="A one-word query matches many passages; add what you want to know about it.")
    if (len(scores) >= FLAT_MIN_HITS and scores[0] < settings.threshold_relevant
            and scores[0] - scores[FLAT_MIN_HITS - 1] < FLAT_SPREAD):
        return QueryRefinement(status="too_broad", suggestions=_suggestions(query, hits),
                               message="Many results match about equally and none strongly; add detail to narrow "
                               "the query.")
    return QueryRefinement(status="optimal", suggestions=[], message="The top results match the query well.")


def _rerank_scores(c, query: str, pool: list[Candidate], timings: dict[str, float],
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


def calibrated_order(c, query: str, pool: list[Candidate], mode: str, use_rerank: bool,
                     timings: dict[str, float], warnings: list[str]) -> list[float]:
    """Sort `pool` in place into the returned order and give each its calibrated relevance probability.

    Without a reranker the order is the retrieval order and the score the calibrated probability of the
    hit's evidence (research_agent.calibration), capped to descend. With one, each candidate's score is the
    position-aware blend of the cross-encoder's probability and that retrieval probability, and the pool is
    sorted by it, so the score descends by construction and means the same with and without a reranker.
    """
    retrieval = calibration.calibrated_scores(mode, [x.dense for x in pool], [x.keyword for x in pool],
                                              [x.fused for x in pool], query=query)
    rerank_scores = _rerank_scores(c, query, pool, timings, warnings) if use_rerank and pool else None
    if rerank_scores is None:
        return retrieval
    blended = {}
    for rank, (cand, p, r) in enumerate(zip(pool, retrieval, rerank_scores), start=1):
        cand.rerank = r
        blended[cand.id] = calibration.blend_rerank(p, r, rank)
    pool.sort(key=lambda x: blended[x.id], reverse=True)
    return [blended[x.id] for x in pool]


def _hits(c, query: str, pool: list[Candidate], scores: list[float], *, snippets: bool,
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
            if v is not None}, ranks=dict(cand.ranks), returned_tokens=tokens, snippet=bool(snippets and text != cand.text))
        hits.append(QueryHit(content=text, relevance_score=round(score, 4),
                             relevance_label=relevance_label(score, s),
                             source_document=meta.get("source_document", ""),
                             header_path=meta.get("header_path", ""), metadata=meta))
    return hits, used_tokens, False


# -- the service ----------------------------------------------------------------------------------
def query_knowledge(c, query: str, *, collections: list[str] | None = None, project: str | None = None,
                    top_k: int = 10, document_context: str | None = None, mode: str = "hybrid",
                    rerank: bool = True, filters: dict[str, Any] | None = None, max_tokens: int | None = None,
                    snippets: bool = False, per_document_cap: int | None = None) -> QueryResult:
    """Search collections and return the top_k chunks, reranked by the cross-encoder when it is available.

    filters: {field: value or [values]} on content_type, kind, node_type, status, tags/keywords,
    code_language, document, collection. max_tokens: stop adding hits once their contents would exceed
    this many (estimated) tokens; the first hit is always returned. snippets: return the ~60-token window
    of each chunk that best matches the query instead of the whole chunk. per_document_cap: override
    settings.per_document_cap (0 = no cap).
    """
    s = c.settings
    t0 = time.perf_counter()
    query = validate_query(query, s)
    mode = mode or "hybrid"
    if mode not in QUERY_MODES:
        raise QueryError(f"Unknown mode {mode!r}", guidance=f"Use one of: {', '.join(QUERY_MODES)}.")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= s.max_top_k:
        raise QueryError(f"top_k must be between 1 and {s.max_top_k}", guidance="Pass a smaller --top-k.")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise QueryError("max_tokens must be a positive whole number", guidance="Pass e.g. --max-tokens 2000.")
    flt = validate_filters(filters)
    c.store.refresh()
    names = resolve_collections(c, collections, project)
    if "collection" in flt:
        outside = [str(v) for v in flt["collection"] if v not in names]
        if outside:
            raise QueryError(f"The collection filter names collections outside the search scope: {', '.join(outside)}",
                             guidance=f"Search one of: {', '.join(names)} (or pass them with --collections).")
        names = [n for n in names if n in flt["collection"]]
    timings: dict[str, float] = {}
    cap = s.per_document_cap if per_document_cap is None else per_document_cap
    n_rerank = max(int(s.rerank_candidates), top_k)
    n = max(s.retrieval_candidates, n_rerank, top_k * max(cap, 1))
    fused = retrieve_candidates(c, query, names, mode=mode, n=n, document_context=document_context,
                                timings=timings, filters=flt)
    fused = cap_per_document(fused, cap)
    warnings: list[str] = []
    use_rerank = bool(rerank and s.rerank)
    pool = fused[:n_rerank] if use_rerank else fused[:top_k]
    scores = calibrated_order(c, query, pool, mode, use_rerank, timings, warnings)
    reranked = any(cand.rerank is not None for cand in pool)
    hits, used_tokens, truncated = _hits(c, query, pool[:top_k], scores, snippets=snippets, max_tokens=max_tokens)
    timings["total"] = (time.perf_counter() - t0) * 1000
    return QueryResult(query=query, mode=mode, collections=names, reranked=reranked, warnings=warnings, results=hits,
                       query_refinement=refine(query, hits, s), timings_ms={k: round(v, 1) for k, v in timings.items()},
                       filters=flt, total_tokens=used_tokens, truncated_by_budget=truncated)
