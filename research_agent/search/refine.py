"""Refinement advice: whether a query's results look right, and refined queries when they do not.

The status comes from the calibrated scores of the final hits (rules in docs/query.md); suggestions add a
word several top results share and the query lacks, so nothing is invented. Words for suggestions come
from research_agent.text's suggestion analyzer, the content-word test from its keyword analyzer.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.text import SUGGEST_STOP_WORDS, keyword_words, stemmer, suggestion_words

if TYPE_CHECKING:
    from research_agent.search.service import QueryHit

#: A weak list is "flat" when the 1st and the 5th hit's scores differ by less than this.
FLAT_SPREAD = 0.05
FLAT_MIN_HITS = 5


class QueryRefinement(BaseModel):
    status: str  # optimal | clarification_needed | too_broad
    suggestions: list[str]
    message: str


def _hit_words(hit: QueryHit, qstems: set[str], stem: Any, surface: dict[str, Counter[str]]) -> dict[str, int]:
    """Stem -> weight (2 from the title or header path, else 1) of the hit's candidate words, counting each
    word's spellings into `surface`; short words, stop words and the query's own stems are left out."""
    seen: dict[str, int] = {}
    for part, boost in ((f"{hit.metadata.get('document_title', '')} {hit.header_path}", 2), (hit.content, 1)):
        for w in suggestion_words(part):
            lw = w.lower().strip("-")
            if len(lw) < 4 or lw in SUGGEST_STOP_WORDS:
                continue
            st = stem.stemWord(lw)
            if st in qstems:
                continue
            seen[st] = max(seen.get(st, 0), boost)
            surface.setdefault(st, Counter())[lw] += 1
    return seen


def suggestions(query: str, hits: list[QueryHit], limit: int = 3) -> list[str]:
    """Refined queries: the query plus a word that several top results share and the query lacks.

    Words are counted once per hit (title and header path count double, as they name what a chunk is
    about); a word must occur in at least two hits, or in the only hit. Nothing is invented: every
    suggested word appears in the returned results.
    """
    stem = stemmer()
    qstems = set(stem.stemWords([w.lower() for w in suggestion_words(query)]))
    weight: Counter[str] = Counter()
    surface: dict[str, Counter[str]] = {}
    top = hits[:5]
    for h in top:
        for st, boost in _hit_words(h, qstems, stem, surface).items():
            weight[st] += boost
    need = 2 if len(top) > 1 else 1
    stems_of = [set(stem.stemWords([w.lower() for w in suggestion_words(
        f"{h.metadata.get('document_title', '')} {h.header_path} {h.content}")])) for h in top]
    hits_with = Counter({st: sum(1 for stems in stems_of if st in stems) for st in weight})
    ranked = sorted((st for st in weight if hits_with[st] >= need), key=lambda st: (-weight[st], st))
    return [f"{query} {surface[st].most_common(1)[0][0]}" for st in ranked[:limit]]


def refine(query: str, hits: list[QueryHit], settings: Any) -> QueryRefinement:
    """Advice from the score distribution of the final hits (rules in docs/query.md).

    1. clarification_needed: no hit, or the best score is below threshold_somewhat_relevant.
    2. too_broad: the query has at most one content word, or the hits are weak and flat (best score
       below threshold_relevant and the 1st and 5th scores within FLAT_SPREAD).
    3. optimal otherwise; its message says "only somewhat relevant" while the best score is below
       threshold_relevant. Suggestions (cases 1 and 2) are the query plus a word shared by top results.
    """
    scores = [h.relevance_score for h in hits]
    if not hits or scores[0] < settings.threshold_somewhat_relevant:
        return QueryRefinement(status="clarification_needed", suggestions=suggestions(query, hits),
                               message="Nothing relevant was found; rephrase with the terms the documents use, "
                               "search other collections, or check the spelling.")
    content_words = [w for w in keyword_words(query) if w not in SUGGEST_STOP_WORDS]
    if len(content_words) <= 1:
        return QueryRefinement(status="too_broad", suggestions=suggestions(query, hits),
                               message="A one-word query matches many passages; add what you want to know about it.")
    if (len(scores) >= FLAT_MIN_HITS and scores[0] < settings.threshold_relevant
            and scores[0] - scores[FLAT_MIN_HITS - 1] < FLAT_SPREAD):
        return QueryRefinement(status="too_broad", suggestions=suggestions(query, hits),
                               message="Many results match about equally and none strongly; add detail to narrow "
                               "the query.")
    if scores[0] < settings.threshold_relevant:
        # More likely wrong than right: an off-topic question sharing one word lands here (never "match well").
        return QueryRefinement(status="optimal", suggestions=[],
                               message="The best results are only somewhat relevant; if they do not answer the "
                               "question, add the terms the documents use or search other collections.")
    return QueryRefinement(status="optimal", suggestions=[], message="The top results match the query well.")
