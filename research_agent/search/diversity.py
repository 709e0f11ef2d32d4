"""Diversity: maximal marginal relevance (MMR) within sections, so the top k are not k chunks of one section.

Opt-in (`query --diverse`, MCP `diverse: true`): it runs after fusion, the per-document cap (which then gives a
document's slots to distinct sections first: `cap_sections_first`) and reranking, on the pool those left (the
reranked pool, or DIVERSITY_POOL_FACTOR x top_k hits without a reranker), and picks top_k of them greedily:
each pick maximises

    MMR_LAMBDA * relevance - (1 - MMR_LAMBDA) * (highest redundancy with a hit already picked)

where relevance is the hit's calibrated relevance probability (0-1) and the redundancy of two chunks is the
cosine of their stored vectors when they are chunks of the same section (collection, document, header_path),
else 0. A hit keeps its own score and label; with diversity on, the list is in MMR order, so scores need not
descend.

Why within sections, not plain MMR over every pair: relevant passages resemble each other, so a cosine penalty
on every pair pushed relevant hits down. benchmarks/diversity.py (no reranker, pool 3 x top_k, lambda 0.5; +-
is 1.96 standard errors of the per-query difference; cap = the per-document cap, 3 by default; dup@5 = hits in
the top 5 repeating an earlier hit's section, per query):

    nDCG@10, off -> on            plain cosine MMR                this (within sections)           dup@5 off -> this
    docs-QA (40 q, cap 3)         0.793 -> 0.701 (-0.092+-0.044)  0.793 -> 0.808 (+0.015+-0.022)   0.88 -> 0
    docs-QA (cap 0)               0.813 -> 0.752 (-0.061+-0.036)  0.813 -> 0.823 (+0.010+-0.010)   1.20 -> 0
    SciFact test (cap 1, eval)    0.723 -> 0.653 (-0.070+-0.018)  0.723 -> 0.723 (identical)       0 -> 0
    SciFact test (cap 3)          -                               0.719 -> 0.723 (+0.004+-0.003)   1.13 -> 0
    NFCorpus test (cap 3)         -                               0.336 -> 0.367 (+0.032+-0.007)   1.00 -> 0

(A BEIR document is one section, so with cap 1 there is nothing to spread.) Cross-section near-duplicates
(cosine over 0.8, rescaled) were tried too and cost NFCorpus -0.008 +- 0.004 with cap 1: left alone. Cost: the
pass, reading the pool's ~30 vectors included, 2.5-4.5 ms per query (medians; 45-90 ms unreranked queries on a
busy 2-core machine); none when no two pool chunks share a section (no vectors are read then).

Vectors: the pool's chunk vectors are read by id from Chroma (one `get` per collection searched) rather than
carried by the dense query, because keyword-only candidates have none there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from research_agent.catalog.collections import open_collection
from research_agent.search.retrieve import Candidate
from research_agent.storage.chunks import records

if TYPE_CHECKING:
    from research_agent.container import Container

#: Weight of relevance against redundancy. Why 0.5: relevance and redundancy both lie in 0-1, so at 0.5 a
#: near-duplicate (cosine ~1) of a picked chunk gains 0.5 * relevance - 0.5 <= 0 and ranks below every fresh
#: section's hit, while a same-section chunk that says something else (cosine 0.3) costs only 0.15. Measured
#: (benchmarks/diversity.py): on docs-QA without a cap, 0.85 left same-section duplicates in the top 5 of 9 of 40
#: questions, 0.7 of 3, 0.5 of none, at the same nDCG@10; NFCorpus (cap 3) gained +0.019, +0.028, +0.032.
#: A candidate setting.
MMR_LAMBDA = 0.5
#: Without a reranker the pool MMR chooses from is this many times top_k (fused order, capped per document):
#: 3x gives room to skip a run of one section's chunks without reaching far down the list.
DIVERSITY_POOL_FACTOR = 3


def mmr_order(relevance: Sequence[float], redundancy: Any, k: int, lam: float = MMR_LAMBDA) -> list[int]:
    """The indexes of `k` picks (in pick order) by maximal marginal relevance; `redundancy` is an n x n matrix
    (`redundancies`). Ties go to the earlier item, so lam = 1 keeps the given order of a descending list."""
    import numpy as np

    n = len(relevance)
    if n == 0 or k <= 0:
        return []
    rel = np.asarray(relevance, dtype="float64")
    picked: list[int] = []
    nearest = np.zeros(n)  # each item's highest redundancy with the picks so far
    free = np.ones(n, dtype=bool)
    for _ in range(min(k, n)):
        gain = np.where(free, lam * rel - (1.0 - lam) * nearest, -np.inf)
        best = int(np.argmax(gain))  # argmax returns the first of equal values: the earlier item wins a tie
        picked.append(best)
        free[best] = False
        nearest = np.maximum(nearest, redundancy[best])
    return picked


def redundancies(vectors: Sequence[Any], sections: Sequence[Any]) -> Any:
    """The n x n redundancy matrix: the cosine of two chunks' vectors when their `sections` are equal, else 0.
    A None vector (a chunk the store no longer has) counts as a near-duplicate of its section's other chunks."""
    import numpy as np

    same = np.array([[a == b for b in sections] for a in sections], dtype="float64")
    missing = np.array([v is None for v in vectors])
    sims = np.where(missing[:, None] | missing[None, :], 1.0, _cosines(vectors, len(vectors)))
    return same * sims


