"""Diversity: near-copies of a chunk of the same section go down the list; every other hit keeps its place.

Opt-in (`query --diverse`, MCP `diverse: true`): it runs after fusion, the per-document cap (which then gives a
document's slots to chunks that are not near-copies first: `cap_sections_first`) and reranking, on the pool
those left (the reranked pool, or DIVERSITY_POOL_FACTOR x top_k hits without a reranker), and picks top_k of
them greedily by maximal marginal relevance (MMR): each pick maximises

    MMR_LAMBDA * relevance - (1 - MMR_LAMBDA) * (highest redundancy with a hit already picked)

where relevance is the hit's calibrated relevance probability (0-1) and the redundancy of two chunks of the same
section (collection, document, header_path) is (cosine - NEAR_COPY_COSINE) / (1 - NEAR_COPY_COSINE) clipped to
0-1, else 0. So hits that are not near-copies (cosine < 0.9) of a picked hit come in descending relevance, as
without diversity; a near-copy goes below every hit scoring more than its relevance less its redundancy (an exact
copy below all). A hit keeps its own score and label.

Why a threshold: the first version (issue 17) used the raw cosine as redundancy. Calibrated scores are mostly
under 0.3 while two different chunks of one section have cosine 0.40-0.66 (p10-p90, our docs), so a relevant
different chunk (0.585 "Relevant", cosine 0.72 to the section's first pick) fell below hits at 0.02: 4 of 10
queries on our docs lost hits scoring 0.23-0.585 from the top 10. With the threshold, docs-QA (40 questions,
benchmarks/diversity.py) ranks exactly as without diversity (nDCG@10 0.793 with cap 3, 0.813 with cap 0): its
docs hold no same-section pair at cosine >= 0.9. Why within sections: plain MMR over every pair cost docs-QA
nDCG@10 -0.092 +- 0.044 (relevant passages resemble each other).

Cost (cap and MMR, vectors read included; docs-QA medians on a loaded 2-core machine): 7-21 ms per query at
top_k 10 with cap 3, 1.3 ms with cap 0; it grows with top_k (a 3 x k pool): 11-54 ms at top_k 100, 41 ms over
three collections in an outside run. No vectors are read when no two candidates share a section.

Vectors: the chunk vectors are read by id from Chroma (one `get` per collection searched) rather than carried by
the dense query, because keyword-only candidates have none there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from research_agent.catalog.collections import open_collection
from research_agent.search.retrieve import Candidate
from research_agent.storage.chunks import records

if TYPE_CHECKING:
    from research_agent.container import Container

#: Weight of relevance against redundancy. Why 0.5: relevance and redundancy both lie in 0-1, so at 0.5 an
#: exact copy (redundancy 1) of a picked chunk gains 0.5 * relevance - 0.5 <= 0 and ranks below every other
#: hit, while a chunk under NEAR_COPY_COSINE costs nothing. A candidate setting.
MMR_LAMBDA = 0.5
#: Two chunks of one section are near-copies from this cosine of their stored vectors up; only near-copies are
#: redundant (`redundancies`). Why 0.9: on research-agent's docs (all-MiniLM-L6-v2, 3,548 pairs of chunks of one
#: section) the cosine of two different chunks has median 0.53, p99 0.78 and max 0.887 (two tables with the same
#: header), while repeated paragraphs that differ in a sentence reach 0.99-0.997. Below it, a same-section chunk
#: counts as fresh: a threshold under the max pushed down relevant different chunks, which is what MMR on the raw
#: cosine did (a 0.585 "Relevant" chunk at cosine 0.72 fell below hits at 0.02). A candidate setting.
NEAR_COPY_COSINE = 0.9
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
    """The n x n redundancy matrix (0-1): for two chunks of one section, how far their cosine is above
    NEAR_COPY_COSINE, rescaled so that the threshold gives 0 and a copy 1 ((cos - 0.9) / 0.1); else 0. So a chunk
    that says something else (cosine under 0.9) is not redundant at all and keeps its place by relevance. A None
    vector (a chunk the store no longer has) counts as a copy of its section's other chunks."""
    import numpy as np

    n = len(vectors)
    if n == 0:  # no candidates (a keyword query no chunk matches): an empty array would be float, not bool
        return np.zeros((0, 0))
    same = np.array([[a == b for b in sections] for a in sections], dtype="float64")
    missing = np.array([v is None for v in vectors], dtype=bool)
    sims = np.where(missing[:, None] | missing[None, :], 1.0, _cosines(vectors, n))
    return same * ((sims - NEAR_COPY_COSINE) / (1.0 - NEAR_COPY_COSINE)).clip(0.0, 1.0)


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


def cap_sections_first(cands: list[Candidate], cap: int, vectors: Sequence[Any] | None = None) -> list[Candidate]:
    """At most `cap` chunks of one document (0: no cap), as retrieve.cap_per_document, but a document's slots go
    first to chunks that are not near-copies of a chunk already kept, then to near-copies; the fused order is
    kept. `vectors` (aligned with `cands`): a chunk is a near-copy when its cosine with a kept chunk of its
    section reaches NEAR_COPY_COSINE; None (or a None vector) counts every same-section chunk as a copy.

    Why: the cap runs before MMR, and a plain cap gives a long document's three slots to its three best chunks,
    which in a section of near-copies are copies (MMR then has nothing else of the document); a different chunk
    of the same section is not a copy and keeps its slot (it may be the second-best answer).
    """
    if cap <= 0:
        return cands
    copies = _copy_matrix(cands, vectors)
    per_doc: dict[tuple[str, str], int] = {}
    kept: list[int] = []
    for fresh_only in (True, False):
        for i, cand in enumerate(cands):
            doc = section_of(cand)[:2]
            if i in kept or per_doc.get(doc, 0) >= cap or (fresh_only and any(copies[i][j] for j in kept)):
                continue
            kept.append(i)
            per_doc[doc] = per_doc.get(doc, 0) + 1
    return [cands[i] for i in sorted(kept)]


def _copy_matrix(cands: list[Candidate], vectors: Sequence[Any] | None) -> Any:
    """n x n booleans: chunk i is a near-copy of chunk j (same section, redundancy > 0 as `redundancies` rates
    it; every same-section pair without vectors)."""
    sections = [section_of(x) for x in cands]
    if vectors is None:
        vectors = [None] * len(cands)
    return redundancies(vectors, sections) > 0


def cap_for_diversity(c: Container, cands: list[Candidate], cap: int) -> list[Candidate]:
    """cap_sections_first with the stored vectors of the chunks whose section occurs more than once among
    `cands` (no vectors are read for the others, nor at all without a cap)."""
    if cap <= 0:
        return cands
    sections = [section_of(x) for x in cands]
    counts: dict[tuple[str, str, str], int] = {}
    for sec in sections:
        counts[sec] = counts.get(sec, 0) + 1
    shared = [i for i, sec in enumerate(sections) if counts[sec] > 1]
    vectors: list[Any] = [None] * len(cands)
    for i, vec in zip(shared, chunk_vectors(c, [cands[i] for i in shared]) if shared else []):
        vectors[i] = vec
    return cap_sections_first(cands, cap, vectors)


def diversify(c: Container, pool: list[Candidate], scores: list[float], k: int,
              lam: float = MMR_LAMBDA) -> tuple[list[Candidate], list[float]]:
    """The `k` hits of `pool` (with their `scores`, calibrated probabilities) that MMR picks, in pick order."""
    sections = [section_of(x) for x in pool]
    if len(set(sections)) == len(sections):  # no two chunks of one section: nothing to spread, no vectors read
        return pool[:k], scores[:k]
    order = mmr_order(scores, redundancies(chunk_vectors(c, pool), sections), k, lam)
    return [pool[i] for i in order], [scores[i] for i in order]