def _cosines(vectors: Any, n: int) -> Any:
    """The n x n cosine matrix of the rows of `vectors` (zero for a None or zero row)."""
    import numpy as np

    rows = [v for v in vectors if v is not None]
    dim = len(rows[0]) if rows else 1
    mat = np.zeros((n, dim), dtype="float32")
    for i, v in enumerate(vectors):
        if v is not None:
            mat[i] = np.asarray(v, dtype="float32")
    mat /= np.linalg.norm(mat, axis=1, keepdims=True).clip(min=1e-12)
    return mat @ mat.T


def chunk_vectors(c: Container, pool: list[Candidate]) -> list[Any]:
    """The stored vector of each candidate (None where the store has none), one `get` per collection."""
    by_collection: dict[str, list[str]] = {}
    for cand in pool:
        by_collection.setdefault(str(cand.metadata.get("collection", "")), []).append(cand.id)
    found: dict[str, Any] = {}
    for name, ids in by_collection.items():
        if not name:
            continue
        col = open_collection(c, name, check_model=False)
        found.update((cid, vec) for cid, vec in records(col, ["embeddings"], ids=ids))
    return [found.get(cand.id) for cand in pool]


def section_of(cand: Candidate) -> tuple[str, str, str]:
    """A chunk's section: its collection, document and header path."""
    meta = cand.metadata
    return str(meta.get("collection", "")), str(meta.get("source_document", "")), str(meta.get("header_path", ""))


def cap_sections_first(cands: list[Candidate], cap: int) -> list[Candidate]:
    """At most `cap` chunks of one document (0: no cap), as retrieve.cap_per_document, but a document's slots go
    to its best chunk of each section before a second chunk of any section; the fused order is kept.

    Why: the cap runs before MMR, and a plain cap gives a long document's three slots to its three best chunks,
    which in a section of near-duplicates are that section's (MMR then has nothing else of the document).
    """
    if cap <= 0:
        return cands
    per_doc: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, str]] = set()
    kept: set[int] = set()
    for fresh_only in (True, False):
        for i, cand in enumerate(cands):
            section = section_of(cand)
            if i in kept or per_doc.get(section[:2], 0) >= cap or (fresh_only and section in seen):
                continue
            kept.add(i)
            seen.add(section)
            per_doc[section[:2]] = per_doc.get(section[:2], 0) + 1
    return [cand for i, cand in enumerate(cands) if i in kept]


def diversify(c: Container, pool: list[Candidate], scores: list[float], k: int,
              lam: float = MMR_LAMBDA) -> tuple[list[Candidate], list[float]]:
    """The `k` hits of `pool` (with their `scores`, calibrated probabilities) that MMR picks, in pick order."""
    sections = [section_of(x) for x in pool]
    if len(set(sections)) == len(sections):  # no two chunks of one section: nothing to spread, no vectors read
        return pool[:k], scores[:k]
    order = mmr_order(scores, redundancies(chunk_vectors(c, pool), sections), k, lam)
    return [pool[i] for i in order], [scores[i] for i in order]
